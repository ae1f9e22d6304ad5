"""The runner: picks up goals, delivers mail, runs turns, makes every model call, commits.

Files are the truth: on start and periodically the runner lists goals/ and every mail/new/;
watchdog events only make it look sooner. One runner per workspace (an fcntl lock).
"""
from __future__ import annotations

import fcntl
import os
import sys
import threading
import time
from collections import OrderedDict
from pathlib import Path

from . import mail
from .agent import Agent
from .errors import PrimefsError
from .conversation import fenced_code
from .gitops import Committer
from .goalctl import GoalControl
from .goals import goal_files, parse_goal
from .kernel import Kernel
from .kernelpool import KernelPool, shutdown_all
from .plugins import end_conditions, plugin_manager, provider_for, providers
from .providers.base import ModelError, ModelReply
from .rpc import RpcServer
from .services import FINISHED, KernelServices
from .fsutil import write_atomic
from .session import Session, create_session, list_sessions, subtree
from .workspace import Workspace

RESCAN_S = 5.0
STATE_S = 2.0  # how often .primefs/runner.json is refreshed
STOP_FILE = "stop.request"  # written by `primefs stop`; the runner applies and removes it
REFINE_FILE = "refine.request"  # written by `primefs refine` while a runner runs


def hide_from_same_user() -> None:
    """Make this process non-dumpable (Linux): other processes of the same user, the kernels among
    them, can then no longer read its /proc/<pid>/environ (API keys) or attach to it. No effect for root."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except Exception:  # not Linux, or no prctl: nothing to do
        pass


def broken_goal_line(path: Path) -> str | None:
    """The `goal:` of a session.yaml too broken to parse, read as a plain line."""
    try:
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("goal: ") and line[6:].strip() not in ("", "null"):
                return line[6:].strip().strip("'\"")
    except OSError:
        pass
    return None


class RunnerLock:
    """One runner per workspace: an OS lock, released by the kernel if the runner dies."""

    def __init__(self, ws: Workspace):
        ws.state.mkdir(exist_ok=True)
        self.path = ws.state / "runner.lock"
        self.file = open(self.path, "a+")
        for attempt in range(5):  # `primefs agents`/`runner` probe the lock for an instant: retry briefly
            try:
                fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if attempt == 4:
                    self.file.close()
                    raise PrimefsError(f"a runner is already running in {ws.root} (lock {self.path} is held)") \
                        from None
                time.sleep(0.05)
        self.file.truncate(0)
        self.file.write(f"{os.getpid()} {time.time()}\n")
        self.file.flush()

    def release(self) -> None:
        fcntl.flock(self.file, fcntl.LOCK_UN)
        self.file.close()


class Runner:
    def __init__(self, ws: Workspace, log=None):
        self.ws = ws
        self.log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.limits = ws.limits()
        self.pm = plugin_manager(ws.root)
        self.providers = providers(self.pm)
        self.services = KernelServices(self)
        self.goals = GoalControl(self, end_conditions(self.pm))
        self.agents: dict[str, Agent] = {}
        self.sessions: dict[str, Session] = {}  # one object per session: one history writer, one meta cache
        self.by_token: dict[str, Agent] = {}
        self.parents: dict[str, str | None] = {}     # the family tree, from session.yaml `parent`
        self.children: dict[str, list[str]] = {}
        self.work: set[str] = set()       # sessions with input waiting for a turn
        self.active: set[str] = set()     # sessions whose turn runs now
        self.waiting: set[str] = set()    # active sessions blocked in wait(): their slot is free
        self.idle_kernels: OrderedDict[str, None] = OrderedDict()  # idle sessions holding a kernel, oldest first
        self.result_mail: dict[str, dict[str, list[mail.Message]]] = {}  # parent -> child -> result mail sent
        self.claimed_goals: set[str] = set()
        self.harness_dirty = True  # hand edits of harness files may wait to be committed
        self.heartbeat_sessions: set[str] = set()  # sessions with heartbeat files
        self.reported_goals: dict[str, float] = {}
        self.cond = threading.Condition()
        self.stopping = False
        self.lock: RunnerLock | None = None
        self.rpc: RpcServer | None = None
        self.pool: KernelPool | None = None
        self.committer: Committer | None = None
        self.threads: list[threading.Thread] = []

    # -- lifecycle --------------------------------------------------------------------------------
    def run(self, once: bool = False) -> None:
        self.lock = RunnerLock(self.ws)
        hide_from_same_user()
        self.started_at = time.time()
        observer = None
        self._handle_sigterm()
        try:
            self.committer = Committer(self.ws.root)
            self.rpc = RpcServer(self.ws.runtime / "rpc.sock", self.services.handle)
            self.pool = KernelPool(self.ws.runtime / "kernels", self.ws.root, int(self.limits["kernel_pool"]),
                                   reuse=bool(self.limits["reuse_kernels"]))
            self.recover()
            self.tick_heartbeats()  # ticks missed while no runner ran: one coalesced message each
            self.scan()
            if not once:
                observer = self._watch()
            last_scan = last_state = last_tick = time.monotonic()
            self.write_state()
            while True:
                if time.monotonic() - last_scan > RESCAN_S:
                    self.scan()  # watchdog events are hints; the listing is the truth
                    last_scan = time.monotonic()
                if time.monotonic() - last_state > STATE_S:
                    self.write_state()
                    last_state = time.monotonic()
                if not once and time.monotonic() - last_tick >= 0.25:  # the loop wakes often: rate-limit
                    self.tick_heartbeats()
                    last_tick = time.monotonic()
                with self.cond:
                    self._dispatch()
                    done = once and not self.work and not self.active
                    if self.stopping:
                        break
                    if not done:
                        self.cond.wait(1.0)
                        continue
                self.scan()  # one last look: files may have come from outside meanwhile
                with self.cond:
                    if not self.work and not self.active:
                        break
        except KeyboardInterrupt:
            self.log("stopping: sessions that were running resume when a runner starts again")
        finally:
            self.stopping = True
            if observer is not None:
                observer.stop()
            self._shutdown()

    def _handle_sigterm(self) -> None:
        """`primefs down` sends SIGTERM: stop like Ctrl-C (sessions left resumable)."""
        import signal

        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda *_: self.stop())

    def write_state(self) -> None:
        """.primefs/runner.json: what `primefs runner` shows (pid, since, kernels, memory)."""
        import json

        with self.cond:
            kernels = sum(1 for a in self.agents.values() if a.kernel is not None) + (
                self.pool.ready_count() if self.pool else 0)
            state = {"pid": os.getpid(), "started": self.started_at, "updated": time.time(),
                     "active_sessions": sorted(self.active), "waiting_sessions": sorted(self.waiting),
                     "queued_sessions": sorted(self.work), "live_kernels": kernels,
                     "kernel_pids": self._kernel_pids()}
        try:
            write_atomic(self.ws.state / "runner.json", json.dumps(state, indent=1), durable=False)
        except OSError:
            pass

    def _kernel_pids(self) -> list[int]:
        pids = []
        for a in self.agents.values():
            km = a.kernel.km if a.kernel is not None else None
            prov = getattr(km, "provisioner", None) if km is not None else None
            pid = getattr(getattr(prov, "process", None), "pid", None)
            if pid:
                pids.append(pid)
        return pids

    def stop(self) -> None:
        """Ask a running `run()` to return (from another thread)."""
        with self.cond:
            self.stopping = True
            self.cond.notify_all()

    def _shutdown(self) -> None:
        with self.cond:
            self.cond.notify_all()  # release waiters in wait()/recv()
        for agent in list(self.agents.values()):
            kernel = agent.kernel
            if kernel is not None:
                try:
                    kernel.interrupt()
                except Exception:  # already gone
                    pass
        for t in self.threads:
            t.join(10)
        shutdown_all([k for k in (a.release_kernel() for a in list(self.agents.values())) if k is not None])
        if self.pool:
            self.pool.close()
        self.harness_dirty = True
        self.commit_hand_edits()
        if self.committer:
            self.committer.close()
            for err in self.committer.errors:
                self.log(f"warning: git commit failed: {err}")
        if self.rpc:
            self.rpc.close()
        try:
            (self.ws.state / "runner.json").unlink()
        except (FileNotFoundError, AttributeError):
            pass
        if self.lock:
            self.lock.release()

    def _watch(self):
        import warnings

        from watchdog.events import FileSystemEventHandler
        from watchdog.observers import Observer

        # watchdog warns when a new folder's watch is added twice (harmless: events are hints)
        warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"watchdog\..*")

        runner = self

        class Hint(FileSystemEventHandler):
            def on_any_event(self, event):
                path = getattr(event, "dest_path", "") or event.src_path
                runner.hint(Path(os.fsdecode(path)))

        observer = Observer()
        observer.schedule(Hint(), str(self.ws.goals), recursive=False)
        observer.schedule(Hint(), str(self.ws.harness), recursive=True)
        observer.schedule(Hint(), str(self.ws.sessions), recursive=True)
        observer.daemon = True
        observer.start()
        return observer

    def hint(self, path: Path) -> None:
        """A watchdog event: look at that goal, mailbox or stop request now (the listing decides)."""
        try:
            rel = path.relative_to(self.ws.root).parts
        except ValueError:
            return
        if rel[:1] == ("goals",) and path.suffix == ".md" and not path.name.startswith("."):
            self.scan_goals()
        elif len(rel) >= 4 and rel[0] == "sessions" and rel[2:4] == ("mail", "new"):
            self.check_mail(rel[1])
        elif len(rel) == 3 and rel[0] == "sessions" and rel[2] == STOP_FILE:
            self.apply_stop(rel[1])
        elif len(rel) == 3 and rel[0] == "sessions" and rel[2] == REFINE_FILE:
            self.apply_refine_request(rel[1])
        elif len(rel) >= 3 and rel[0] == "sessions" and rel[2] == "heartbeats":
            self.heartbeat_sessions.add(rel[1])
        elif rel[:1] == ("harness",) or (len(rel) > 2 and rel[0] == "sessions" and rel[2] == "harness"):
            self.harness_dirty = True

    # -- finding work -----------------------------------------------------------------------------
    def load_tree(self) -> None:
        """The family tree from every session.yaml (for budgets, harness lookups, refine)."""
        for s in list_sessions(self.ws.sessions):
            try:
                self._link(s.id, s.meta.get("parent"))
            except PrimefsError:
                pass

    def recover(self) -> None:
        """Start-up: the family tree, which goals are taken, which sessions were cut off, which mail waits."""
        for s in list_sessions(self.ws.sessions):
            try:
                meta = s.meta
            except (PrimefsError, OSError) as exc:
                self.log(f"warning: session {s.id} skipped: {exc}")
                goal = broken_goal_line(s.dir / "session.yaml")
                if goal:  # its goal stays taken: never start a goal twice
                    self.claimed_goals.add(goal)
                continue
            self._link(s.id, meta.get("parent"))
            if meta.get("goal"):
                self.claimed_goals.add(meta["goal"])
            if meta.get("status") in ("pending", "running") or mail.unacked(s.mail):
                self.work.add(s.id)
            if (s.dir / "heartbeats").is_dir():
                self.heartbeat_sessions.add(s.id)

    def _link(self, sid: str, parent: str | None) -> None:
        self.parents[sid] = parent
        self.children.setdefault(sid, [])
        if parent:
            self.children.setdefault(parent, []).append(sid)

    def scan(self) -> None:
        self.scan_goals()
        for s in list_sessions(self.ws.sessions):
            try:
                if (s.dir / STOP_FILE).exists():
                    self.apply_stop(s.id)
                    continue
                if (s.dir / REFINE_FILE).exists():
                    self.apply_refine_request(s.id)
                if mail.new_files(s.mail):
                    self.check_mail(s.id)
            except (PrimefsError, OSError) as exc:  # one broken session never stops the others
                self.log(f"warning: session {s.id}: {exc}")

    def scan_goals(self) -> None:
        with self.cond:
            for path in goal_files(self.ws):
                rel = path.relative_to(self.ws.root).as_posix()
                if rel in self.claimed_goals:
                    continue
                try:
                    goal = parse_goal(self.ws, path, self.goals.conditions)
                except PrimefsError as exc:
                    mtime = path.stat().st_mtime if path.exists() else 0
                    if self.reported_goals.get(rel) != mtime:  # report each broken version once
                        self.reported_goals[rel] = mtime
                        self.log(f"goal error: {exc}")
                    continue
                extra = dict(goal.control)
                if goal.limits:
                    extra["limits"] = goal.limits
                try:
                    session = create_session(self.ws.sessions, task=goal.task, name=goal.name, model=goal.model,
                                             goal=rel, context=goal.context, extra=extra)
                except (OSError, ValueError) as exc:
                    self.reported_goals[rel] = path.stat().st_mtime
                    self.log(f"goal error: {rel}: cannot start a session: {exc}")
                    continue
                self.claimed_goals.add(rel)
                self.log(f"goal {rel} -> session {session.id} ({goal.name}, model {goal.model})")
                if goal.control.get("heartbeat"):
                    self.add_heartbeat(session, goal.control["heartbeat"])
                self.adopt(session)

    def adopt(self, session: Session) -> None:
        """A new session (from a goal or rlm()): link it into the tree and queue its first turn."""
        with self.cond:
            self._link(session.id, session.meta.get("parent"))
            self.work.add(session.id)
            self.cond.notify_all()

    def check_mail(self, sid: str) -> None:
        with self.cond:
            try:
                if sid not in self.active and (self.ws.sessions / sid / "session.yaml").exists():
                    s = self.session(sid)
                    if s.reload().get("status") != "stopped" and mail.new_files(s.mail):
                        self.work.add(sid)
            except (PrimefsError, OSError) as exc:
                self.log(f"warning: session {sid}: {exc}")
            self.cond.notify_all()  # also wakes recv() waiting in this session

    def _dispatch(self) -> None:
        """Start turns for sessions with work, up to max_concurrent_sessions at once (cond held).

        Sessions blocked in wait() do not count: a parent waiting for its children must not
        hold the slot its children need.
        """
        cap = int(self.limits["max_concurrent_sessions"])
        for sid in sorted(self.work - self.active):
            if len(self.active - self.waiting) >= cap or self.stopping:
                break
            self.work.discard(sid)
            self.active.add(sid)
            self.idle_kernels.pop(sid, None)
            t = threading.Thread(target=self._session_worker, args=(sid,), name=f"session-{sid}", daemon=True)
            self.threads = [x for x in self.threads if x.is_alive()] + [t]
            t.start()

    # -- turns ------------------------------------------------------------------------------------
    def chain(self, sid: str) -> list[str]:
        """The session and its ancestors, nearest first (what its harness lookups see)."""
        out = []
        with self.cond:
            while sid and sid not in out:
                out.append(sid)
                sid = self.parents.get(sid)
        return out

    def session(self, sid: str) -> Session:
        with self.cond:
            if sid not in self.sessions:
                self.sessions[sid] = Session(self.ws.sessions / sid)
            return self.sessions[sid]

    def agent(self, sid: str) -> Agent:
        with self.cond:
            if sid not in self.agents:
                agent = Agent(self, self.session(sid))
                self.agents[sid] = agent
                self.by_token[agent.token] = agent
            return self.agents[sid]

    def _session_worker(self, sid: str) -> None:
        agent = None
        try:
            agent = self.agent(sid)
            while not self.stopping:
                if not self._begin_turn(agent):
                    break
                self._turn(agent)
        except Exception as exc:  # never let one session take the runner down
            self.log(f"error in session {sid}: {type(exc).__name__}: {exc}")
            if self.stopping:  # torn down under it: resumable, not failed
                return
            try:
                s = self.session(sid)
                s.history.append("error", error=f"{type(exc).__name__}: {exc}")
                s.set_status("failed", error=f"{type(exc).__name__}: {exc}", stop_reason="error")
                self._report_to_parent(s, None)
            except Exception:
                pass
        finally:
            if agent is not None and not self.stopping:
                self._park_kernel(agent)
            with self.cond:
                self.active.discard(sid)
                if not self.stopping and mail.new_files(self.ws.sessions / sid / "mail") \
                        and self.session(sid).status != "stopped":
                    self.work.add(sid)
                self.cond.notify_all()

    def _begin_turn(self, agent: Agent) -> bool:
        """Record what starts the next turn; False if there is nothing to do."""
        s = agent.session
        status = s.reload().get("status")
        agent.ensure_conversation()
        if status == "stopped" or agent.stop_requested:
            return False
        if agent.turns == 0 and not s.events("task"):
            agent.record("task", text=s.task)
            return True
        if status == "running":  # the previous runner stopped mid-turn
            self._close_interrupted_cells(agent)
            agent.restart_told = True
            agent.record("notice", text="The runner restarted while you were working; the last cell was "
                                        "interrupted and your kernel variables are gone (`context` is loaded "
                                        "again). Rebuild what you need and continue.")
            return True
        if status == "pending":  # its task is recorded but its first turn never started
            return True
        if agent.pending_notice:  # an autonomous goal goes on
            agent.record("notice", text=agent.pending_notice)
            agent.pending_notice = None
            return True
        return self.take_mail(agent) > 0 or self._unanswered_input(agent)

    @staticmethod
    def _unanswered_input(agent: Agent) -> bool:
        """A message recorded after the last turn ended, with no turn since: a runner died in between."""
        for e in reversed(agent.session.events()):
            if e["type"] in ("turn_end", "turn_start"):
                return False
            if e["type"] == "message" and not e.get("read_by"):
                return True
        return False

    def _close_interrupted_cells(self, agent: Agent) -> None:
        """Code the model asked for that never reported back (the runner died mid-cell) gets an
        answer, so the conversation stays well-formed (every tool call answered)."""
        events = agent.session.events()
        last = max((i for i, e in enumerate(events) if e["type"] == "assistant"), default=None)
        if last is None:
            return
        done_ids = {e.get("call_id") for e in events[last + 1:] if e["type"] == "cell"}
        text = "[interrupted: the runner restarted during this cell; kernel variables are gone]"
        calls = events[last].get("calls") or []
        if calls:
            for c in calls:
                if c["id"] not in done_ids:
                    agent.record("cell", call_id=c["id"], code=None, error="interrupted by a runner restart",
                                 shown=text)
        elif not any(e["type"] == "cell" for e in events[last + 1:]) and \
                fenced_code(events[last].get("text") or ""):
            agent.record("cell", call_id=None, code=None, error="interrupted by a runner restart", shown=text)

    def _turn(self, agent: Agent) -> None:
        s = agent.session
        agent.turns += 1
        turn = agent.turns
        if not s.meta.get("started_ts"):
            s.update(started_ts=time.time())  # the seconds budget counts from here
        s.set_status("running", stop_reason=None)
        agent.record("turn_start", turn=turn)
        self.log(f"{s.id} ({s.name}): turn {turn} started")
        started = time.monotonic()
        outcome = agent.run_turn()
        if outcome == "interrupted":
            agent.record("turn_end", turn=turn, outcome=outcome, elapsed_s=round(time.monotonic() - started, 4),
                         status="running", stop_reason=None)
            self.committer.request(f"sessions/{s.id}", f"session {s.id} ({s.name}): turn {turn} interrupted")
            return
        if agent.pending_refine:
            request, agent.pending_refine = agent.pending_refine, None
            self.perform_refine(agent, **request)
        agent.pending_notice = self.goals.after_turn(agent, outcome)
        agent.record("turn_end", turn=turn, outcome=outcome, elapsed_s=round(time.monotonic() - started, 4),
                     status=s.status, stop_reason=s.meta.get("stop_reason"))
        self.log(f"{s.id} ({s.name}): turn {turn} ended: {outcome}")
        self._report_to_parent(s, turn)
        self.commit_hand_edits()
        paths = [f"sessions/{s.id}"]
        goal = s.meta.get("goal")
        if goal and (self.ws.root / goal).exists():
            paths.append(goal)
        for p in paths:
            self.committer.request(p, f"session {s.id} ({s.name}): turn {turn} {outcome}")

    def perform_refine(self, agent: Agent, instructions: str | None = None, scope: str = "global",
                       model: str | None = None) -> dict:
        """One refinement of the harness from this session (see refine.py); recorded in its history."""
        from .refine import refine

        settings = self.ws.resolve_model(model) if model else None
        try:
            result = refine(self.ws, agent.session, chain=self.chain(agent.session.id), instructions=instructions,
                            scope=scope, max_events=int(agent.limits["refine_events"]),
                            complete=lambda msgs: self.complete(agent, msgs, None, purpose="refine", settings=settings))
        except Exception as exc:  # a failed refinement must not fail the session
            result = {"applied": [], "rejected": [], "error": f"{type(exc).__name__}: {exc}"}
        agent.record("refine", instructions=instructions, scope=scope, **result)
        self.log(f"{agent.session.id}: refine: {len(result['applied'])} applied, {len(result['rejected'])} rejected"
                 + (f", error: {result['error']}" if result.get("error") else ""))
        return result

    def commit_hand_edits(self) -> None:
        """Harness files a person edited are committed as `Primefs-Source: user` at turn boundaries."""
        with self.cond:
            dirty, self.harness_dirty = self.harness_dirty, False
        if dirty:
            from .harness import commit_user_edits

            try:
                commit_user_edits(self.ws)
            except Exception as exc:
                self.log(f"warning: could not commit hand edits of the harness: {exc}")

    def apply_refine_request(self, sid: str) -> None:
        """`primefs refine` while this runner runs: it leaves a request file; the runner does the work."""
        import json

        path = self.ws.sessions / sid / REFINE_FILE
        try:
            request = json.loads(path.read_text())
            path.unlink()
        except (OSError, ValueError):
            return
        agent = self.agent(sid)
        with self.cond:
            if sid in self.active:
                agent.pending_refine = request
                return
        threading.Thread(target=self.perform_refine, args=(agent,), kwargs=request, daemon=True).start()

    def _report_to_parent(self, s: Session, turn: int | None) -> None:
        """A child's turn ended: its result (or error) goes to the parent's mail as `kind: result`."""
        parent = s.meta.get("parent")
        if not parent:
            return
        result = s.read_result() if s.meta.get("stop_reason") in ("answered", "done") else None
        text = result if result is not None else f"(no result: {s.meta.get('error') or s.meta.get('stop_reason')})"
        msg = self.deliver(parent, sender=s.id, kind="result", text=text,
                           extra={"child": s.id, "name": s.name, "status": s.status, "turn": turn})
        with self.cond:
            self.result_mail.setdefault(parent, {}).setdefault(s.id, []).append(msg)

    def _park_kernel(self, agent: Agent) -> None:
        """Keep an idle session's kernel for its next turn, within limits.max_idle_kernels (oldest go first)."""
        if agent.kernel is None:
            return
        if agent.session.status == "stopped":
            self.pool.give_back(agent.release_kernel())
            return
        with self.cond:
            self.idle_kernels[agent.session.id] = None
            self.idle_kernels.move_to_end(agent.session.id)
            evict = []
            while len(self.idle_kernels) > int(self.limits["max_idle_kernels"]):
                sid, _ = self.idle_kernels.popitem(last=False)
                evict.append(self.agents[sid].release_kernel())  # under the lock: it cannot start a turn now
        self.pool.notify()  # a session waiting for a kernel may reuse this one
        for kernel in evict:
            if kernel is not None:
                self.pool.give_back(kernel)

    # -- mail -------------------------------------------------------------------------------------
    def deliver(self, sid: str, *, sender: str, kind: str, text: str, extra: dict | None = None) -> mail.Message:
        msg = mail.deliver(self.ws.sessions / sid / "mail", sender=sender, to=sid, kind=kind, text=text, extra=extra)
        self.check_mail(sid)
        return msg

    def _claim_all(self, agent: Agent, limit: int | None = None) -> list[tuple[mail.Message, Path]]:
        """Claim the session's unread mail (new, and claimed-but-unacknowledged after a crash).

        Bad files go to mail/bad/. A message already in history is only acknowledged again: a
        message never starts two turns.
        """
        s = agent.session
        out = []
        for path in mail.unacked(s.mail) + mail.new_files(s.mail):
            if limit is not None and len(out) >= limit:
                break
            claimed = path if path.parent.name == "cur" else mail.claim(path)
            if claimed is None:
                continue
            try:
                msg = mail.parse(claimed, to=s.id)
            except mail.BadMessage as exc:
                mail.quarantine(claimed, str(exc))
                agent.record("bad_mail", file=claimed.name, error=str(exc))
                self.log(f"warning: {s.id}: bad message moved to mail/bad/: {exc}")
                continue
            if msg.id in agent.seen_ids:
                mail.ack(claimed)
                continue
            out.append((msg, claimed))
        return out

    def _record_message(self, agent: Agent, msg: mail.Message, claimed: Path, read_by: str | None) -> None:
        fields = {"read_by": read_by} if read_by else {}
        agent.record("message", id=msg.id, **{"from": msg.sender}, kind=msg.kind, text=msg.text, **fields)
        mail.ack(claimed)

    def take_mail(self, agent: Agent) -> int:
        """Show the session's unread mail to the model (as user messages). Returns how many."""
        with agent.mail_lock:
            got = self._claim_all(agent)
            for msg, claimed in got:
                self._record_message(agent, msg, claimed, None)
        return len(got)

    def read_mail(self, agent: Agent, limit: int | None = None, cell: int | None = None) -> list[mail.Message]:
        """inbox()/recv(): unread messages handed to code; recorded, not shown as prompts."""
        with agent.mail_lock:
            self._check_cell(agent, cell)
            got = self._claim_all(agent, limit=limit)
            for msg, claimed in got:
                self._record_message(agent, msg, claimed, "code")
        return [m for m, _ in got]

    def consume_results(self, agent: Agent, child: str, cell: int | None = None) -> None:
        """wait() returned a child's result: its `kind: result` mail is read, not a reason for a new turn.

        The runner knows which files it delivered, so no mailbox scan is needed; mail already
        claimed (shown to the model before its next call) is left alone."""
        with agent.mail_lock:
            self._check_cell(agent, cell)
            with self.cond:
                sent = self.result_mail.get(agent.session.id, {}).pop(child, [])
            for msg in sent:
                claimed = mail.claim(msg.path)
                if claimed is not None and msg.id not in agent.seen_ids:
                    self._record_message(agent, msg, claimed, "wait")

    def wait_mail(self, sid: str, timeout: float) -> None:
        with self.cond:
            if not self.stopping:
                self.cond.wait(timeout)

    def resolve_targets(self, sender: Session, to: str) -> list[str]:
        sid = sender.id
        with self.cond:
            if to == "parent":
                if not self.parents.get(sid):
                    raise LookupError("this session has no parent")
                return [self.parents[sid]]
            if to == "children":
                kids = list(self.children.get(sid, []))
                if not kids:
                    raise LookupError("this session has no children")
                return kids
            if to == "all":
                root = sid
                while self.parents.get(root):
                    root = self.parents[root]
                return [x for x in subtree(self.children, root) if x != sid]
            named = [c for c in self.children.get(sid, []) if self.session(c).name == to]
            if named:
                return named[-1:]
            if to in self.parents:
                return [to]
        raise LookupError(f"unknown recipient {to!r}: use a session id, a child's name, "
                          "'parent', 'children' or 'all'")

    def cell_ended(self, agent: Agent) -> None:
        with self.cond:
            agent.cell_seq += 1
            self.cond.notify_all()  # requests still waiting for that cell give up

    @staticmethod
    def _check_cell(agent: Agent, cell: int | None) -> None:
        if cell is not None and agent.cell_seq != cell:
            raise RuntimeError("the cell that asked has ended (interrupted); this request is void")

    def wait_idle(self, agent: Agent, child: str, timeout: float | None, cell: int | None = None) -> bool:
        """Block until the child has no turn running or queued and no unread mail. Frees the caller's slot."""
        deadline = None if timeout is None else time.monotonic() + timeout
        me = agent.session.id
        with self.cond:
            self.waiting.add(me)
            self.cond.notify_all()
            try:
                while True:
                    self._check_cell(agent, cell)
                    if self._settled(child):
                        return True
                    if self.stopping or agent.stop_requested:
                        raise RuntimeError("wait() interrupted: the session or the runner is stopping")
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return False
                    self.cond.wait(1.0 if left is None else min(1.0, left))
            finally:
                self.waiting.discard(me)

    def _settled(self, sid: str) -> bool:
        if sid in self.active or sid in self.work:
            return False
        s = self.session(sid)
        status = s.reload().get("status")
        if status == "stopped":
            return True
        return status in FINISHED and not mail.new_files(s.mail)

    # -- stopping sessions ------------------------------------------------------------------------
    def add_heartbeat(self, session: Session, spec) -> dict:
        """A goal's `heartbeat:` ('every 10m', or {every|cron: ..., prompt: ...}) or kernel heartbeat()."""
        from . import heartbeat

        hb = heartbeat.add(session.dir, *heartbeat.from_spec(spec))
        with self.cond:
            self.heartbeat_sessions.add(session.id)
        return hb

    def tick_heartbeats(self) -> None:
        from . import heartbeat

        for sid in list(self.heartbeat_sessions):
            s = self.session(sid)
            try:
                if s.reload().get("status") == "stopped":
                    continue
                for hb, ticks in heartbeat.claim_due(s.dir):
                    self.deliver(sid, sender="heartbeat", kind="heartbeat", text=heartbeat.message_text(hb, ticks),
                                 extra={"heartbeat": hb["id"], "ticks": ticks})
            except (OSError, PrimefsError) as exc:
                self.log(f"warning: heartbeats of {sid}: {exc}")

    def apply_stop(self, sid: str) -> None:
        """A stop request file (from `primefs stop`): stop the session now, or at its next step."""
        flag = self.ws.sessions / sid / STOP_FILE
        with self.cond:
            s = self.session(sid)
            if sid in self.active:
                agent = self.agents[sid]
                agent.stop_requested = True
                if agent.kernel is not None:
                    agent.kernel.interrupt()
            else:
                self.work.discard(sid)
                if s.reload().get("status") != "stopped":
                    s.set_status("stopped", stop_reason="stopped")
                    self._report_to_parent(s, None)
            try:
                flag.unlink()
            except FileNotFoundError:
                pass
            self.cond.notify_all()

    # -- kernels and model calls ------------------------------------------------------------------
    def kernel_for(self, agent: Agent) -> Kernel:
        meta = agent.session.meta
        ctx = list(meta.get("context") or [])
        skill_dirs = [str(self.ws.sessions / s / "harness" / "skills") for s in self.chain(agent.session.id)]
        skill_dirs.append(str(self.ws.harness / "skills"))
        bootstrap = (
            "import primefs.kernel_api as _primefs\n"
            f"_primefs.setup(get_ipython().user_ns, {str(self.rpc.path)!r}, {agent.token!r}, "
            f"{agent.session.id!r}, {ctx!r}, {meta.get('context_data')!r}, {skill_dirs!r})\n"
            "del _primefs")
        kernel, agent.kernel_via = self.pool.take(bootstrap, reclaim=self._reclaim_idle_kernel)
        return kernel

    def _reclaim_idle_kernel(self) -> Kernel | None:
        """With no spare kernel ready, reuse the kernel of the longest-idle session (reset first)
        rather than start one more: starts cost ~0.35 CPU-s each. That session gets a fresh
        kernel, and is told so, if it ever takes another turn."""
        while self.pool.reuse:
            with self.cond:
                if not self.idle_kernels:
                    return None
                sid, _ = self.idle_kernels.popitem(last=False)
                kernel = self.agents[sid].release_kernel()
            if kernel is not None and self.pool.reset(kernel):
                return kernel
            if kernel is not None:
                kernel.shutdown()

    def complete(self, agent: Agent, messages: list[dict], tools, *, purpose: str,
                 settings: dict | None = None) -> ModelReply:
        """One model call with bounded retries; every attempt's outcome is recorded where it happened."""
        self.goals.before_model_call(agent)  # raises BudgetExhausted
        settings = dict(settings or agent.settings)
        settings["workspace"] = str(self.ws.root)
        provider = provider_for(self.providers, settings["model"], settings.get("provider"))
        retries = int(agent.limits["model_retries"])
        backoff = float(agent.limits["model_retry_backoff_s"])
        for attempt in range(retries + 1):
            started = time.monotonic()
            try:
                reply = provider.complete(messages, tools, settings)
            except ModelError as exc:
                last = attempt == retries or not exc.retryable
                wait = 0 if last else backoff * (2 ** attempt)
                agent.session.history.append("model_error", model=settings["model"], purpose=purpose,
                                             attempt=attempt + 1, error=str(exc), retry_in_s=wait)
                if last:
                    raise
                self.log(f"{agent.session.id}: model error (attempt {attempt + 1}), retrying in {wait:g} s: {exc}")
                time.sleep(wait)
                continue
            agent.session.history.append(
                "model_call", model=settings["model"], purpose=purpose, input_tokens=reply.input_tokens,
                output_tokens=reply.output_tokens, cost_usd=reply.cost_usd, cost_known=reply.cost_known,
                latency_s=round(time.monotonic() - started, 4))
            self.goals.record_call(agent.session.id, reply.input_tokens + reply.output_tokens, reply.cost_usd)
            return reply
        raise AssertionError("unreachable")
