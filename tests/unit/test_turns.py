"""runner/turns.py on its own: what starts a turn (the task, mail, a turn a runner stop cut off, an autonomous
goal going on), how a turn ends (its record, the result mail to the parent, a commit request), failures and
stops. Real: the workspace's sessions and mailboxes (history.jsonl, session.yaml), the session tree, the bell,
the post office, the scheduler, goal control, and each session's Agent (its records and conversation) with
no kernel host. Faked: the Agent's model loop (`run_turn`: what each turn does is the test's plan, see
ScriptedAgent), the committer (a list of requests), the hand-edit commit (a counter) and the log (a list)."""
from __future__ import annotations

import threading

import pytest
from conftest import agent_of, new_session

from primefs.default_plugins.end_conditions import file_exists
from primefs.runner.agent import Agent
from primefs.runner.bell import Bell
from primefs.runner.goalctl import GoalControl
from primefs.runner.postoffice import PostOffice
from primefs.runner.scheduler import Scheduler
from primefs.runner.tree import SessionTree
from primefs.runner.turns import Turns
from primefs.store import frontmatter, mail
from primefs.store.conversation import INTERRUPTED, RESUMED


class ScriptedAgent(Agent):
    """The real Agent with its model loop replaced: each turn runs the next step of `plan` (a function of the
    agent returning the turn's outcome, as run_turn does), so no model and no kernel are needed."""

    plan: list

    def run_turn(self) -> str:
        self.ensure_conversation()
        return self.plan.pop(0)(self)


def answer(text):
    return lambda agent: agent.finish(text, "idle")


def done(text):
    return lambda agent: agent.finish(text, "done")


def model_error(agent):  # what run_turn does when the model's last retry failed
    agent.record("error", error="the model is down")
    agent.session.set_status("failed", error="the model is down", stop_reason="error")
    return "failed"


def bug(agent):
    raise RuntimeError("a bug in the turn")


class FakeCommitter:
    def __init__(self):
        self.requests = []

    def request(self, path, message, mark):
        self.requests.append((path, message))


class Parts:
    """Turns and its collaborators, wired as Runner.__init__ wires them."""

    def __init__(self, ws):
        self.ws, self.log, self.hand_edits = ws, [], 0
        self.plans: dict[str, list] = {}  # session name -> what each of its turns does
        self.tree, self.bell = SessionTree(ws.sessions), Bell()
        self.scheduler = Scheduler(self.bell, lambda: 2, lambda sid: self.turns.work(sid), self.log.append)
        self.post = PostOffice(self.tree, self.bell, self.log.append, on_mail=lambda sid: self.turns.mail_arrived(sid))
        self.goals = GoalControl(self.tree, {"file_exists": file_exists}, ws, self.bell,
                                 lambda sid: self.turns.turns_of(sid))
        self.turns = Turns(ws, self.tree, self.post, self.scheduler, self.goals, self.bell, self.make_agent,
                           self.commit_hand_edits, self.log.append)
        self.turns.committer = FakeCommitter()

    def make_agent(self, session):
        agent = agent_of(self.ws, self.tree, session, post=self.post, bell=self.bell, cls=ScriptedAgent)
        agent.plan = self.plans.setdefault(session.name, [])
        return agent

    def commit_hand_edits(self):
        self.hand_edits += 1

    def session(self, name, *steps, parent=None, **extra):
        self.plans[name] = list(steps)
        return new_session(self.ws, self.tree, name, parent=parent, **extra)


@pytest.fixture
def parts(ws):
    return Parts(ws)


def types(session, *wanted):
    return [e["type"] for e in session.events() if not wanted or e["type"] in wanted]


def test_a_new_sessions_first_turn_records_its_task_and_ends_as_the_agent_said(parts, ws):
    (ws.goals / "count.md").write_text("Count")
    s = parts.session("count", answer("42"), goal="goals/count.md")
    assert parts.turns.work(s.id) is False  # nothing more came meanwhile
    assert types(s, "task", "turn_start", "result", "turn_end") == ["task", "turn_start", "result", "turn_end"]
    start, end = s.events("turn_start")[0], s.events("turn_end")[0]
    assert (start["turn"], start["model"]) == (1, "mock/model")
    assert (end["turn"], end["outcome"], end["status"], end["stop_reason"]) == (1, "idle", "idle", "answered")
    assert s.read_result() == "42" and s.reload()["started_ts"] > 0 and parts.plans["count"] == []
    assert parts.turns.committer.requests == [(f"sessions/{s.id}", f"session {s.id} (count): turn 1 idle"),
                                              ("goals/count.md", f"session {s.id} (count): turn 1 idle")]
    assert parts.hand_edits == 1  # a person's harness edits are committed at turn boundaries
    assert parts.log == [f"{s.id} (count): turn 1 started", f"{s.id} (count): turn 1 ended: idle"]
    assert parts.turns.turns_of(s.id) == 1


