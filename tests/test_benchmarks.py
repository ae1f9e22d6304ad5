"""The benchmark plugins under plugins/: primefs-needle, primefs-aggregate, primefs-pairs.

Oracles score 1.0 at several sizes and seeds, the scorers on hand-made answers, determinism, the
item contract, and discovery through the `primefs` entry points.
"""
from __future__ import annotations

import importlib.util
import json
import re
import sys
from collections import Counter
from pathlib import Path

import pytest

PLUGINS = Path(__file__).resolve().parents[1] / "plugins"
for _folder, _module in (("primefs-needle", "primefs_needle"), ("primefs-aggregate", "primefs_aggregate"),
                         ("primefs-pairs", "primefs_pairs")):
    if importlib.util.find_spec(_module) is None:  # not installed: import from the source tree
        sys.path.insert(0, str(PLUGINS / _folder))

import primefs_aggregate as agg  # noqa: E402
import primefs_needle as needle  # noqa: E402
import primefs_pairs as pairs  # noqa: E402

from primefs.plugins import benchmarks, plugin_manager  # noqa: E402

NAMES = {"needle", "aggregate", "aggregate-inferred", "pairs", "pairs-inferred"}


def registered() -> dict:
    found: list = []
    for module in (needle, agg, pairs):
        module.register_benchmarks(found.append)
    return {b.name: b for b in found}


# -- discovery ------------------------------------------------------------------------------------
def test_discovered_through_entry_points(monkeypatch):
    monkeypatch.setenv("PRIMEFS_LOAD_PLUGINS", "1")
    found = benchmarks(plugin_manager())
    missing = NAMES - set(found)
    assert not missing, (f"benchmarks {sorted(missing)} not found through entry points: install the "
                         f"plugins with pip install -e plugins/primefs-needle -e plugins/primefs-aggregate "
                         f"-e plugins/primefs-pairs")
    for name in NAMES:
        b = found[name]
        assert b.name == name and isinstance(b.description, str) and b.description
        assert callable(b.items) and callable(b.score) and callable(b.oracle)


def test_not_loaded_when_plugins_are_off(monkeypatch):
    monkeypatch.setenv("PRIMEFS_LOAD_PLUGINS", "0")
    assert not NAMES & set(benchmarks(plugin_manager()))


def test_registered_defaults():
    found = registered()
    assert set(found) == NAMES
    assert found["needle"].tokens == 2**13 and found["needle"].keys == 1
    assert found["aggregate"].mode == "explicit" and found["aggregate-inferred"].mode == "inferred"
    assert found["pairs"].mode == "explicit" and found["pairs-inferred"].mode == "inferred"


# -- the item contract, determinism ---------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(NAMES))
def test_item_contract_and_determinism(name):
    bench = registered()[name]
    first = list(bench.items(3, 5))
    again = list(bench.items(3, 5))
    other = list(bench.items(3, 6))
    assert first == again
    assert [it["id"] for it in first] == [f"{name}-5-{i}" for i in range(3)]
    assert [it["id"] for it in other] == [f"{name}-6-{i}" for i in range(3)]
    for a, b in zip(first, other):
        assert a["context"] != b["context"]
    assert len({it["context"] for it in first}) == 3  # items of one seed differ too
    for it in first:
        assert set(it) == {"id", "task", "context", "expected"}
        assert isinstance(it["task"], str) and isinstance(it["context"], str)
        assert json.loads(json.dumps(it["expected"])) == it["expected"]
        assert it["context"] not in it["task"] and len(it["task"]) < 1500


# -- oracles ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("tokens", [2**13, 2**15, 2**17])
@pytest.mark.parametrize("keys", [1, 3])
@pytest.mark.parametrize("seed", [0, 1, 7])
def test_needle_oracle(tokens, keys, seed):
    bench = needle.NeedleBenchmark(tokens=tokens, keys=keys)
    for it in bench.items(3, seed):
        assert bench.score(bench.oracle(it), it["expected"]) == 1.0
        assert len(it["expected"]) == keys
        assert abs(len(it["context"]) - 4 * tokens) < 0.01 * 4 * tokens + 200


def test_needle_oracle_at_2_pow_20_tokens():
    bench = needle.NeedleBenchmark(tokens=2**20, keys=2)
    it = bench.make_item(3, 0)
    assert abs(len(it["context"]) - 4 * 2**20) < 0.01 * 4 * 2**20
    assert bench.score(bench.oracle(it), it["expected"]) == 1.0
    # The size can also be chosen per call.
    small = next(bench.items(1, 3, tokens=2**13))
    assert len(small["context"]) < 40_000 and bench.score(bench.oracle(small), small["expected"]) == 1.0


