"""The runner: builds the parts, wires them together and runs the main loop.

The parts (see docs/architecture.md): the session tree, the post office, the scheduler, the model
gateway, the kernel host, intake (goal files, heartbeats, hand edits), turns, the kernel services.
Files are the truth: on start and periodically the runner lists goals/ and looks at the sessions
that are awake (alive.py: dormant, finished sessions cost a stat now and then); file events only make
it look sooner. One runner per workspace (an fcntl lock).
"""
from __future__ import annotations

import fcntl
import os
import resource
import signal
import sys
import threading
import time
from collections import OrderedDict
from pathlib import Path

from primefs.errors import PrimefsError
from primefs.kernels import boxes
from primefs.kernels.forkserver import hide_from_same_user
from primefs.kernels.host import make_host
from primefs.plugins import end_conditions, plugin_manager, providers
from primefs.runner import warmup
from primefs.runner.agent import Agent
from primefs.runner.alive import Alive
from primefs.runner.approvals import Approvals
from primefs.runner.archiving import Archiving
from primefs.runner.bell import Bell
from primefs.runner.gateway import ModelGateway
from primefs.runner.goalctl import GoalControl
from primefs.runner.hooks import Hooks
from primefs.runner.intake import Intake
from primefs.runner.liverequests import LiveRequests
from primefs.runner.postoffice import PostOffice
from primefs.runner.scheduler import Scheduler
from primefs.runner.services import KernelServices
from primefs.runner.toolbox import ToolBox
from primefs.runner.tree import SessionTree
from primefs.runner.turns import Turns
from primefs.runner.watcher import meaning, watch
from primefs.store import redact
from primefs.store.control import STOP_FILE, lock_path, state_path, take_refine_request, write_state
from primefs.store.fsutil import NAME_RE
from primefs.store.gitops import Committer, commit_cut_off
from primefs.store.session import Session
from primefs.store.settings import check_sandbox
from primefs.store.workspace import Workspace
from primefs.views.console import ONE_LINE

RESCAN_S = 5.0
STATE_S = 2.0  # how often .primefs/runner.json is refreshed


