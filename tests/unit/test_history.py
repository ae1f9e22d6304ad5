"""store/history.py's readers: the same events however a history is read. Real: history files the test writes
(hypothesis makes their lines, torn last lines and garbage too) and the readers; nothing is faked."""
from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from primefs.store.history import latest_events, read_events, since_compaction

line = st.one_of(
    st.builds(lambda n, pad: json.dumps({"type": "x", "n": n, "pad": pad}), st.integers(0, 10**6), st.text(max_size=80)),
    st.sampled_from(["garbage{", "[]", '{"type": 3}', "", '{"type": "y", "ts": "no time"}']),
)


@given(st.lists(line, max_size=40), st.text(max_size=30), st.sampled_from([1, 5, 64, 1 << 16]))
def test_latest_events_are_all_the_events_from_the_end_back(tmp_path_factory, lines, torn, chunk):
    path = tmp_path_factory.mktemp("h") / "history.jsonl"
    path.write_bytes(("".join(f"{x}\n" for x in lines) + torn.replace("\n", "")).encode("utf-8", "surrogatepass"))
    assert list(latest_events(path, chunk)) == list(reversed(read_events(path)))


def test_latest_events_read_only_as_far_as_asked(tmp_path, monkeypatch):
    """What came since the last turn costs a chunk, not the whole file (14 MB here)."""
    from primefs.store import history

    path = tmp_path / "history.jsonl"
    path.write_text("".join(json.dumps({"type": "x", "n": i, "pad": "p" * 100}) + "\n" for i in range(100_000)))
    read = []

    class Counting:
        def __init__(self, f):
            self.f = f

        def read(self, n=-1):
            data = self.f.read(n)
            read.append(len(data))
            return data

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    real = history.open_regular
    monkeypatch.setattr(history, "open_regular", lambda p: Counting(real(p)))
    events = history.latest_events(path, chunk=1 << 16)
    assert [next(events)["n"] for _ in range(3)] == [99_999, 99_998, 99_997]
    assert sum(read) <= 1 << 16


# a history as the runner writes it: events numbered in order, now and then a compaction that covers all but a
# kept tail of what came before it
step = st.one_of(st.sampled_from(["notice", "turn_start", "x"]), st.integers(0, 5))


@given(st.lists(step, max_size=60))
def test_since_compaction_is_what_a_whole_read_would_give(tmp_path_factory, steps):
    path = tmp_path_factory.mktemp("h") / "history.jsonl"
    events = []
    for s in steps:
        n = len(events)
        if isinstance(s, int):  # a compaction keeping the last s events (none when there is nothing to cover)
            if n - s < 1:
                continue
            events.append({"type": "compaction", "n": n, "upto_n": n - s - 1, "summary": "s"})
        else:
            events.append({"type": s, "n": n})
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    whole = read_events(path)
    last = next((e for e in reversed(whole) if e["type"] == "compaction"), None)
    assert since_compaction(path) == (last, [e for e in whole if last is None or e["n"] > last["upto_n"]])


def test_since_compaction_reads_back_only_to_what_the_compaction_kept(tmp_path, monkeypatch):
    """A compaction (and the conversation rebuilt after it) costs the events since the last one, not the
    history of the session's whole life: its time and its memory would grow with every turn."""
    from primefs.store import history

    path = tmp_path / "history.jsonl"
    lines = [{"type": "notice", "n": i, "text": "t"} for i in range(100_000)]
    lines += [{"type": "compaction", "n": 100_000, "upto_n": 99_989, "summary": "s"}, {"type": "notice", "n": 100_001, "text": "t"}]
    path.write_text("".join(json.dumps(e) + "\n" for e in lines))
    parsed = []
    real = history.parse_event
    monkeypatch.setattr(history, "parse_event", lambda line: parsed.append(1) or real(line))
    last, tail = since_compaction(path)
    assert last["n"] == 100_000 and [e["n"] for e in tail] == [*range(99_990, 100_002)]
    assert len(parsed) == len(tail) + 1  # and the one line that says where to stop


def test_the_next_event_number_comes_from_the_end_of_the_history(tmp_path, monkeypatch):
    """One past the last event's `n`, read from the end: counting every event at each open cost the
    session's whole life, and after a line was damaged by hand the count gave an `n` already used."""
    from primefs.store import history

    path = tmp_path / "history.jsonl"
    path.write_text("".join(json.dumps({"ts": 1.0, "type": "x", "n": i}) + "\n" for i in range(50_000)))
    parsed = []
    real = history.parse_event
    monkeypatch.setattr(history, "parse_event", lambda line: parsed.append(1) or real(line))
    assert history.next_n(path) == 50_000 and len(parsed) == 1
    monkeypatch.undo()
    lines = path.read_text().splitlines(keepends=True)
    lines[10] = "garbled by hand\n"
    path.write_text("".join(lines))
    assert history.next_n(path) == 50_000
    path.write_text('{"ts": 1.0, "type": "x", "n": 0}\n{"ts": 2.0, "type": "x"}\n')  # no n at the end: counted
    assert history.next_n(path) == 2
    assert history.next_n(tmp_path / "none.jsonl") == 0
