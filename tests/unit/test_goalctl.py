"""runner/goalctl.py on its own: budgets over the session tree, end conditions, what follows a turn.
Real: the workspace's sessions (session.yaml, history.jsonl: usage is read from `model_call` events as the
gateway writes them), the session tree, the bell, each session's Agent (no kernel host), the built-in
`file_exists` end condition. Faked: Turns.turns_of (a dict of turns so far), and end conditions of the
test's own (one that raises, as a broken plugin's would)."""
from __future__ import annotations

import time

import pytest
from conftest import agent_of, new_session

from primefs.default_plugins.end_conditions import file_exists
from primefs.errors import BudgetExhausted, SessionStopping
from primefs.runner.bell import Bell
from primefs.runner.goalctl import GoalControl
from primefs.runner.tree import SessionTree


def broken(arg, ctx):
    raise ValueError("the plugin has a bug")


CONDITIONS = {"file_exists": file_exists, "broken": broken}


class Goals:
    """A GoalControl as the runner wires it, with the turns each session has had so far in `turns`."""

    def __init__(self, ws):
        self.ws, self.tree, self.bell, self.turns = ws, SessionTree(ws.sessions), Bell(), {}
        self.ctl = GoalControl(self.tree, CONDITIONS, ws, self.bell, lambda sid: self.turns.get(sid, 0))

    def session(self, name, parent=None, **extra):
        return new_session(self.ws, self.tree, name, parent=parent, **extra)

    def agent(self, session, turns=0):
        a = agent_of(self.ws, self.tree, session, bell=self.bell)
        a.turns = self.turns[session.id] = turns
        return a


@pytest.fixture
def goals(ws):
    return Goals(ws)


def calls(session, *usage):
    """Model calls in the session's history, as the gateway records them: (input, output, cost) each."""
    for i, o, cost in usage:
        session.history.append("model_call", model="mock/model", purpose="turn", input_tokens=i, output_tokens=o,
                               cost_usd=cost, cost_known=True)


def test_the_budget_holder_is_the_nearest_session_with_a_budget(goals):
    top = goals.session("top", budget={"tokens": 1000})
    mid = goals.session("mid", parent=top)
    low = goals.session("low", parent=mid, budget={"turns": 3})
    free = goals.session("free")
    assert [goals.ctl.holder(s.id) for s in (top, mid, low, free)] == [top.id, top.id, low.id, None]
    assert goals.ctl.exhausted(free.id, next_turn=True) is None


def test_tokens_and_cost_count_every_session_below_the_holder_and_nothing_else(goals):
    top = goals.session("top", budget={"tokens": 100})
    kid = goals.session("kid", parent=top)
    grandkid = goals.session("grandkid", parent=kid)
    stranger = goals.session("stranger")
    calls(top, (10, 5, 0.0))
    calls(kid, (30, 30, 0.0))
    calls(grandkid, (20, 5, 0.0), (1, 1, 0.0))
    calls(stranger, (1000, 1000, 0.0))
    assert goals.ctl.used(top.id)["tokens"] == 102
    assert goals.ctl.exhausted(grandkid.id) == ("budget:tokens", f"tokens used 102 of 100 (budget of {top.id})")
    assert goals.ctl.exhausted(top.id) == ("budget:tokens", "tokens used 102 of 100")
    rich = goals.session("rich", budget={"cost_usd": 1.0})
    calls(goals.session("spender", parent=rich), (1, 1, 0.6), (1, 1, 0.5))
    assert goals.ctl.exhausted(rich.id) == ("budget:cost", "cost_usd used 1.1 of 1")


def test_a_turns_budget_allows_its_last_turn_but_not_one_more(goals):
    s = goals.session("g", budget={"turns": 2})
    goals.turns[s.id] = 2
    assert goals.ctl.exhausted(s.id) is None  # model calls of the second turn go on
    assert goals.ctl.exhausted(s.id, next_turn=True) == ("budget:turns", "turns used 2 of 2")


def test_seconds_count_from_the_first_turn(goals):
    s = goals.session("g", budget={"seconds": 50})
    assert goals.ctl.used(s.id)["seconds"] == 0.0  # no turn yet: no time used
    s.update(started_ts=time.time() - 100)
    reason, detail = goals.ctl.exhausted(s.id)
    assert reason == "budget:seconds" and detail.startswith("seconds used 100")