def test_new_mail_queues_a_turn_that_reads_it(parts):
    s = parts.session("chat", answer("hi"), answer("fine, thanks"))
    parts.turns.work(s.id)
    assert parts.turns.work(s.id) is False and len(s.events("turn_start")) == 1  # no input: no turn
    parts.post.deliver(s.id, sender="user", kind="user", text="how are you?")
    assert parts.scheduler.queued == {s.id}
    parts.turns.work(s.id)
    assert [e["text"] for e in s.events("message")] == ["how are you?"]
    assert [e["turn"] for e in s.events("turn_start")] == [1, 2] and s.read_result() == "fine, thanks"
    assert mail.new_files(s.mail) == [] and mail.unacked(s.mail) == []


def test_mail_to_a_running_or_stopped_session_queues_nothing(parts):
    busy = parts.session("busy")
    with parts.bell.cond:
        parts.scheduler.active.add(busy.id)  # its worker runs: it reads its mail before its next model call
    parts.post.deliver(busy.id, sender="user", kind="user", text="x")
    stopped = parts.session("stopped")
    stopped.set_status("stopped", stop_reason="stopped")
    parts.post.deliver(stopped.id, sender="user", kind="user", text="x")
    assert parts.scheduler.queued == set()
    assert parts.turns.work(stopped.id) is False and stopped.events("turn_start") == []


def test_a_childs_turn_end_is_result_mail_for_its_parent(parts):
    top = parts.session("top")
    kid = parts.session("kid", answer("7"), parent=top)
    parts.turns.work(kid.id)
    [path] = mail.new_files(top.mail)
    msg = mail.parse(path)
    assert (msg.kind, msg.sender, msg.text) == ("result", kid.id, "7")
    assert parts.scheduler.queued == {top.id}  # the result starts a turn of the parent
    meta, _ = frontmatter.read(path)
    assert (meta["child"], meta["name"], meta["status"], meta["turn"]) == (kid.id, "kid", "idle", 1)


def test_a_child_that_failed_tells_its_parent_why(parts):
    top = parts.session("top")
    kid = parts.session("kid", model_error, parent=top)
    parts.turns.work(kid.id)
    assert mail.parse(mail.new_files(top.mail)[0]).text == "(no result: the model is down)"
    assert kid.id in parts.turns.failed and kid.reload()["status"] == "failed"


def test_a_bug_in_a_turn_fails_its_session_not_the_runner(parts):
    top = parts.session("top")
    kid = parts.session("kid", bug, parent=top)
    assert parts.turns.work(kid.id) is False  # its waiting mail would fail it again at once
    meta = kid.reload()
    assert (meta["status"], meta["stop_reason"]) == ("failed", "error")
    assert meta["error"] == "RuntimeError: a bug in the turn"
    assert kid.events("error")[-1]["error"] == "RuntimeError: a bug in the turn"
    assert kid.id in parts.turns.failed and f"error in session {kid.id}: RuntimeError: a bug in the turn" in parts.log
    assert mail.parse(mail.new_files(top.mail)[0]).text == "(no result: RuntimeError: a bug in the turn)"


def test_a_turn_torn_down_by_the_runners_stop_stays_resumable(parts):
    def torn_down(agent):
        agent.bell.stop()  # Ctrl-C while the turn runs: its kernel goes away under it
        raise RuntimeError("the kernel connection closed")

    s = parts.session("s", torn_down)
    assert parts.turns.work(s.id) is False
    assert s.reload()["status"] == "running" and parts.turns.failed == set()  # the next runner goes on


def test_a_turn_a_runner_stop_cut_off_goes_on_as_the_same_turn(parts):
    s = parts.session("s", answer("finished after the restart"))
    # what the stopped runner left: a turn started, the model asked for code, no cell ever reported back
    s.history.append("task", text=s.task)
    s.history.append("turn_start", turn=1, model="mock/model")
    s.history.append("assistant", text="", calls=[{"id": "c1", "name": "python", "arguments": '{"code": "1"}'}])
    s.set_status("running")
    parts.turns.work(s.id)
    [cell] = s.events("cell")
    assert (cell["call_id"], cell["error"]) == ("c1", INTERRUPTED)  # every tool call is answered
    assert [e["text"] for e in s.events("notice")] == [RESUMED]
    assert [(e["turn"], e.get("resumed")) for e in s.events("turn_start")] == [(1, None), (1, True)]
    assert parts.turns.turns_of(s.id) == 1 and s.read_result() == "finished after the restart"
    assert parts.log[0] == f"{s.id} (s): turn 1 resumed"


