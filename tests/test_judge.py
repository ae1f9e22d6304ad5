"""The `judge` end condition (docs/workspace.md, "End conditions"): a model reads the evidence against a
rubric; its verdict and reason are events, its call counts in the tree's usage, done() is refused with
its reason. The judged session and the judge run on the scripted model."""
from __future__ import annotations

from conftest import configure, run_once

from primefs.index.accounting import UsageIndex
from primefs.store.goals import write_goal
from primefs.store.session import list_sessions

SCRIPT = ('rules:\n'
          '  - match: "Write the report"\n'
          '    replies:\n'
          '      - code: "open(\'report.md\', \'w\').write(\'a.txt\')\\ndone(\'report written\')"\n'
          '      - code: "open(\'report.md\', \'w\').write(\'a.txt 12 KB\')\\ndone(\'report with sizes\')"\n'
          '      - text: "finished"\n')
JUDGE = ('rules:\n'  # the judge's own model: it passes a report that names a size
         '  - match: "a.txt 12 KB"\n'
         '    replies:\n'
         '      - text: "VERDICT: pass\\nIt names a size."\n'
         'default:\n'
         '  - text: "VERDICT: fail\\nThe report does not name a size."\n')


def test_a_judge_refuses_done_with_its_reason_and_counts_in_usage(ws, scripted):
    ws = scripted(SCRIPT)
    (ws.root / "judge.yaml").write_text(JUDGE)
    ws = configure(ws, models={"grader": {"model": "scripted/judge.yaml"}})
    judged = {"judge": {"model": "grader", "rubric": "The report names each file with its size",
                        "show": {"files": ["report.md"]}}}
    write_goal(ws, "Write the report", name="report", extra={"end_conditions": [judged]})
    run_once(ws)
    [s] = list_sessions(ws.sessions)
    meta = s.reload()
    assert meta["status"] == "done" and s.read_result() == "report with sizes"
    verdicts = [(e["passed"], e["reason"]) for e in s.events("judge")]
    assert verdicts[0] == (False, "The report does not name a size.") and verdicts[-1][0] is True
    [refused] = s.events("done_refused")
    assert "judge grader: not met: The report does not name a size." in refused["report"]
    judge_calls = [e for e in s.events("model_call") if e.get("purpose") == "judge"]
    assert len(judge_calls) == len(verdicts) >= 2
    assert UsageIndex(ws.sessions).tree(s.id)["calls"] == len(s.events("model_call"))


def test_a_judge_of_an_unknown_model_rejects_the_goal(ws, scripted):
    ws = scripted(SCRIPT)
    write_goal(ws, "Write the report", name="bad", extra={"end_conditions": [
        {"judge": {"model": "no-such-alias", "rubric": "x"}}]})
    logs = run_once(ws)
    assert not list_sessions(ws.sessions)
    assert any("goals/bad.md: judge: unknown model 'no-such-alias'" in line for line in logs), logs
    write_goal(ws, "Write the report", name="shapeless", extra={"end_conditions": [{"judge": "be nice"}]})
    assert any("judge: needs {model" in line for line in run_once(ws))