def test_before_a_model_call_stops_and_budgets_are_checked(goals):
    fresh = goals.agent(goals.session("fresh", budget={"tokens": 10}))
    goals.ctl.before_model_call(fresh)  # nothing used yet: the call may go
    spent = goals.session("spent", budget={"tokens": 10})
    calls(spent, (10, 0, 0.0))
    with pytest.raises(BudgetExhausted) as exc:
        goals.ctl.before_model_call(goals.agent(spent))
    assert exc.value.reason == "budget:tokens"
    fresh.stop_requested = True  # `primefs stop`
    with pytest.raises(SessionStopping):
        goals.ctl.before_model_call(fresh)
    fresh.stop_requested = False
    goals.bell.stop()  # the runner stops
    with pytest.raises(SessionStopping):
        goals.ctl.before_model_call(fresh)


def test_end_conditions_are_checked_in_the_sessions_room_and_a_broken_one_fails_alone(goals):
    s = goals.session("g", end_conditions=[{"file_exists": "report.md"}, {"broken": 1}, {"vanished": "x"}])
    agent = goals.agent(s)
    results = goals.ctl.evaluate(agent)
    assert [(r["name"], r["passed"]) for r in results] == [("file_exists", False), ("broken", False),
                                                           ("vanished", False)]
    assert results[1]["report"] == "broken raised ValueError: the plugin has a bug"
    assert results[2]["report"] == "unknown end condition 'vanished'"  # its plugin is no longer installed
    refused = goals.ctl.refuse_done(agent)
    assert refused.startswith("done() refused: end conditions not met:") and "report.md does not exist yet" in refused
    agent.room.mkdir(exist_ok=True)
    (agent.room / "report.md").write_text("done")
    assert goals.ctl.evaluate(agent)[0] == {"name": "file_exists", "arg": "report.md", "passed": True,
                                            "report": "report.md exists"}
    ok = goals.session("ok", end_conditions=[{"file_exists": "../../../primefs.yaml"}])
    assert goals.ctl.refuse_done(goals.agent(ok)) is None  # in the workspace, outside the room: allowed
    out = goals.session("out", end_conditions=[{"file_exists": "../../../../etc/passwd"}])
    assert "outside the workspace" in goals.ctl.refuse_done(goals.agent(out))


def test_passing_end_conditions_make_the_session_done(goals):
    s = goals.session("g", end_conditions=[{"file_exists": "ok.txt"}])
    agent = goals.agent(s, turns=1)
    agent.room.mkdir(exist_ok=True)
    (agent.room / "ok.txt").write_text("yes")
    s.set_status("idle", stop_reason="answered")
    assert goals.ctl.after_turn(agent, "idle") is None
    assert (s.reload()["status"], s.meta["stop_reason"]) == ("done", "done")
    [check] = s.events("end_conditions")
    assert check["results"] == [{"name": "file_exists", "passed": True}] and check["report"] == ""


def test_failing_end_conditions_leave_a_goal_that_is_not_autonomous_idle(goals):
    s = goals.session("g", end_conditions=[{"file_exists": "ok.txt"}])
    agent = goals.agent(s, turns=1)
    s.set_status("idle", stop_reason="answered")
    assert goals.ctl.after_turn(agent, "idle") is None
    assert s.reload()["status"] == "idle"
    assert s.events("end_conditions")[0]["report"] == "ok.txt does not exist yet"
    s.set_status("done", stop_reason="done")  # done() accepted, then the file went away
    goals.ctl.after_turn(agent, "done")
    assert (s.reload()["status"], s.meta["stop_reason"]) == ("idle", "end_conditions_failed")


def test_an_autonomous_goal_goes_on_while_its_conditions_fail_until_its_budget_is_used(goals):
    s = goals.session("g", autonomous=True, budget={"turns": 3}, end_conditions=[{"file_exists": "ok.txt"}])
    agent = goals.agent(s, turns=1)
    s.set_status("idle", stop_reason="answered")
    notice = goals.ctl.after_turn(agent, "idle")
    assert notice.startswith("The goal's end conditions are not met yet (attempt 2 of 3):")
    assert "ok.txt does not exist yet" in notice and notice.endswith("Keep working on the goal.")
    agent.turns = goals.turns[s.id] = 3
    assert goals.ctl.after_turn(agent, "idle") is None
    meta = s.reload()
    assert (meta["status"], meta["stop_reason"]) == ("stopped", "budget:turns")  # never success
    assert meta["error"] == "turns used 3 of 3; end conditions still failing: file_exists"


