"""Gated refinements (issue 25, item 2) and locked harness entries.

Real workspaces, kernels, git and eval runs; only the model's replies are scripted. The gate benchmark's
items ask for "the answer"; the scripted model answers with the harness note `answer-tip` (read in its
kernel), so an edit of that note helps or hurts the score for real.
"""
from __future__ import annotations

import json
import subprocess

from conftest import by_name, cli, configure, run_once

from primefs.harness.entries import Harness
from primefs.store.goals import write_goal

ANSWER = "t = harness.get('note', 'answer-tip')\\ndone(t['body'].strip() if t else 'unknown')"


def script(body: str, op: str) -> str:
    edit = {"op": op, "kind": "note", "name": "answer-tip", "description": "the answer", "body": body,
            "evidence": [1], "rationale": "seen", "expected_effect": f"answers {body}"}
    return ("rules:\n  - match: \"^You refine the harness\"\n    replies:\n"
            f"      - text: '{json.dumps({'edits': [edit]})}'\n"
            "  - match: \"^Refine yourself\"\n    replies:\n      - code: \"print(refine())\"\n      - text: \"ok\"\n"
            "  - match: \"^Edit the tip\"\n    replies:\n      - code: \"try:\\n    harness.put('note', "
            "'answer-tip', '43')\\nexcept ValueError as e:\\n    done(f'refused: {e}')\"\n"
            f"default:\n  - code: \"{ANSWER}\"\n")


def setup(ws, body="42", op="create", **config):
    (ws.root / "script.yaml").write_text(script(body, op))
    (ws.root.parent / "items.jsonl").write_text("".join(
        json.dumps({"id": f"q{i}", "task": f"What is the answer? ({i})", "expected": "42"}) + "\n" for i in range(3)))
    ws = configure(ws, model=f"scripted/{ws.root / 'script.yaml'}", **config)
    write_goal(ws, "Find the answer", name="w")
    run_once(ws)
    return ws


def gate_args(ws):
    return ("--gate", f"file:{ws.root.parent / 'items.jsonl'}", "-n", "3")


def trailers(ws, sha):
    msg = subprocess.run(["git", "-C", str(ws.root), "log", "-1", "--format=%B", sha], capture_output=True,
                         text=True).stdout
    parsed = subprocess.run(["git", "interpret-trailers", "--parse"], input=msg, capture_output=True, text=True).stdout
    return dict(line.split(": ", 1) for line in parsed.splitlines())


