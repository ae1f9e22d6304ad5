"""runner/loops.py: the signs of a turn going round in circles, a notice first, then the stop."""
from primefs.runner.loops import AFTER_NOTICE, LoopWatch


def feed(watch, cells):
    return [watch.cell(*c) for c in cells]


def test_the_same_cell_n_times_is_a_notice_then_a_stop():
    w = LoopWatch(repeat=4, window=0)
    out = feed(w, [("print(1)", f"{i}\n", None) for i in range(4 + AFTER_NOTICE)])
    assert out[:3] == [None, None, None]
    assert not out[3].stop and "the same cell ran 4 times in a row ('print(1)')" in out[3].text
    assert out[4] is None and out[5].stop and "stopped as a loop: the same cell ran 6 times" in out[5].text


def test_whitespace_does_not_make_a_cell_new_and_a_new_one_starts_again():
    w = LoopWatch(repeat=3, window=0)
    assert feed(w, [("x  = 1", "a", None), ("x = 1\n", "b", None)]) == [None, None]
    assert feed(w, [("y = 2", "c", None), ("x = 1", "d", None), ("x = 1", "e", None)]) == [None, None, None]
    assert not w.cell("x = 1", "f", None).stop


def test_the_same_error_from_different_code():
    w = LoopWatch(repeat=3, window=0)
    err = "Traceback...\nKeyError: 'name'"
    out = feed(w, [(f"d[{i!r}]", "", err) for i in range(3)])
    assert not out[2].stop and "the same error came 3 times in a row (\"KeyError: 'name'\")" in out[2].text


def test_cells_without_new_output():
    w = LoopWatch(repeat=0, window=3)
    assert feed(w, [("a", "same", None), ("b", "", None), ("c", "same", None)]) == [None, None, None]
    assert w.cell("d", "", None).text.startswith("[primefs: 3 cells in a row gave no new output")
    assert w.cell("e", "same", None) is None and w.cell("f", "", None).stop


def test_new_output_resets_the_count_and_the_notice():
    w = LoopWatch(repeat=0, window=2)
    assert feed(w, [("a", "", None), ("b", "", None)])[1].stop is False
    assert w.cell("c", "fresh", None) is None  # progress: the sign is gone
    assert w.cell("d", "", None) is None and not w.cell("e", "", None).stop  # a notice again, not a stop


def test_zero_turns_a_sign_off():
    w = LoopWatch(repeat=0, window=0)
    assert feed(w, [("x", "", "E") for _ in range(50)]) == [None] * 50
