"""Turns: what happens to a session between its turns. What starts a turn (its task, mail, a resumed
turn after a runner restart, an autonomous goal going on), how a turn ends (the goal's verdict, the
result mail to the parent, a snapshot, a commit), stops, and which idle sessions keep a kernel."""
from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable

from primefs.errors import PrimefsError
from primefs.harness.refine import run_refine
from primefs.kernels.boxes import give
from primefs.kernels.client import close_thread_loop
from primefs.runner.agent import Agent
from primefs.runner.bell import Bell
from primefs.runner.goalctl import GoalControl
from primefs.runner.idlekernels import IdleKernels
from primefs.runner.postoffice import PostOffice
from primefs.runner.scheduler import Scheduler
from primefs.runner.tree import SessionTree
from primefs.store import worktrees
from primefs.store.conversation import INTERRUPTED, RESUMED, fenced_code
from primefs.store.gitops import Committer, Mark
from primefs.store.history import latest_events, since_compaction
from primefs.store.session import Session
from primefs.tracing import spans as tracing


# Sessions whose live state (an Agent: conversation, mail state; its Session: session.yaml, open history file)
# stays in memory between their turns, the most recently used. Older ones that hold nothing live are let go and
# read again from their files if they wake: else a runner's memory and open files grow with every session it
# ever ran (~20 KB and a file descriptor each), and a runner that runs for months runs out of both.
KEEP_AGENTS = 256