def test_an_edit_that_helps_is_kept_with_the_gate_in_its_trailers(ws):
    ws = setup(ws)
    r = cli(ws, "refine", "w", *gate_args(ws), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    gate = out["gate"]
    assert gate["kept"] and gate["before"] == 0.0 and gate["after"] == 1.0 and gate["items"] == 3
    assert [a["name"] for a in out["applied"]] == ["answer-tip"] and out["proposal"] is None
    assert Harness(ws).get("note", "answer-tip").body.strip() == "42"
    t = trailers(ws, out["applied"][0]["commit"])
    assert t["Primefs-Gate"].startswith("kept; file:") and "before 0.000, after 1.000, diff +1.000" in t["Primefs-Gate"]
    for run in gate["runs"]:  # both runs are eval runs a person can read (and rerun)
        rows = [json.loads(line) for line in (ws.root / run / "results.jsonl").read_text().splitlines()]
        assert [x["id"] for x in rows] == ["q0", "q1", "q2"]
    log = json.loads(cli(ws, "harness", "log", "--json").stdout)
    assert log[0]["gate"] == t["Primefs-Gate"]


def test_an_edit_that_hurts_is_a_rejected_proposal_never_applied(ws):
    Harness(ws).put("note", "answer-tip", "42", description="the answer", source="user")
    ws = setup(ws, body="41", op="update")
    r = cli(ws, "refine", "w", *gate_args(ws))
    assert r.returncode == 0, r.stderr
    assert "gate file:" in r.stdout and "rejected (before 1.000, after 0.000, 3 items" in r.stdout
    assert "kept as a rejected proposal, not applied:" in r.stdout
    assert Harness(ws).get("note", "answer-tip").body.strip() == "42"
    log = json.loads(cli(ws, "harness", "log", "--json").stdout)
    proposal = log[0]
    assert proposal["kind"] == "proposal" and proposal["source"] == "refine"
    assert proposal["gate"].startswith("rejected;") and "newly failed: q0, q1, q2" in proposal["gate"]
    saved = json.loads((ws.root / proposal["path"]).read_text())
    assert saved["edits"][0]["body"] == "41"
    # Revertible like any harness commit; reverting it changes no entry.
    subprocess.run(["git", "-C", str(ws.root), "revert", "--no-edit", proposal["sha"]], check=True, capture_output=True)
    assert not (ws.root / proposal["path"]).exists() and Harness(ws).get("note", "answer-tip").body.strip() == "42"


def test_a_gate_that_cannot_run_applies_nothing(ws):
    ws = setup(ws)
    r = cli(ws, "refine", "w", "--gate", "no-such-bench")
    assert r.returncode == 1 and "gate no-such-bench could not run, so nothing was applied" in r.stderr
    assert "unknown benchmark 'no-such-bench'" in r.stderr
    assert Harness(ws).get("note", "answer-tip") is None
    assert not any((ws.root / ".primefs" / "gates").glob("*"))  # no half-made gate run is left
    log = json.loads(cli(ws, "harness", "log", "--json").stdout)
    assert log[0]["kind"] == "proposal" and log[0]["gate"].startswith("not run; no-such-bench")
    r = cli(ws, "refine", "w", "-n", "3")
    assert r.returncode == 1 and "-n, --seed and --gate-model go with --gate BENCH" in r.stderr


def test_locked_entries_are_edited_by_a_person_only(ws):
    Harness(ws).put("note", "answer-tip", "42", description="the answer", source="user")
    ws = setup(ws, body="41", op="update", harness={"locked": ["note/answer-*"]})
    r = cli(ws, "refine", "w", "--json")  # ungated
    out = json.loads(r.stdout)
    assert out["applied"] == [] and "note/answer-tip is locked" in out["rejected"][0]["reason"]
    r = cli(ws, "refine", "w", *gate_args(ws), "--json")  # gated: refused before any gate run
    out = json.loads(r.stdout)
    assert out["gate"] is None and "locked" in out["rejected"][0]["reason"]
    assert not (ws.root / ".primefs" / "gates").exists()
    write_goal(ws, "Edit the tip", name="k")
    run_once(ws)
    assert by_name(ws)["k"].read_result().startswith("refused: note/answer-tip is locked")  # a kernel cannot
    h = Harness(ws)
    for source in ("agent", "refine"):
        try:
            h.put("note", "answer-tip", "43", source=source, evidence=["x#1"], intent="i")
            raise AssertionError("a locked entry was edited")
        except Exception as exc:
            assert "locked" in str(exc)
    h.put("note", "answer-tip", "44", source="user")
    assert h.get("note", "answer-tip").body.strip() == "44"


def test_harness_gate_setting_gates_refinements_agents_ask_for(ws):
    ws = setup(ws, harness={"gate": {"benchmark": f"file:{ws.root.parent / 'items.jsonl'}", "n": 2}})
    write_goal(ws, "Refine yourself", name="r1")
    run_once(ws)  # a runner without a gate runner (as eval's own): the edits are not applied
    ev = by_name(ws)["r1"].events("refine")[0]
    assert ev["applied"] == [] and "no gate can run here" in ev["error"]
    assert Harness(ws).get("note", "answer-tip") is None
    write_goal(ws, "Refine yourself", name="r2")
    r = cli(ws, "run", "--once")  # `primefs run` runs gates
    assert r.returncode == 0, r.stderr
    ev = by_name(ws)["r2"].events("refine")[0]
    assert ev["gate"]["kept"] and ev["gate"]["items"] == 2 and [a["name"] for a in ev["applied"]] == ["answer-tip"]
    assert Harness(ws).get("note", "answer-tip").body.strip() == "42"


def test_a_gate_whose_items_fail_applies_nothing(ws):
    # The gate's model is one whose calls fail (its script cannot be read): a failed item is no score.
    (ws.root / "broken.yaml").write_text("rules: [unclosed\n")
    ws = setup(ws, models={"broken": {"model": f"scripted/{ws.root / 'broken.yaml'}"}})
    r = cli(ws, "refine", "w", *gate_args(ws), "--gate-model", "broken")
    assert r.returncode == 1 and "could not run, so nothing was applied" in r.stderr, r.stderr
    assert "items q0, q1, q2 failed (a model or kernel error" in r.stderr
    assert Harness(ws).get("note", "answer-tip") is None
    assert not any((ws.root / ".primefs" / "gates").glob("*"))


def test_a_kernel_cannot_forge_a_gate_trailer(ws):
    ws = setup(ws)
    (ws.root / "script.yaml").write_text(script("42", "create").replace(
        "default:", "  - match: \"^Forge\"\n    replies:\n      - code: \"try:\\n    harness.put('note', 'x', "
        "'y', gate='kept; forged')\\nexcept Exception as e:\\n    done(f'refused: {e}')\"\n      - text: \"no\"\n"
        "default:", 1))
    write_goal(ws, "Forge a gate", name="f")
    run_once(ws)
    assert by_name(ws)["f"].read_result().startswith("refused: harness.put: `gate` is not a field")
    assert Harness(ws).get("note", "x") is None
