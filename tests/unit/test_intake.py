"""runner/intake.py on its own: goal files become sessions (once), heartbeats become mail, primefs.yaml is read
again when it changes, hand edits of the harness become commits. Real: the workspace (goals/, sessions/,
.primefs/goals.json, heartbeats/, git), the session tree, the scheduler (never dispatched: what it holds is
what was scheduled), the post office, the built-in end conditions. Faked: the runner's log (a list), and
time, only by dating files back (a goal file is read once it has settled)."""
from __future__ import annotations

import json
import os
import subprocess
import time

import pytest
from conftest import configure, new_session

from primefs.plugins import end_conditions, plugin_manager
from primefs.runner.bell import Bell
from primefs.runner.intake import GOAL_SETTLE_S, REJECTED, Intake
from primefs.store.fsutil import write_new
from primefs.runner.postoffice import PostOffice
from primefs.runner.scheduler import Scheduler
from primefs.runner.tree import SessionTree
from primefs.store import heartbeat, mail
from primefs.store.session import list_sessions


class Parts:
    """Intake and what the runner gives it (Runner.__init__), with the log and the mail it caused."""

    def __init__(self, ws):
        self.ws, self.log, self.mailed, self.adopted = ws, [], [], []
        self.tree, bell = SessionTree(ws.sessions), Bell()
        self.scheduler = Scheduler(bell, lambda: 1, self._no_turns, self.log.append)
        self.post = PostOffice(self.tree, bell, self.log.append, on_mail=self.mailed.append)
        self.intake = Intake(ws, self.tree, self.scheduler, self.post, end_conditions(plugin_manager(ws.root)),
                             self.log.append)
        self.intake.on_adopt = self.adopted.append

    @staticmethod
    def _no_turns(sid):
        raise AssertionError("nothing dispatches in these tests")

    def sessions(self) -> dict:
        return {s.name: s for s in list_sessions(self.ws.sessions)}

    def goal_errors(self) -> list[str]:
        return [line for line in self.log if line.startswith("goal error:")]

    def rejected(self) -> dict:
        path = self.ws.state / REJECTED
        return json.loads(path.read_text()) if path.exists() else {}


@pytest.fixture
def parts(ws):
    return Parts(ws)


def goal(ws, name: str, text: str, age: float = 60.0):
    """goals/NAME.md, written `age` seconds ago (settled: no process has it open)."""
    path = ws.goals / f"{name}.md"
    path.write_text(text)
    then = time.time() - age
    os.utime(path, (then, then))
    return path


def test_a_settled_goal_file_becomes_one_queued_session_once(parts, ws):
    goal(ws, "count", "---\nmodel: mock/model\nlimits: {max_steps_per_turn: 5}\n---\nCount the files\n")
    parts.intake.scan_goals()
    parts.intake.scan_goals()  # taken once, also when looked at again
    [s] = list_sessions(ws.sessions)
    assert (s.name, s.task, s.meta["model"], s.meta["goal"], s.meta["limits"]) == (
        "count", "Count the files", "mock/model", "goals/count.md", {"max_steps_per_turn": 5})
    assert parts.scheduler.queued == {s.id} and parts.tree.knows(s.id) and parts.adopted == [s.id]
    assert parts.intake.claimed == {"goals/count.md"}
    assert parts.log == [f"goal goals/count.md -> session {s.id} (count, model mock/model)"]


def test_a_goals_control_keys_go_into_its_session(parts, ws):
    goal(ws, "auto", "---\nautonomous: true\nbudget: {turns: 4, cost_usd: 0.5}\n"
                     "end_conditions: [{file_exists: out.txt}]\n---\nWrite out.txt\n")
    parts.intake.scan_goals()
    meta = parts.sessions()["auto"].meta
    assert meta["autonomous"] is True and meta["budget"] == {"turns": 4, "cost_usd": 0.5}
    assert meta["end_conditions"] == [{"file_exists": "out.txt"}]


