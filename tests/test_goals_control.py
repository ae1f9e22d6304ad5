"""Autonomous goals, budgets over the session tree, end conditions, goal_status()."""
from __future__ import annotations

import json

from conftest import cli, run_once, use_server

from primefs.store.goals import write_goal
from primefs.store.session import list_sessions


def only(ws, name):
    return next(s for s in list_sessions(ws.sessions) if s.name == name)


def test_autonomous_goal_runs_until_command_end_condition_passes(ws, server):
    # the end condition fails until the agent has written ok.txt on its second turn
    server.set_script({"rules": [{"match": "^Make", "replies": [
        {"text": "I think I am done"},
        {"code": "open('ok.txt', 'w').write('yes')"}, {"text": "wrote it"}]}]})
    ws = use_server(ws, server)
    write_goal(ws, "Make the check pass", name="auto", extra={
        "autonomous": True, "budget": {"turns": 5},
        "end_conditions": [{"command": "test -f ok.txt && echo found || (echo 'ok.txt missing'; exit 3)"}]})
    run_once(ws)
    s = only(ws, "auto")
    assert s.status == "done" and s.meta["stop_reason"] == "done"
    assert len(s.events("turn_start")) == 2
    notice = s.events("notice")[0]["text"]
    assert "attempt 2 of 5" in notice and "ok.txt missing" in notice and "exit 3" in notice
    checks = s.events("end_conditions")
    assert [c["results"][0]["passed"] for c in checks] == [False, True]


def test_turns_budget_with_failing_condition_stops_without_success(ws, server):
    server.set_script({"rules": [{"match": "^Never", "replies": [{"text": "try"}] * 10}]})
    ws = use_server(ws, server)
    write_goal(ws, "Never passes", name="never", extra={
        "autonomous": True, "budget": {"turns": 3}, "end_conditions": [{"file_exists": "nope.txt"}]})
    run_once(ws)
    s = only(ws, "never")
    assert s.status == "stopped" and s.meta["stop_reason"] == "budget:turns"  # the budget says why
    assert "end conditions still failing: file_exists" in s.meta["error"]
    assert len(s.events("turn_start")) == 3


def test_autonomous_without_conditions_continues_until_done(ws, server):
    server.set_script({"rules": [{"match": "^Keep", "replies": [
        {"text": "step one"}, {"text": "step two"}, {"code": "done('finished')"}]}]})
    ws = use_server(ws, server)
    write_goal(ws, "Keep going", name="keep", extra={"autonomous": True})
    run_once(ws)
    s = only(ws, "keep")
    assert s.status == "done" and s.read_result() == "finished" and len(s.events("turn_start")) == 3
    assert "call done(answer)" in s.events("notice")[0]["text"]


def test_autonomous_turns_budget(ws, server):
    server.set_script({"rules": [{"match": "^Loop", "replies": [{"text": "again"}] * 10}]})
    ws = use_server(ws, server)
    write_goal(ws, "Loop", name="loop", extra={"autonomous": True, "budget": {"turns": 2}})
    run_once(ws)
    s = only(ws, "loop")
    assert s.status == "stopped" and s.meta["stop_reason"] == "budget:turns" and len(s.events("turn_start")) == 2


def test_token_budget_counts_the_whole_tree(ws, server):
    # each call reports 100 tokens; the budget of 450 is crossed by the children's calls
    usage = {"input_tokens": 90, "output_tokens": 10}
    parent = {"match": "^Spend", "replies": [
        {"code": "hs = [rlm(f'Child {i}') for i in range(2)]\ntry:\n    print(wait_all(hs))\n"
                 "except Exception as e:\n    print('child stopped:', e)", "usage": usage},
        {"text": "should not be asked", "usage": usage}]}
    child = {"match": "^Child", "replies": [{"code": "x = 1", "usage": usage}, {"code": "x = 2", "usage": usage},
                                            {"text": "child done", "usage": usage}]}
    server.set_script({"rules": [parent, child]})
    ws = use_server(ws, server)
    write_goal(ws, "Spend tokens", name="spend", extra={"budget": {"tokens": 450}})
    run_once(ws)
    root = only(ws, "spend")
    assert root.status == "stopped" and root.meta["stop_reason"] == "budget:tokens"
    kids = [s for s in list_sessions(ws.sessions) if s.meta.get("parent") == root.id]
    assert any(k.meta.get("stop_reason") == "budget:tokens" for k in kids)
    total_calls = len(server.usages)
    assert total_calls * 100 >= 450 and (total_calls - 1) * 100 < 450 + 100 * 2  # stopped promptly
    assert root.read_result() is None


