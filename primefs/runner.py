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
from pathlib import Path

from . import mail
from .agent import Agent
from .errors import PrimefsError
from .gitops import Committer
from .goals import goal_files, parse_goal
from .kernel import Kernel
from .plugins import plugin_manager, provider_for, providers
from .providers.base import ModelError, ModelReply
from .rpc import RpcServer
from .session import Session, create_session, list_sessions
from .workspace import Workspace

RESCAN_S = 5.0


class RunnerLock:
    """One runner per workspace: an OS lock, released by the kernel if the runner dies."""

    def __init__(self, ws: Workspace):
        ws.state.mkdir(exist_ok=True)
        self.path = ws.state / "runner.lock"
        self.file = open(self.path, "a+")
        try:
            fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.file.close()
            raise PrimefsError(f"a runner is already running in {ws.root} (lock {self.path} is held)") from None
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
        self.pm = plugin_manager(ws.root)
        self.providers = providers(self.pm)
        self.agents: dict[str, Agent] = {}
        self.by_token: dict[str, Agent] = {}
        self.work: set[str] = set()       # sessions with input waiting for a turn
        self.active: set[str] = set()     # sessions whose turn runs now
        self.claimed_goals: set[str] = set()
        self.reported_goals: dict[str, float] = {}
        self.cond = threading.Condition()
        self.stopping = False
        self.lock: RunnerLock | None = None
        self.rpc: RpcServer | None = None
        self.committer: Committer | None = None
        self.threads: list[threading.Thread] = []

    # -- lifecycle --------------------------------------------------------------------------------
    def run(self, once: bool = False) -> None:
        self.lock = RunnerLock(self.ws)
        observer = None
        try:
            self.committer = Committer(self.ws.root)
            self.rpc = RpcServer(self.ws.runtime / "rpc.sock", self.handle_rpc)
            self.recover()
            if not once:
                observer = self._watch()
            last_scan = 0.0
            while True:
                now = time.monotonic()
                if now - last_scan > (0 if once else RESCAN_S):
                    self.scan()
                    last_scan = now
                with self.cond:
                    self._dispatch()
                    if self.stopping or (once and not self.work and not self.active):
                        if once and not self.stopping:
                            # one last look: a turn may have produced new goals or mail
                            self.cond.release()
                            try:
                                self.scan()
                            finally:
                                self.cond.acquire()
                            if self.work:
                                continue
                        break
                    self.cond.wait(0.5 if once else 1.0)
        except KeyboardInterrupt:
            self.log("stopping: sessions that were running resume when a runner starts again")
        finally:
            self.stopping = True
            if observer is not None:
                observer.stop()
            self._shutdown()

    def stop(self) -> None:
        """Ask a running `run()` to return (from another thread)."""
        with self.cond:
            self.stopping = True
            self.cond.notify_all()

    def _shutdown(self) -> None:
        for agent in list(self.agents.values()):
            if agent.kernel is not None:
                agent.kernel.interrupt()
        for t in self.threads:
            t.join(10)
        for agent in list(self.agents.values()):
            agent.shutdown()
        if self.committer:
            self.committer.close()
            for err in self.committer.errors:
                self.log(f"warning: git commit failed: {err}")
        if self.rpc:
            self.rpc.close()
        if self.lock:
            self.lock.release()

    def _watch(self):
        from watchdog.events import FileSystemEventHandler
        from watchdog.observers import Observer

        runner = self

        class Hint(FileSystemEventHandler):
            def on_any_event(self, event):
                path = getattr(event, "dest_path", "") or event.src_path
                runner.hint(Path(os.fsdecode(path)))

        observer = Observer()
        observer.schedule(Hint(), str(self.ws.goals), recursive=False)
        observer.schedule(Hint(), str(self.ws.sessions), recursive=True)
        observer.daemon = True
        observer.start()
        return observer

    def hint(self, path: Path) -> None:
        """A watchdog event: look at that goal or mailbox now (the listing decides, not the event)."""
        try:
            rel = path.relative_to(self.ws.root).parts
        except ValueError:
            return
        if rel[:1] == ("goals",) and path.suffix == ".md" and not path.name.startswith("."):
            self.scan_goals()
        elif len(rel) >= 4 and rel[0] == "sessions" and rel[2:4] == ("mail", "new"):
            self.check_mail(rel[1])

    # -- finding work -----------------------------------------------------------------------------
    def recover(self) -> None:
        """Start-up: which goals are taken, which sessions were cut off, which mail waits."""
        for s in list_sessions(self.ws.sessions):
            try:
                meta = s.meta
            except PrimefsError as exc:
                self.log(f"warning: {exc}")
                continue
            if meta.get("goal"):
                self.claimed_goals.add(meta["goal"])
            if meta.get("status") in ("pending", "running"):
                self.work.add(s.id)
            elif mail.new_files(s.mail) or mail.unacked(s.mail):
                self.work.add(s.id)

    def scan(self) -> None:
        self.scan_goals()
        for s in list_sessions(self.ws.sessions):
            if mail.new_files(s.mail):
                self.check_mail(s.id)

    def scan_goals(self) -> None:
        with self.cond:
            for path in goal_files(self.ws):
                rel = path.relative_to(self.ws.root).as_posix()
                if rel in self.claimed_goals:
                    continue
                try:
                    goal = parse_goal(self.ws, path)
                except PrimefsError as exc:
                    mtime = path.stat().st_mtime if path.exists() else 0
                    if self.reported_goals.get(rel) != mtime:  # report each broken version once
                        self.reported_goals[rel] = mtime
                        self.log(f"goal error: {exc}")
                    continue
                session = create_session(self.ws.sessions, task=goal.task, name=goal.name, model=goal.model,
                                         goal=rel, context=goal.context,
                                         extra={"limits": goal.limits} if goal.limits else None)
                self.claimed_goals.add(rel)
                self.log(f"goal {rel} -> session {session.id} ({goal.name}, model {goal.model})")
                self.work.add(session.id)
                self.cond.notify_all()

    def check_mail(self, sid: str) -> None:
        with self.cond:
            if sid not in self.active and (self.ws.sessions / sid / "session.yaml").exists():
                s = self.agents[sid].session if sid in self.agents else Session(self.ws.sessions / sid)
                if s.reload().get("status") != "stopped" and mail.new_files(s.mail):
                    self.work.add(sid)
                    self.cond.notify_all()

    def _dispatch(self) -> None:
        """Start turns for sessions with work, up to max_concurrent_sessions at once (cond held)."""
        cap = int(self.ws.limits()["max_concurrent_sessions"])
        for sid in sorted(self.work - self.active):
            if len(self.active) >= cap or self.stopping:
                break
            self.work.discard(sid)
            self.active.add(sid)
            t = threading.Thread(target=self._session_worker, args=(sid,), name=f"session-{sid}", daemon=True)
            self.threads = [x for x in self.threads if x.is_alive()] + [t]
            t.start()

    # -- turns ------------------------------------------------------------------------------------
    def agent(self, sid: str) -> Agent:
        if sid not in self.agents:
            agent = Agent(self, Session(self.ws.sessions / sid))
            self.agents[sid] = agent
            self.by_token[agent.token] = agent
        return self.agents[sid]

    def _session_worker(self, sid: str) -> None:
        try:
            agent = self.agent(sid)
            while not self.stopping:
                if not self._begin_turn(agent):
                    break
                self._turn(agent)
        except Exception as exc:  # never let one session take the runner down
            self.log(f"error in session {sid}: {type(exc).__name__}: {exc}")
            try:
                s = Session(self.ws.sessions / sid)
                s.history.append("error", error=f"{type(exc).__name__}: {exc}")
                s.set_status("failed", error=f"{type(exc).__name__}: {exc}", stop_reason="error")
            except Exception:
                pass
        finally:
            with self.cond:
                self.active.discard(sid)
                if not self.stopping and mail.new_files(self.ws.sessions / sid / "mail"):
                    self.work.add(sid)
                self.cond.notify_all()

    def _begin_turn(self, agent: Agent) -> bool:
        """Record what starts the next turn; False if there is nothing to do."""
        s = agent.session
        status = s.reload().get("status")
        agent.ensure_conversation()
        events = s.events()
        if status == "stopped":
            return False
        if not any(e["type"] == "task" for e in events):
            agent.record("task", text=s.task)
            return True
        if status == "running":  # the previous runner stopped mid-turn
            agent.record("notice", text="The runner restarted while you were working; the last cell was "
                                        "interrupted and your kernel variables are gone (`context` is loaded "
                                        "again). Rebuild what you need and continue.")
            return True
        return self.take_mail(agent) > 0

    def _turn(self, agent: Agent) -> None:
        s = agent.session
        turn = sum(1 for e in s.events("turn_start")) + 1
        s.set_status("running", stop_reason=None)
        agent.record("turn_start", turn=turn)
        self.log(f"{s.id} ({s.name}): turn {turn} started")
        started = time.monotonic()
        outcome = agent.run_turn()
        agent.record("turn_end", turn=turn, outcome=outcome, elapsed_s=round(time.monotonic() - started, 4))
        self.log(f"{s.id} ({s.name}): turn {turn} ended: {outcome}")
        paths = [f"sessions/{s.id}"]
        goal = s.meta.get("goal")
        if goal and (self.ws.root / goal).exists():
            paths.append(goal)
        for p in paths:
            self.committer.request(p, f"session {s.id} ({s.name}): turn {turn} {outcome}")

    def take_mail(self, agent: Agent) -> int:
        """Claim the session's new (and crash-orphaned) mail and show it to the model. Returns how many."""
        s = agent.session
        seen = {e.get("id") for e in s.events("message")}
        count = 0
        for path in mail.unacked(s.mail) + mail.new_files(s.mail):
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
            if msg.id not in seen:  # a message never starts two turns
                agent.record("message", id=msg.id, **{"from": msg.sender}, kind=msg.kind, text=msg.text)
                seen.add(msg.id)
                count += 1
            mail.ack(claimed)
        return count

    # -- kernels and model calls ------------------------------------------------------------------
    def new_kernel(self, agent: Agent) -> Kernel:
        kernel = Kernel(self.ws.runtime / "kernels", agent.session.id, self.ws.root)
        ctx = list(agent.session.meta.get("context") or [])
        kernel.bootstrap = (
            "import primefs.kernel_api as _primefs\n"
            f"_primefs.setup(get_ipython().user_ns, {str(self.rpc.path)!r}, {agent.token!r}, "
            f"{agent.session.id!r}, {ctx!r})\n"
            "del _primefs")
        kernel.start()
        return kernel

    def complete(self, agent: Agent, messages: list[dict], tools, *, purpose: str,
                 settings: dict | None = None) -> ModelReply:
        """One model call with bounded retries; every attempt's outcome is recorded where it happened."""
        settings = dict(settings or agent.settings)
        settings["workspace"] = str(self.ws.root)
        provider = provider_for(self.providers, settings["model"])
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
            return reply
        raise AssertionError("unreachable")

    # -- requests from kernels --------------------------------------------------------------------
    def handle_rpc(self, token: str, op: str, args: dict):
        agent = self.by_token.get(token)
        if agent is None:
            raise PermissionError("unknown kernel token")
        if op == "done":
            agent.done_answer = str(args.get("answer", ""))
            return True
        if op == "llm":
            model = args.get("model")
            settings = self.ws.resolve_model(model) if model else agent.settings
            reply = self.complete(agent, [{"role": "user", "content": str(args.get("prompt", ""))}], None,
                                  purpose="llm", settings=settings)
            return reply.text
        raise ValueError(f"unknown request {op!r}")