@pytest.mark.parametrize("mode", ["explicit", "inferred"])
@pytest.mark.parametrize("lines", [200, 2000])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_aggregate_oracle(mode, lines, seed):
    bench = agg.AggregateBenchmark(mode, lines=lines, users=20 if lines == 200 else 40)
    for it in bench.items(8 if lines == 2000 else 12, seed):
        assert it["context"].count("\n") == lines
        assert (" || Label: " in it["context"]) == (mode == "explicit")
        assert bench.score(bench.oracle(it), it["expected"]) == 1.0


@pytest.mark.parametrize("mode", ["explicit", "inferred"])
@pytest.mark.parametrize("users", [30, 50, 80])
@pytest.mark.parametrize("seed", [0, 3])
def test_pairs_oracle(mode, users, seed):
    bench = pairs.PairsBenchmark(mode, users=users)
    for it in bench.items(8, seed):
        assert (" || Label: " in it["context"]) == (mode == "explicit")
        assert 3 <= len(it["expected"]) <= 300
        assert bench.score(bench.oracle(it), it["expected"]) == 1.0


def test_every_question_kind_is_asked():
    kinds = Counter()
    for it in agg.AggregateBenchmark(lines=100, users=10).items(60, 0):
        kinds.update(k for k, p in agg.QUESTIONS.items() if p.search(it["task"]))
    assert set(kinds) == set(agg.QUESTIONS)
    kinds = Counter()
    for it in pairs.PairsBenchmark(users=30, max_lines_per_label=2).items(30, 0):
        kinds.update(k for k, p in pairs.QUESTIONS.items() if p.search(it["task"]))
    assert set(kinds) == set(pairs.QUESTIONS)


# -- generators: the ground truth is exact ----------------------------------------------------------
def test_needle_haystack_has_each_needle_once_and_every_near_miss():
    bench = needle.NeedleBenchmark(tokens=2**14, keys=2, extra_keys=2, distractors=8)
    it = bench.make_item(0, 0)
    text, expected = it["context"], it["expected"]
    found = needle.NEEDLE_RE.findall(text)
    assert len(found) == 2 + 2 + 4  # asked, extra keys, typo and longer-key near misses
    for key, number in expected.items():
        assert [n for k, n in found if k == key] == [number]
        assert number not in it["task"]
    assert text.count("almost magic number for") == 2 and text.count("ordinary number for") == 2
    keys = {k for k, _ in found}
    assert len(keys) == 8
    longer = {k for k in keys if k.rsplit("-", 1)[0] in expected}
    typos = keys - longer - set(expected)
    assert len(longer) == 2 and len(typos) == 4  # two misspelled keys, two unasked keys
    assert sum(any(abs(len(t) - len(k)) <= 1 and t[:1] == k[:1] for k in expected) for t in typos) >= 2
    assert len(re.findall(r"(?<!\d)\d{7}(?!\d)", text)) > len(found) + 4  # other 7-digit numbers in filler


def test_aggregate_word_lists_are_disjoint_and_classify_every_line():
    words = [w.lower() for _, (_, *slots) in agg.VOCAB.items() for ws in slots for w in ws]
    assert len(words) == len(set(words))
    for label, (templates, *_) in agg.VOCAB.items():
        for t in templates:
            assert not set(agg._WORD_RE.findall(t.lower())) & set(agg.WORD_LABEL)
    it = agg.AggregateBenchmark("explicit", lines=1000).make_item(9, 0)
    rows = agg.LINE_RE.findall(it["context"])
    assert len(rows) == 1000
    for _, _, text, label in rows:
        assert agg.classify(text) == label
    counts = Counter(label for *_, label in rows)
    assert len(set(counts.values())) == len(agg.LABELS)  # distinct totals: one most/least common


def test_pairs_generator_matches_aggregate_generator():
    assert pairs.VOCAB == agg.VOCAB and pairs.LINE_RE.pattern == agg.LINE_RE.pattern
    it = pairs.PairsBenchmark("explicit").make_item(4, 1)
    for _, _, text, label in pairs.LINE_RE.findall(it["context"]):
        assert pairs.classify(text) == label


# -- scorers on hand-made answers -------------------------------------------------------------------
NEEDLE_EXPECTED = {"amber-falcon": "1234567", "quiet-river": "7654321"}


@pytest.mark.parametrize("answer, score", [
    ("amber-falcon: 1234567\nquiet-river: 7654321", 1.0),
    ("quiet-river: 7654321\namber-falcon: 1234567", 1.0),
    ('{"amber-falcon": 1234567, "quiet-river": "7654321"}', 1.0),
    ("The special magic number for Amber-Falcon is 1,234,567.\nquiet-river -> 7654321", 1.0),
    ("| amber-falcon | 1234567 |\n| quiet-river | 7654321 |", 1.0),
    ("amber-falcon: 1234567\nquiet-river: 7654322", 0.5),
    ("amber-falcon: 1234567", 0.5),
    ("amber-falcon: 7654321\nquiet-river: 1234567", 0.0),
    ("1234567\n7654321", 0.0),  # bare numbers: only for a single asked key
    ("amber-falcn: 1234567\nquiet-river-north: 7654321", 0.0),  # a typo key, a longer key
    ("amber-falcon: 9999999 (no, that was the almost magic one)\namber-falcon: 1234567\nquiet-river: 7654321", 1.0),
    ("", 0.0),
])
def test_needle_score(answer, score):
    assert needle.NeedleBenchmark().score(answer, NEEDLE_EXPECTED) == score