def test_mail_recorded_before_a_crash_but_never_answered_starts_a_turn(parts):
    s = parts.session("s", answer("answered now"))
    for event in (("task", {"text": s.task}), ("turn_start", {"turn": 1}), ("turn_end", {"turn": 1}),
                  ("message", {"id": "m1", "from": "user", "kind": "user", "text": "one more thing"})):
        s.history.append(event[0], **event[1])
    s.set_status("idle")
    parts.turns.work(s.id)
    assert [e["turn"] for e in s.events("turn_start")] == [1, 2] and s.read_result() == "answered now"


def test_an_interrupted_turn_is_recorded_and_tells_no_parent(parts):
    top = parts.session("top")
    def interrupted(agent):  # what run_turn returns when the runner stops mid-turn
        agent.bell.stop()
        return "interrupted"

    kid = parts.session("kid", interrupted, parent=top)
    parts.turns.work(kid.id)
    end = kid.events("turn_end")[0]
    assert (end["outcome"], end["status"]) == ("interrupted", "running")
    assert mail.new_files(top.mail) == []
    assert parts.turns.committer.requests == [(f"sessions/{kid.id}", f"session {kid.id} (kid): turn 1 interrupted")]


def test_an_autonomous_goal_takes_turns_until_done(parts):
    s = parts.session("auto", answer("step one"), answer("step two"), done("all done"), autonomous=True)
    parts.turns.work(s.id)  # one worker, three turns: each notice starts the next
    assert [e["turn"] for e in s.events("turn_start")] == [1, 2, 3]
    assert len(s.events("notice")) == 2 and s.events("notice")[0]["text"].startswith("Continue working")
    assert (s.reload()["status"], s.read_result()) == ("done", "all done")


def test_an_autonomous_goal_stops_at_its_turns_budget_with_its_conditions_failing(parts):
    s = parts.session("auto", answer("try"), answer("try again"), answer("never run"), autonomous=True,
                      budget={"turns": 2}, end_conditions=[{"file_exists": "ok.txt"}])
    parts.turns.work(s.id)
    assert len(s.events("turn_start")) == 2 and parts.plans["auto"] != []
    meta = s.reload()
    assert (meta["status"], meta["stop_reason"]) == ("stopped", "budget:turns")
    assert "end conditions still failing: file_exists" in meta["error"]
    assert s.events("turn_end")[-1]["status"] == "stopped"


def test_stopping_a_session_that_waits_for_its_turn(parts):
    top = parts.session("top")
    kid = parts.session("kid", parent=top)
    parts.scheduler.add(kid.id)
    parts.turns.stop(kid.id)
    assert kid.reload()["status"] == "stopped"
    assert mail.parse(mail.new_files(top.mail)[0]).text == "(no result: stopped)"
    assert parts.scheduler.queued == {top.id}  # the kid's turn is gone; the parent's comes, for the news


def test_stopping_a_running_session_ends_its_turn_at_its_next_step(parts):
    running = threading.Event()

    def until_stopped(agent):  # a model loop that checks its stop flag between steps, as run_turn does
        running.set()
        agent.bell.wait_until(lambda: agent.stop_requested, timeout=10)
        return agent.stopped() if agent.stop_requested else "max_steps"

    s = parts.session("long", until_stopped)
    parts.scheduler.add(s.id)
    with parts.bell.cond:
        parts.scheduler.dispatch()  # a worker thread runs Turns.work, as under the runner
    assert running.wait(10)
    parts.turns.stop(s.id)
    assert parts.bell.wait_until(parts.scheduler.idle, timeout=10)
    assert s.reload()["status"] == "stopped" and s.events("turn_end")[0]["outcome"] == "stopped"


def test_a_stop_taken_as_a_turn_ends_idle_stops_the_session(parts):
    """The flag set while the last step ends: no step sees it, the worker does before another turn."""
    def stop_asked_at_the_end(agent):
        agent.stop_requested = True
        return agent.finish("ok", "idle")

    s = parts.session("chat", stop_asked_at_the_end)
    parts.post.deliver(s.id, sender="user", kind="user", text="more")  # it would take another turn
    assert parts.turns.work(s.id) is False
    assert s.reload()["status"] == "stopped" and len(s.events("turn_end")) == 1


def test_stopping_a_session_whose_worker_still_winds_down_after_its_turn(parts):
    s = parts.session("chat", answer("ok"))
    assert parts.turns.work(s.id) is False and s.reload()["status"] == "idle"
    parts.scheduler.active.add(s.id)  # its worker has not let go of its slot yet
    parts.turns.stop(s.id)
    assert s.reload()["status"] == "stopped"