class Turns:
    def __init__(self, ws, tree: SessionTree, post: PostOffice, scheduler: Scheduler, goals: GoalControl,
                 bell: Bell, make_agent: Callable[[Session], Agent], commit_hand_edits: Callable[[], None], log):
        self.ws, self.tree, self.post, self.scheduler, self.goals, self.bell = ws, tree, post, scheduler, goals, bell
        self.make_agent, self.commit_hand_edits, self.log = make_agent, commit_hand_edits, log
        self.committer: Committer | None = None
        self.agents: dict[str, Agent] = {}
        self.failed: set[str] = set()  # sessions that failed under this runner (`run --once` exit code)
        self._lock = threading.Lock()
        self.kernels = IdleKernels(ws.limits().max_idle_kernels)
        # runs a refinement's gate (primefs.eval.gate.run_gate), given by the program that runs this runner:
        # the eval layer is above the runner's. None: a gated refinement applies nothing.
        self.gate_runner: Callable | None = None

    def agent(self, sid: str) -> Agent:
        with self._lock:
            a = self.agents.pop(sid, None)  # (put back last: the dict's order is the order of use)
            if a is None:
                a = self.make_agent(self.tree.session(sid))
            self.agents[sid] = a
            return a

    def forget_idle(self) -> None:
        """Beyond KEEP_AGENTS, let go of the least recently used sessions that hold nothing live: no turn
        queued or running, no kernel, nothing asked of their next turn."""
        with self._lock:
            extra = len(self.agents) - KEEP_AGENTS
            if extra <= 0:  # (at every turn's end: no copy of the dict then)
                return
            for sid, a in list(self.agents.items()):
                if extra <= 0:
                    break
                if (self.scheduler.busy(sid) or a.kernel.held() or a.pending_notice or a.pending_refine
                        or a.stop_requested or a.retire_kernel or not a.turn_lock.acquire(blocking=False)):
                    continue
                try:
                    a.forgotten = True
                    del self.agents[sid]
                    self.tree.forget(sid)
                    self.goals.forget(sid)
                    extra -= 1
                finally:
                    a.turn_lock.release()

    def turns_of(self, sid: str) -> int:
        a = self.agents.get(sid)
        if a is not None and a.messages is not None:
            return a.turns
        return self.tree.session(sid).summary()["turns"]  # its summary: no history read whole

    # -- the worker -------------------------------------------------------------------------------
    def work(self, sid: str) -> bool:
        """A scheduler worker: turns until the session has no input left. True if more came meanwhile."""
        agent, began = None, time.time()
        try:
            agent = self.agent(sid)
            with agent.turn_lock:
                self.kernels.taken(sid)
                while not self.bell.stopping and self._begin_turn(agent):
                    self._turn(agent)
        except Exception as exc:  # never let one session take the runner down
            self.log(f"error in session {sid}: {type(exc).__name__}: {exc}")
            if not self.bell.stopping:  # torn down under it: resumable, not failed
                self._fail(sid, exc)
                self.post.hold_back(sid, began)  # the mail that was waiting would fail it again at once
            return False
        finally:
            if agent is not None and not self.bell.stopping:
                self.kernels.park(agent)
                self.forget_idle()
            close_thread_loop()  # the next job of this worker thread may be any session's: no loop is kept for it
        if self.bell.stopping:
            return False
        try:
            return self.post.has_new(sid) and self.tree.session(sid).reload().get("status") != "stopped"
        except (OSError, PrimefsError):
            return False

    def _fail(self, sid: str, exc: Exception) -> None:
        """Each step on its own: a history that cannot be written (a folder put in its place) must not keep the
        session from being failed, or a runner would take its mail again and again."""
        self.failed.add(sid)
        error = f"{type(exc).__name__}: {exc}"
        for step in ("history", "status", "parent"):
            try:
                s = self.tree.session(sid)
                if step == "history":
                    s.history.append("error", error=error)
                elif step == "status":
                    s.set_status("failed", error=error, stop_reason="error")
                else:
                    self.report_to_parent(s, None)
            except Exception:  # noqa: BLE001 - said in the runner's log already; the next step still tried
                pass

    def _begin_turn(self, agent: Agent) -> bool:
        """Record what starts the next turn; False if there is nothing to do."""
        s = agent.session
        status = s.reload().get("status")
        agent.ensure_conversation()
        agent.resuming = False
        cut_off, agent.open_turn = agent.open_turn, None
        if cut_off and status not in ("running", "pending"):  # stopped after its answer, before its end
            self._end_turn(agent, cut_off["turn"], _outcome_of(s), cut_off["elapsed_s"])
            status = s.reload().get("status")
        if status == "stopped":
            return False
        if agent.stop_requested:  # asked as its last turn ended (turns.stop): no step of a turn saw it
            self._mark_stopped(s)
            return False
        if agent.turns == 0 and not s.events("task"):
            agent.record("task", text=s.task)
            return True
        if status == "running":  # the previous runner stopped mid-turn: the same turn goes on
            self._close_interrupted_cells(agent)
            agent.record("notice", text=RESUMED)
            agent.resuming = agent.turns > 0
            return True
        if status == "pending":  # its task is recorded but its first turn never started
            return True
        if agent.pending_notice:  # an autonomous goal goes on
            agent.record("notice", text=agent.pending_notice)
            agent.pending_notice = None
            return True
        return self.post.take_mail(agent) > 0 or _unanswered_input(agent)

    def _close_interrupted_cells(self, agent: Agent) -> None:
        """Code the model asked for that never reported back (the runner died mid-cell) gets an
        answer, so the conversation stays well-formed (every tool call answered). No compaction comes between
        a step's model call and its cells: the last one's are in what the last compaction kept."""
        events = since_compaction(agent.session.history.path)[1]
        last = max((i for i, e in enumerate(events) if e["type"] == "assistant"), default=None)
        if last is None:
            return
        done_ids = {e.get("call_id") for e in events[last + 1:] if e["type"] == "cell"}
        text = "[interrupted: the runner restarted during this cell]"
        calls = events[last].get("calls") or []
        if calls:
            for c in calls:
                if c["id"] not in done_ids:
                    agent.record("cell", call_id=c["id"], code=None, error=INTERRUPTED, shown=text)
        elif not any(e["type"] == "cell" for e in events[last + 1:]) and fenced_code(events[last].get("text") or ""):
            agent.record("cell", call_id=None, code=None, error=INTERRUPTED, shown=text)

    def _turn(self, agent: Agent) -> None:
        """One turn, from `turn_start` to `turn_end`."""
        resumed = agent.resuming
        if not resumed:
            agent.turns += 1
        s = agent.session
        first = {} if s.meta.get("started_ts") else {"started_ts": time.time()}  # the seconds budget counts from here
        if s.meta.get("worktree"):  # its git worktree: made at its first turn, again if removed since
            made = Path(worktrees.ensure(self.ws, s)["path"])
            room = os.lstat(made.parent)
            if room.st_uid != os.getuid():  # a root runner's sandboxed kernel, nobody, has its room: this too
                give(made, room.st_uid, room.st_gid)
        s.set_status("running", stop_reason=None, **first)
        start = agent.record("turn_start", turn=agent.turns, model=agent.settings["model"],
                             **({"resumed": True} if resumed else {}))
        with tracing.turn(s, start) as span:
            span.done(self._run_turn(agent, agent.turns, resumed))

    def _run_turn(self, agent: Agent, turn: int, resumed: bool) -> dict:
        """The turn `_turn` started; returns its `turn_end` event."""
        s = agent.session
        self.log(f"{s.id} ({s.name}): turn {turn} " + ("resumed" if resumed else "started"))
        started = time.monotonic()
        outcome = agent.run_turn()
        elapsed = round(time.monotonic() - started, 4)
        if outcome == "interrupted":
            end = agent.record("turn_end", turn=turn, outcome=outcome, elapsed_s=elapsed, status="running",
                               stop_reason=None)
            s.summary()
            self.commit_session(s, f"turn {turn} interrupted")
            return end
        return self._end_turn(agent, turn, outcome, elapsed)

    def _end_turn(self, agent: Agent, turn: int, outcome: str, elapsed: float) -> dict:
        """What follows a turn's last step (also for a turn a runner's stop cut off before this)."""
        s = agent.session
        if agent.pending_refine:
            request, agent.pending_refine = agent.pending_refine, None
            self.refine(agent, **request)
        agent.pending_notice = self.goals.after_turn(agent, outcome)
        if agent.kernel.mode == "turn":
            agent.kernel.snapshot("turn")
        if s.meta.get("worktree"):  # what it changed there: committed on its branch, listed for its parent
            self._settle_worktree(s, turn)
        # before turn_end: a runner stopped in between ends the turn again, and the parent shows the result once
        self.report_to_parent(s, turn)
        end = agent.record("turn_end", turn=turn, outcome=outcome, elapsed_s=elapsed, status=s.status,
                           stop_reason=s.meta.get("stop_reason"))
        s.summary()  # summaries are written at turn ends and status changes, not at every event
        self.log(f"{s.id} ({s.name}): turn {turn} ended: {outcome}")
        if agent.hooks is not None:
            agent.hooks.fire("turn_end", s, end)
            if s.status in ("done", "failed", "stopped"):  # it takes no more turns of itself
                agent.hooks.fire("session_end", s, end)
        if s.status == "failed":
            self.failed.add(s.id)
        self.commit_hand_edits()
        self.commit_session(s, f"turn {turn} {outcome}")
        return end

    def _settle_worktree(self, s: Session, turn: int) -> None:
        parent = s.meta.get("parent")
        try:
            worktrees.settle(s, turn, [self.tree.session(c) for c in self.tree.children(parent)] if parent else [])
        except (OSError, PrimefsError, subprocess.CalledProcessError) as exc:  # the repo moved, a git error
            text = f"worktree: {getattr(exc, 'stderr', None) or exc}".strip()[:2000]
            s.history.append("warning", text=text)
            self.log(f"warning: {s.id}: {text}")

    def commit_session(self, s: Session, what: str) -> None:
        if self.committer is None:
            return
        paths = [f"sessions/{s.id}"]
        goal = s.meta.get("goal")
        if goal and (self.ws.root / goal).exists():
            paths.append(goal)
        mark = Mark(s.id, s.name, what, goal)
        for p in paths:
            self.committer.request(p, f"session {s.id} ({s.name}): {what}", mark)

    def report_to_parent(self, s: Session, turn: int | None) -> None:
        """A child's turn ended: its result (or error) goes to the parent's mail as `kind: result`."""
        parent = s.meta.get("parent")
        if not parent or s.id in self.tree.chain(parent):  # a cycle of parents: the result would go round
            return
        result = s.read_result() if s.meta.get("stop_reason") in ("answered", "done") else None
        text = result if result is not None else f"(no result: {s.meta.get('error') or s.meta.get('stop_reason')})"
        worktree = worktrees.summary(s.meta.get("worktree"))  # its branch and the files changed there
        self.post.deliver(parent, sender=s.id, kind="result", text=text + (f"\n\n{worktree}" if worktree else ""),
                          extra={"child": s.id, "name": s.name, "status": s.status, "turn": turn},
                          msg_id=f"result-{s.id}-{turn}" if turn is not None else None)

    def refine(self, agent: Agent, **request) -> dict:
        return run_refine(self.ws, agent, self.tree.chain(agent.session.id), self.log,
                          gate_runner=self.gate_runner, **request)

    # -- events from outside ----------------------------------------------------------------------
    def mail_arrived(self, sid: str) -> None:
        """New mail for `sid`: queue a turn unless it runs now (it reads its mail) or is stopped."""
        if self.scheduler.busy(sid):
            return
        try:
            s = self.tree.session(sid)
            if (s.dir / "session.yaml").exists() and s.reload().get("status") != "stopped" and self.post.has_new(sid):
                self.scheduler.add(sid)
        except (PrimefsError, OSError) as exc:
            self.log(f"warning: session {sid}: {exc}")

    def stop(self, sid: str) -> None:
        """Stop a session now, or at its next step if a turn runs."""
        with self.bell.cond:
            running = sid in self.scheduler.active
            if not running:
                self.scheduler.queued.discard(sid)
        if running:
            agent = self.agent(sid)
            agent.stop_requested = True  # set before the status is read: a turn ending after the read sees it
            if agent.session.reload().get("status") == "running":  # a step of its turn takes it
                agent.kernel.interrupt()
                self.bell.ring()
                return
        self._mark_stopped(self.tree.session(sid))  # between turns: its worker may be winding down

    def _mark_stopped(self, s: Session) -> None:
        if s.reload().get("status") != "stopped":
            s.set_status("stopped", stop_reason="stopped")
            self.report_to_parent(s, None)

    def refine_request(self, sid: str, request: dict) -> None:
        """`primefs refine` while this runner runs: done at the end of a running turn, else now."""
        agent = self.agent(sid)
        if self.scheduler.busy(sid):
            agent.pending_refine = request
            return
        threading.Thread(target=self.refine, args=(agent,), kwargs=request, daemon=True).start()


def _outcome_of(s: Session) -> str:
    """The outcome of a turn whose end was cut off, from the status its last step left."""
    reason = s.meta.get("stop_reason")
    if s.status in ("failed", "stopped", "done"):
        return s.status
    return reason if reason in ("max_steps", "loop") else "idle"


def _unanswered_input(agent: Agent) -> bool:
    """A message recorded after the last turn ended, with no turn since: a runner died in between."""
    for e in latest_events(agent.session.history.path):
        if e["type"] in ("turn_end", "turn_start"):
            return False
        if e["type"] == "message" and not e.get("read_by"):
            return True
    return False