def test_an_autonomous_goal_without_conditions_goes_on_until_done_or_its_budget(goals):
    s = goals.session("g", autonomous=True, budget={"turns": 2})
    agent = goals.agent(s, turns=1)
    s.set_status("idle", stop_reason="answered")
    assert goals.ctl.after_turn(agent, "idle").startswith("Continue working on the goal.")
    assert goals.ctl.after_turn(agent, "done") is None  # done() ends it
    goals.turns[s.id] = 2
    assert goals.ctl.after_turn(agent, "idle") is None
    assert (s.reload()["status"], s.meta["stop_reason"], s.meta["error"]) == ("stopped", "budget:turns",
                                                                              "turns used 2 of 2")


@pytest.mark.parametrize("outcome", ["failed", "stopped"])
def test_nothing_follows_a_failed_or_stopped_turn(goals, outcome):
    s = goals.session("g", autonomous=True, end_conditions=[{"file_exists": "ok.txt"}])
    assert goals.ctl.after_turn(goals.agent(s, turns=1), outcome) is None
    assert s.events("end_conditions") == [] and s.reload()["status"] == "pending"


def test_goal_status_shows_the_budget_left_and_the_conditions(goals):
    top = goals.session("top", autonomous=True, budget={"turns": 5, "tokens": 100},
                        end_conditions=[{"file_exists": "x"}])
    kid = goals.session("kid", parent=top)
    calls(kid, (20, 10, 0.0))
    goals.turns[top.id] = 2
    status = goals.ctl.status(goals.agent(kid))
    assert status["budget_holder"] == top.id and status["autonomous"] is False  # the child's own flag
    assert status["budget"] == {"turns": {"limit": 5, "used": 2, "left": 3},
                                "tokens": {"limit": 100, "used": 30, "left": 70}}
    assert status["goal"] == "the task of kid" and status["end_conditions"] == []
    assert [r["name"] for r in goals.ctl.status(goals.agent(top, turns=2))["end_conditions"]] == ["file_exists"]


def spend(goals, session, tokens, cost=0.0):
    """A model call, recorded as the gateway records it (its history, then the running count)."""
    e = session.history.append("model_call", model="mock/model", purpose="turn", input_tokens=tokens, output_tokens=0,
                               cost_usd=cost, cost_known=True)
    goals.ctl.record_call(session.id, e)


def test_a_child_budget_is_reserved_of_the_parents_and_returns_when_the_child_ends(goals):
    top = goals.session("top", budget={"tokens": 1000})
    spend(goals, top, 300)
    child = goals.session("child", parent=top, budget={"tokens": 500}, status="running")
    kid = goals.session("kid", parent=child)
    other = goals.session("other", parent=top)
    spend(goals, child, 100)
    # top's own part: 300 + 100 used, 400 still reserved for the running child: 800 of 1000
    assert goals.ctl.exhausted(top.id) is None and goals.ctl.exhausted(other.id) is None
    spend(goals, other, 200)  # 600 used + 400 reserved: the top's other sessions are out
    assert goals.ctl.exhausted(other.id) == ("budget:tokens", "tokens used 1000 of 1000, 400 of it reserved for "
                                             f"children (budget of {top.id})")
    assert goals.ctl.exhausted(kid.id) is None  # the child spends its own share
    spend(goals, kid, 400)  # the child's 500 are spent: it stops at its own limit
    assert goals.ctl.exhausted(kid.id) == ("budget:tokens", f"tokens used 500 of 500 (budget of {child.id})")
    child.set_status("idle", stop_reason="answered")
    assert goals.ctl.exhausted(other.id) == ("budget:tokens", f"tokens used 1000 of 1000 (budget of {top.id})")


def test_a_child_budget_must_fit_in_what_every_budget_above_has_left(goals):
    from primefs.errors import PrimefsError

    top = goals.session("top", budget={"tokens": 1000, "cost_usd": 1.0})
    spend(goals, top, 700, 0.25)
    goals.ctl.left_for_child(top.id, {"tokens": 300, "cost_usd": 0.75})  # exactly what is left: fine
    goals.session("first", parent=top, budget={"tokens": 200}, status="running")
    with pytest.raises(PrimefsError, match=rf"tokens 150 is more than the 100 the budget of {top.id} has left"):
        goals.ctl.left_for_child(top.id, {"tokens": 150})
    goals.ctl.left_for_child(top.id, {"turns": 50, "seconds": 10})  # not reserved: a child's own limits