def test_seconds_budget(ws, server):
    (ws.root / "s.yaml").write_text("- code: import time; time.sleep(1.2)\n- code: x = 1\n- text: late\n")
    ws_ = use_server(ws, server)
    write_goal(ws_, "slow", name="slow", model="scripted/s.yaml", extra={"budget": {"seconds": 1}})
    run_once(ws_)
    assert only(ws_, "slow").meta["stop_reason"] == "budget:seconds"


def test_done_refused_while_end_conditions_fail_and_goal_status(ws, server):
    server.set_script({"rules": [{"match": "^Finish", "replies": [
        {"code": "st = goal_status()\nprint(st['budget']['turns'], [c['passed'] for c in st['end_conditions']])\n"
                 "try:\n    done('too early')\nexcept Exception as e:\n    print('refused:', e)"},
        {"code": "open('report.md', 'w').write('r')\ndone('finished')"}]}]})
    ws = use_server(ws, server)
    write_goal(ws, "Finish the report", name="fin", extra={
        "budget": {"turns": 4}, "end_conditions": [{"file_exists": "report.md"}]})
    run_once(ws)
    s = only(ws, "fin")
    out = s.events("cell")[0]["output"]
    assert "{'limit': 4, 'used': 1, 'left': 3} [False]" in out
    assert "refused: done() refused: end conditions not met:\nreport.md does not exist yet" in out
    assert s.status == "done" and s.read_result() == "finished"


def test_goal_flags_and_bad_goal_control(ws, tmp_path):
    r = cli(ws, "goal", "x", "--name", "flags", "--autonomous", "--budget", "turns=3", "--budget", "cost_usd=0.5",
            "--end-condition", "command=pytest -q")
    assert r.returncode == 0, r.stderr
    text = (ws.goals / "flags.md").read_text()
    assert "autonomous: true" in text and "cost_usd: 0.5" in text and "command: pytest -q" in text
    for args, word in ((("--budget", "bananas=3"), "bad --budget"), (("--budget", "turns=x"), "not a number"),
                       (("--end-condition", "nope=1"), "unknown end condition"),
                       (("--end-condition", "novalue"), "bad --end-condition")):
        r = cli(ws, "goal", "x", *args)
        assert r.returncode == 1 and "Traceback" not in r.stderr and word in r.stderr, r.stderr
    (ws.goals / "bad.md").write_text("---\nbudget: {turns: -1}\n---\nx\n")
    (ws.goals / "bad2.md").write_text("---\nend_conditions: [{weird: 1}]\n---\nx\n")
    r = cli(ws, "status")
    assert "budget turns must be a positive number" in r.stderr and "unknown end condition 'weird'" in r.stderr
    assert json.loads(cli(ws, "status", "--json").stdout) == []


def test_cost_budget_from_litellm_prices(ws, server):
    # a model litellm has a price for, served by the local scripted server: real cost accounting
    usage = {"input_tokens": 100000, "output_tokens": 10000}
    server.set_script({"rules": [{"match": "^Pay", "replies": [{"code": "x = 1", "usage": usage}] * 10}]})
    ws = use_server(ws, server)
    models = dict(ws.config["models"])
    models["priced"] = {"model": "openai/gpt-4o-mini", "api_base": server.url, "api_key": "k"}
    from conftest import configure

    ws = configure(ws, models=models)
    write_goal(ws, "Pay per token", name="pay", model="priced", extra={"budget": {"cost_usd": 0.05}})
    run_once(ws)
    s = only(ws, "pay")
    calls = s.events("model_call")
    assert calls[0]["cost_known"] and calls[0]["cost_usd"] > 0
    assert s.status == "stopped" and s.meta["stop_reason"] == "budget:cost"
    spent = sum(c["cost_usd"] for c in calls)
    assert spent >= 0.05 and spent - calls[-1]["cost_usd"] < 0.05  # stopped at the first call over budget


def test_goal_heartbeat_flag(ws):
    r = cli(ws, "goal", "x", "--name", "hb", "--heartbeat", "every 5m", "--heartbeat-prompt", "look again")
    assert r.returncode == 0, r.stderr
    text = (ws.goals / "hb.md").read_text()
    assert "schedule: every 5m" in text and "prompt: look again" in text
    bad = cli(ws, "goal", "x", "--heartbeat", "often")
    assert bad.returncode == 1 and "bad heartbeat schedule" in bad.stderr