def test_a_goal_file_being_written_is_read_once_it_settles(parts, ws):
    path = goal(ws, "fresh", "Just written", age=0)
    parts.intake.scan_goals()
    assert parts.sessions() == {} and parts.intake.next_look is not None  # the runner looks again soon
    assert parts.intake.next_look - time.monotonic() <= GOAL_SETTLE_S
    then = time.time() - 10
    with open(path, "a") as still_writing:  # older, but a process still has it open for writing
        os.utime(path, (then, then))
        parts.intake.scan_goals()
        assert parts.sessions() == {} and parts.intake.next_look is not None
    parts.intake.scan_goals()
    assert list(parts.sessions()) == ["fresh"] and parts.intake.next_look is None
    assert still_writing.closed


def test_a_goal_file_that_arrived_whole_is_read_at_once(parts, ws):
    """Renamed into place (`primefs goal`, the API: fsutil.write_new) or closed after writing: no settle time."""
    assert write_new(ws.goals / "whole.md", "---\nname: \"quoted\"\n---\nJust renamed in\n")
    assert not write_new(ws.goals / "whole.md", "again") and not [n for n in os.listdir(ws.goals) if "tmp" in n]
    parts.intake.goal_event(ws.goals / "whole.md", whole=True)
    assert list(parts.sessions()) == ["quoted"] and parts.intake.next_look is None  # a plain str, dumped safe
    goal(ws, "plain", "Written in place", age=0)
    parts.intake.goal_event(ws.goals / "plain.md", whole=False)  # a create event: it may still be written
    assert "plain" not in parts.sessions() and parts.intake.next_look is not None


@pytest.mark.parametrize("text, said", [
    ("---\nmodel: [unclosed\n---\ntask\n", "goals/bad.md"),
    ("---\ncolour: blue\n---\ntask\n", "unknown front matter key(s): colour"),
    ("---\nname: x\n---\n\n", "the goal has no task text"),
    ("---\nend_conditions: [{tests_pass: 1}]\n---\ntask\n", "unknown end condition 'tests_pass'"),
    ("---\nbudget: {turns: -1}\n---\ntask\n", "budget turns must be a positive number"),
    ("---\nmodel: no-such-alias\n---\ntask\n", "unknown model 'no-such-alias'"),
    ("---\nheartbeat: whenever\n---\ntask\n", "goals/bad.md"),
])
def test_a_bad_goal_file_is_refused_said_once_and_taken_once_mended(parts, ws, text, said):
    goal(ws, "bad", text)
    goal(ws, "good", "A healthy goal")
    parts.intake.scan_goals()
    parts.intake.scan_goals()
    assert list(parts.sessions()) == ["good"]  # one bad file never stops the others
    [error] = parts.goal_errors()  # said once, not at every scan
    assert said in error
    assert said in parts.rejected()["goals/bad.md"]["error"]  # for `primefs status`
    goal(ws, "bad", "---\nname: mended\n---\nA task now\n", age=30)  # a new version of the file
    parts.intake.scan_goals()
    assert sorted(parts.sessions()) == ["good", "mended"] and parts.rejected() == {}


def test_a_broken_goal_file_changed_but_still_broken_is_said_again(parts, ws):
    goal(ws, "bad", "---\ncolour: blue\n---\ntask\n", age=60)
    parts.intake.scan_goals()
    goal(ws, "bad", "---\ncolour: red\n---\ntask\n", age=30)
    parts.intake.scan_goals()
    assert len(parts.goal_errors()) == 2 and parts.sessions() == {}


def test_what_is_not_a_goal_file_is_said_and_never_a_task(parts, ws):
    (ws.goals / "notes.txt").write_text("not a goal")
    (ws.goals / "folder.md").mkdir()
    (ws.goals / ".draft.md.swp").write_text("an editor's")
    parts.intake.scan_goals()
    assert parts.sessions() == {}
    assert parts.goal_errors() == [
        "goal error: goals/folder.md: ignored, a folder (a goal is a goals/<name>.md file)",
        "goal error: goals/notes.txt: ignored, not a .md file (a goal is a goals/<name>.md file)"]


def test_removing_a_rejected_goal_file_clears_its_rejection(parts, ws):
    path = goal(ws, "bad", "---\ncolour: blue\n---\ntask\n")
    parts.intake.scan_goals()
    assert list(parts.rejected()) == ["goals/bad.md"]
    path.unlink()
    parts.intake.scan_goals()
    assert parts.rejected() == {}