def raise_fd_limit() -> None:
    """Each live kernel costs the runner a few descriptors: use the hard limit, not the soft 1024."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError):
        pass


class RunnerLock:
    """One runner per workspace: an OS lock, released by the kernel if the runner dies."""

    def __init__(self, ws: Workspace):
        ws.state.mkdir(exist_ok=True)
        self.path = lock_path(ws)
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


class OnceLog:
    """The runner's log. A warning or error said once is not said again (a bad file is reported once,
    not at every rescan); other lines pass. Remembers the last 10,000 such messages. Known secrets are
    redacted (a provider's error may carry a key: `primefs up` keeps the log in .primefs/runner.log)."""

    def __init__(self, log):
        self.out = log
        self.said: OrderedDict[str, None] = OrderedDict()
        self.lock = threading.Lock()

    def __call__(self, msg: str) -> None:
        # one line a message, whatever a name or an error in it holds (a mail file's name with a newline
        # forged a second log line), and no terminal escapes in .primefs/runner.log
        msg = redact.text(msg).translate(ONE_LINE)
        if msg.startswith(("warning:", "error", "goal error:")):
            with self.lock:
                if msg in self.said:
                    return
                self.said[msg] = None
                if len(self.said) > 10_000:
                    self.said.popitem(last=False)
        self.out(msg)


class Runner:
    def __init__(self, ws: Workspace, log=None, ray: str | None = None):
        self.ws = ws
        self.ray = ray  # `run --ray ADDRESS`: kernels on that Ray cluster (else `hosts:` decides)
        self.log = OnceLog(log or (lambda msg: print(msg, file=sys.stderr, flush=True)))
        self._configure()
        self.pm = plugin_manager(ws.root)
        conditions = end_conditions(self.pm)
        self.bell = Bell()
        self.tree = SessionTree(ws.sessions)
        self.scheduler = Scheduler(self.bell, lambda: self.limits.max_concurrent_sessions,
                                   lambda sid: self.turns.work(sid), self.log)
        self.post = PostOffice(self.tree, self.bell, self.log, on_mail=lambda sid: self.turns.mail_arrived(sid))
        self.goals = GoalControl(self.tree, conditions, ws, self.bell, lambda sid: self.turns.turns_of(sid))
        self.gateway = ModelGateway(ws, providers(self.pm), self.goals, self.bell, self.log)
        self.intake = Intake(ws, self.tree, self.scheduler, self.post, conditions, self.log)
        self.toolbox = ToolBox(ws, self.pm, self.log)
        self.hooks = Hooks(ws, self.log)
        self.turns = Turns(ws, self.tree, self.post, self.scheduler, self.goals, self.bell, self._make_agent,
                           self.intake.commit_hand_edits, self.log)
        self.approvals = Approvals(ws, self.bell, self.scheduler, self.goals, self.hooks, self.log,
                                   self.turns.commit_session)
        self.services = KernelServices(ws, self.tree, self.turns, self.post, self.scheduler, self.goals,
                                       self.intake, self.bell, self.toolbox)
        self.alive = Alive(ws, self.tree, self.intake, self.turns, self.scheduler, self.log,
                           apply_stop=self.apply_stop, apply_refine=self.apply_refine_request)
        self.intake.on_adopt = self.alive.wake
        self.archiving = Archiving(ws, self.scheduler, self.turns, self.alive, self.log)
        self.requests = LiveRequests(ws, self.turns, self.log, archive=self.archiving.serve, approvals=self.approvals)
        self.host = None  # the kernel host, started by run()
        self.lock: RunnerLock | None = None
        self.started_at = time.time()
        self.idle_exit_s: float | None = None  # run(idle_exit_s=): stops once without work that long
        self.recovered = threading.Event()  # set once run() knows what is taken: file events may be acted on

    def _configure(self) -> None:
        """Settings from primefs.yaml (again after it changed: Intake.check_config)."""
        self.limits = self.ws.limits()
        redact.configure(self.ws.config)  # the keys this workspace names are never written to a file
        requests = getattr(self, "requests", None)  # (not yet made at the first call)
        if requests is not None and requests.connected and not self.ws.config.get("kernel_connect"):
            requests.revoke()

    def _make_agent(self, session: Session) -> Agent:
        self.approvals.void_stale(session)  # what an earlier runner left waiting is asked again, if still needed
        return Agent(session, ws=self.ws, tree=self.tree, gateway=self.gateway, post=self.post, host=self.host,
                     bell=self.bell, toolbox=self.toolbox, hooks=self.hooks, approvals=self.approvals)

    # -- what other code may ask ------------------------------------------------------------------
    def refine(self, sid: str, **request) -> dict:
        return self.turns.refine(self.turns.agent(sid), **request)

    def outcome(self) -> dict:
        """What went wrong under this runner: sessions that failed (and still are), goal files refused."""
        failed = []
        for sid in sorted(self.turns.failed):
            try:
                if self.tree.session(sid).reload().get("status") == "failed":
                    failed.append(sid)
            except (PrimefsError, OSError):
                failed.append(sid)
        return {"failed": failed, "rejected": sorted(self.intake.rejected)}

    def stop(self) -> None:
        """Ask a running `run()` to return (from another thread)."""
        self.bell.stop()

    # -- lifecycle --------------------------------------------------------------------------------
    def run(self, once: bool = False, idle_exit_s: float | None = None) -> None:
        """Run until stopped; with `once`, until no session has work; with `idle_exit_s`, until none has
        had work for that long (a runner `ask` started to stay up a while: cli.md, "Keep-alive")."""
        self.idle_exit_s = idle_exit_s
        self.lock = RunnerLock(self.ws)
        hide_from_same_user()
        raise_fd_limit()
        self.started_at = time.time()
        observer = None
        self._handle_sigterm()
        try:
            self.host = make_host(self.ws, self.ray, self.services.handle, self.log)
            threading.Thread(target=self.guarded, args=("the sandbox check", self._say_sandbox), daemon=True,
                             name="primefs-sandbox-check").start()
            self.toolbox.start()
            self.turns.committer = Committer(self.ws.root, log=self.log)
            if not once:  # a runner that keeps running: from its configuration alone, as early as can be
                self.guarded("a warm-up", self._warm_up, False)
            self.recover()
            self.recovered.set()
            if once:  # (its work must be known before --once decides there is none)
                self.guarded("a look at sessions changed since", self.alive.settle_changed)
            else:
                threading.Thread(target=self.guarded, args=("a look at sessions changed since", self.alive.settle_changed),
                                 daemon=True, name="primefs-settle").start()
            if once:  # what --once will call: its waiting goals and sessions (known after recover)
                self.guarded("a warm-up", self._warm_up, True)
            self.guarded("heartbeats", self.intake.tick_heartbeats)  # ticks missed meanwhile: one message each
            self.guarded("scan", self.scan)
            if not once:
                observer = watch(self.ws, self.alive,
                                 lambda path, whole=False: self.guarded("a file event", self.hint, path, whole), self.log)
                self.log(f"runner {os.getpid()} in {self.ws.root}: {len(self.scheduler.queued | self.scheduler.active)} session(s) with work; "
                         "watching goals/ and mailboxes (Ctrl-C stops)")
            self._loop(once)
        except KeyboardInterrupt:
            self.log("stopping: sessions that were running resume when a runner starts again")
        finally:
            self.bell.stop()
            if observer is not None:
                observer.stop()
            self._shutdown()

    def _say_sandbox(self) -> None:
        """Once, at start: a sandbox that cannot be had here, or limits it can only keep per process."""
        _, notes = boxes.machine_notes(check_sandbox(self.ws.config.get("sandbox"), "primefs.yaml", self.ws.root))
        for note in notes:
            self.log(f"warning: sandbox: {note}")

    def _warm_up(self, once: bool) -> None:
        """`import litellm` in the background if a model it serves is about to be called (warmup.py)."""
        names = warmup.models_in_sight(self.ws, self.tree, self.scheduler, self.intake.claimed) if once else \
            warmup.configured(self.ws)
        if warmup.litellm_models(self.ws, self.gateway.providers, names):
            warmup.start()

    def guarded(self, what: str, fn, *args) -> None:
        """Run one step of the loop (or a watchdog hint); a failure is logged once, never fatal."""
        try:
            fn(*args)
        except Exception as exc:  # noqa: BLE001 - one bad file or session must not stop the runner
            self.log(f"warning: {what}: {type(exc).__name__}: {exc}")

    def _loop(self, once: bool) -> None:
        idle_exit_s = self.idle_exit_s
        last_scan = last_state = last_tick = idle_since = time.monotonic()
        self.write_state()
        while True:
            now = time.monotonic()
            if idle_exit_s is not None:
                if not self._idle():
                    idle_since = now
                elif now - idle_since >= idle_exit_s:
                    self.guarded("scan", self.scan)  # one last look, as --once takes
                    if self._idle():
                        self.log(f"no work for {idle_exit_s:g} s: stopping (--idle-exit)")
                        return
                    idle_since = now
            if now - last_scan > RESCAN_S:
                self.guarded("scan", self.scan)  # watchdog events are hints; the listing is the truth
                last_scan = now
            if now - last_state > STATE_S:
                self.write_state()
                last_state = now
            if not once and now - last_tick >= 0.25:  # the loop wakes often: rate-limit
                self.guarded("heartbeats", self.intake.tick_heartbeats)
                last_tick = now
            look = self.intake.next_look  # a goal file being written: read it once it settles
            if look is not None and now >= look:
                self.guarded("goals", self.intake.scan_goals)
                look = self.intake.next_look
            with self.bell.cond:
                self.scheduler.dispatch()
                if self.bell.stopping:
                    return
                if not (once and self.scheduler.idle()) or look is not None:
                    self.bell.cond.wait(1.0 if look is None else min(1.0, max(0.02, look - time.monotonic())))
                    continue
            self.guarded("scan", self.scan)  # one last look: files may have come from outside meanwhile
            if self.scheduler.idle() and self.intake.next_look is None:
                return

    def _idle(self) -> bool:
        """No session has work, no goal file is being read, no live request (exec, kernel) is in hand."""
        return self.scheduler.idle() and self.intake.next_look is None and not self.requests.busy()

    def _handle_sigterm(self) -> None:
        """`primefs down` sends SIGTERM: stop like Ctrl-C (sessions left resumable)."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda *_: self.stop())

    def write_state(self) -> None:
        """.primefs/runner.json: what `primefs runner` shows (pid, since, kernels, memory), and its MCP servers
        as `primefs tools` shows them."""
        host = self.host.state() if self.host else {"live_kernels": 0, "kernel_pids": []}
        write_state(self.ws, {"pid": os.getpid(), "started": self.started_at, "updated": time.time(),
                              "idle_exit_s": self.idle_exit_s,
                              **self.scheduler.snapshot(), **host, "mcp_tools": self.toolbox.mcp_state()})

    def _shutdown(self) -> None:
        self.requests.close()  # first: the connection files name kernels that are going (a stop may be cut short)
        self.bell.ring()  # release waiters in wait()/recv()
        self.turns.kernels.interrupt_all(list(self.turns.agents.values()))
        self.scheduler.join(10)
        self.gateway.drain(2.0)
        self.turns.kernels.shutdown_all(list(self.turns.agents.values()))
        if self.host is not None:
            self.host.close()
        self.toolbox.close()
        self.intake.harness_touched()
        self.intake.commit_hand_edits()
        committer = self.turns.committer
        if self.alive.committing is not None:  # what a stopped runner left uncommitted: requested before the close
            self.alive.committing.join(60)
        if committer is not None:
            committer.close()  # (a failed commit was said as it failed)
        try:
            state_path(self.ws).unlink()
        except OSError:
            pass
        if self.lock:
            self.lock.release()

    def hint(self, path: Path, whole: bool = False) -> None:
        """A file event: look at that goal, session or harness entry now (the files decide). `whole`: the
        file was renamed into place or closed after writing (a goal is read at once, not once it settles)."""
        kind, sid = meaning(self.ws, path)
        if kind in ("request", "goal", "goals") and self.intake.check_config():  # e.g. a goal's model just added
            self._configure()
        if kind == "request":
            self.requests.take(path)
        elif kind == "goal":
            self.intake.goal_event(path, whole)
        elif kind == "harness":
            self.intake.harness_touched()
            if sid and path.is_dir():  # a new folder of an awake session's harness
                self.alive.watch_harness(sid, path)
        elif kind == "session":
            self.alive.look(sid)  # the doorbell (the folder itself), mail, a request, heartbeats
        elif kind == "sessions":  # events were lost: look at everything soon
            self.alive.look_soon()

    # -- finding work -----------------------------------------------------------------------------
    def recover(self) -> None:
        """Start-up: trees a crash left half archived put right; the family links, which goals are taken,
        which sessions were cut off or have mail waiting (alive.py: finished sessions are not loaded)."""
        self.archiving.recover()
        cut_off = []
        self.guarded("committing what a stopped runner staged", lambda: cut_off.extend(commit_cut_off(self.ws.root)))
        if cut_off:
            self.log(f"committed {len(cut_off)} session folder(s) a stopped runner had staged but not committed")
        self.alive.start()

    def scan(self) -> None:
        if self.intake.check_config():
            self._configure()
        self.intake.scan_goals()
        self.requests.scan()
        self.alive.scan()

    def apply_stop(self, sid: str) -> None:
        """A stop request file (from `primefs stop`): stop the session now, or at its next step."""
        if not NAME_RE.fullmatch(sid) or not self.tree.knows(sid):
            return
        self.turns.stop(sid)
        try:
            (self.ws.sessions / sid / STOP_FILE).unlink()
        except FileNotFoundError:
            pass

    def apply_refine_request(self, sid: str) -> None:
        """`primefs refine` while this runner runs: it leaves a request file; the runner does the work."""
        if NAME_RE.fullmatch(sid) and self.tree.knows(sid):
            request = take_refine_request(self.ws.sessions / sid)
            if request is not None:
                self.turns.refine_request(sid, request)


def refine_offline(ws: Workspace, sid: str, request: dict, log, gate_runner=None) -> dict:
    """`primefs refine` with no runner running (the caller holds the runner lock)."""
    from primefs.harness.entries import session_chain
    from primefs.harness.refine import run_refine

    runner = Runner(ws, log=log)
    chain = session_chain(ws, sid)
    for child, parent in zip(chain, chain[1:] + [None]):
        runner.tree.link(child, parent)
    # the command prints each edit and the error itself: the runner's one-line summary would say it twice
    return run_refine(ws, runner.turns.agent(sid), runner.tree.chain(sid),
                      lambda line: log(line) if line.startswith("gate ") else None,  # a gate's progress only
                      gate_runner=gate_runner, **{k: v for k, v in request.items() if v is not None})