def test_needle_score_single_key():
    bench, expected = needle.NeedleBenchmark(), {"amber-falcon": "1234567"}
    assert bench.score("1234567", expected) == 1.0
    assert bench.score("The number is 1234567.", expected) == 1.0
    assert bench.score("1234567 or 7654321", expected) == 0.0
    assert bench.score("amber-falcon: 7654321", expected) == 0.0


@pytest.mark.parametrize("answer, expected, score", [
    ("food", "food", 1.0),
    ("FOOD", "food", 1.0),
    ("**Food**.", "food", 1.0),
    ("sports", "food", 0.0),
    ("Counting gives sports 300 and food 412.\nAnswer: food", "food", 1.0),
    ("food is more common than sports", "food", 1.0),
    ("", "food", 0.0),
    ("412", 412, 1.0),
    (412, 412, 1.0),
    ("There are 1,234 such lines.", 1234, 1.0),
    ("413", 412, 0.75),
    ("410", 412, 0.5625),
    ("Lines after 2024-03-01 for user u4821: 7", 7, 1.0),
    ("I counted carefully.\nAnswer: 12", 12, 1.0),
    ("none", 3, 0.0),
])
def test_aggregate_score(answer, expected, score):
    assert agg.AggregateBenchmark().score(answer, expected) == pytest.approx(score)


PAIRS_EXPECTED = [["u1001", "u1002"], ["u1001", "u1003"], ["u1002", "u1003"], ["u1003", "u1004"]]


@pytest.mark.parametrize("answer, score", [
    ("(u1001, u1002)\n(u1001, u1003)\n(u1002, u1003)\n(u1003, u1004)", 1.0),
    ("u1002-u1001\nu1003 - u1001\nu1003 and u1002\nu1004, u1003", 1.0),
    ('[["u1001", "u1002"], ["u1003", "u1001"], ["u1002", "u1003"], ["u1004", "u1003"]]', 1.0),
    ("(u1001, u1002), (u1001, u1003), (u1002, u1003), (u1003, u1004), (u1004, u1003), (u1001, u1001)", 1.0),
    ("(u1001, u1002)\n(u1001, u1003)", 2 / 3),  # precision 1, recall 1/2
    ("(u1001, u1002)\n(u1001, u1003)\n(u1002, u1003)\n(u1003, u1004)\n"
     "(u1001, u1004)\n(u1002, u1004)\n(u1005, u1001)\n(u1005, u1002)", 2 / 3),  # precision 1/2, recall 1
    ("(u1001, u1004)\n(u1002, u1004)", 0.0),
    ("", 0.0),
])
def test_pairs_score(answer, score):
    assert pairs.PairsBenchmark().score(answer, PAIRS_EXPECTED) == pytest.approx(score)


# -- sizes chosen per run (`primefs eval --param`) ---------------------------------------------------
def test_needle_at_ten_million_characters():
    bench = needle.NeedleBenchmark()
    it = next(bench.items(1, 0, chars=10_000_000, keys=3))  # how fast: bench/ (docs/performance.md)
    assert abs(len(it["context"]) - 10_000_000) < 0.01 * 10_000_000 and len(it["expected"]) == 3
    assert bench.score(bench.oracle(it), it["expected"]) == 1.0
    assert next(bench.items(1, 0)) == bench.make_item(0, 0)  # no parameter: the registered size


@pytest.mark.parametrize("mode", ["explicit", "inferred"])
def test_aggregate_and_pairs_at_5000_records(mode):
    for bench in (agg.AggregateBenchmark(mode), pairs.PairsBenchmark(mode)):
        items = list(bench.items(2, 4, lines=5000))
        assert items == list(bench.items(2, 4, lines=5000))
        for it in items:
            assert it["context"].count("\n") == 5000
            assert bench.score(bench.oracle(it), it["expected"]) == 1.0
    assert list(pairs.PairsBenchmark().items(1, 4, users=100))[0]["context"].count("\n") < 5000


def test_pairs_without_lines_is_unchanged_and_refuses_too_few_lines():
    bench = pairs.PairsBenchmark()
    assert next(bench.items(1, 2)) == bench.make_item(2, 0)
    with pytest.raises(ValueError, match="at least users"):
        list(bench.items(1, 0, lines=100))