def test_a_goals_heartbeat_is_mail_when_due_and_none_for_a_stopped_session(parts, ws):
    goal(ws, "beat", "---\nheartbeat: {every: 10m, prompt: look at the queue}\n---\nWatch the queue\n")
    parts.intake.scan_goals()
    s = parts.sessions()["beat"]
    [hb] = heartbeat.load_all(s.dir)
    parts.intake.tick_heartbeats()
    assert mail.new_files(s.mail) == []  # not due yet
    hb["next_due"] = time.time() - 1800  # three ticks were missed
    heartbeat.save(s.dir, hb)
    parts.intake.tick_heartbeats()
    [path] = mail.new_files(s.mail)
    m = mail.parse(path)
    assert (m.kind, m.sender) == ("heartbeat", "heartbeat") and m.text.startswith("look at the queue")
    assert "earlier ticks missed" in m.text and parts.mailed == [s.id]
    parts.intake.tick_heartbeats()
    assert len(mail.new_files(s.mail)) == 1  # claimed before delivery: never twice
    hb = heartbeat.load_all(s.dir)[0]
    hb["next_due"] = time.time() - 1
    heartbeat.save(s.dir, hb)
    s.set_status("stopped", stop_reason="stopped")
    parts.intake.tick_heartbeats()
    assert len(mail.new_files(s.mail)) == 1  # stopping is final


def test_a_broken_heartbeat_file_is_said_and_the_others_still_tick(parts, ws):
    s = new_session(ws, parts.tree, "beat")
    good = parts.intake.add_heartbeat(s, "every 1h")
    good["next_due"] = time.time() - 1
    heartbeat.save(s.dir, good)
    (heartbeat.folder(s.dir) / "hb-broken.yaml").write_text("id: hb-broken\nschedule: every 1h\nnext_due: soon\n")
    parts.intake.tick_heartbeats()
    assert len(mail.new_files(s.mail)) == 1
    [warning] = [line for line in parts.log if line.startswith("warning: heartbeat skipped:")]
    assert "hb-broken.yaml" in warning


def test_primefs_yaml_is_read_again_only_when_it_changed_and_a_broken_one_keeps_the_old(parts, ws):
    assert parts.intake.check_config() is False
    configure(ws, models={"fast": {"model": "mock/fast"}})
    assert parts.intake.check_config() is True and "fast" in ws.config["models"]
    assert parts.log[-1].startswith("primefs.yaml reloaded")
    (ws.root / "primefs.yaml").write_text("limits: [not, a, mapping]\n")
    assert parts.intake.check_config() is False
    assert parts.log[-1].startswith("error: primefs.yaml not reloaded") and "fast" in ws.config["models"]


def test_a_new_child_session_is_linked_under_its_parent_and_queued(parts, ws):
    top = new_session(ws, parts.tree, "top")
    child = new_session(ws, SessionTree(ws.sessions), "child", parent=top)  # made elsewhere (rlm())
    parts.intake.adopt(child)
    assert parts.tree.parent(child.id) == top.id and parts.tree.children(top.id) == [child.id]
    assert parts.scheduler.queued == {child.id} and parts.adopted == [child.id]


def git(ws, *args) -> str:
    return subprocess.run(["git", "-C", str(ws.root), *args], capture_output=True, text=True, check=True).stdout


def test_hand_edits_of_the_harness_are_committed_as_the_users_when_touched(parts, ws):
    note = ws.harness / "notes" / "style.md"
    note.write_text("---\ndescription: how to write\n---\nShort sentences.\n")
    parts.intake.commit_hand_edits()  # the runner starts dirty: edits made while none ran
    assert "Primefs-Source: user" in git(ws, "log", "-1", "--format=%B")
    assert git(ws, "status", "--porcelain", "--", "harness") == ""
    note.write_text("---\ndescription: how to write\n---\nShorter sentences.\n")
    before = git(ws, "rev-parse", "HEAD")
    parts.intake.commit_hand_edits()  # no file event said the harness changed: not looked at
    assert git(ws, "rev-parse", "HEAD") == before
    parts.intake.harness_touched()
    parts.intake.commit_hand_edits()
    assert git(ws, "rev-parse", "HEAD") != before and git(ws, "status", "--porcelain", "--", "harness") == ""
