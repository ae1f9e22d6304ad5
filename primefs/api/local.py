"""A runner in this process, for a program (or `primefs ask`) when no runner is up.

It runs `Runner.run(once=True)` in a thread: the work there is (the program's sessions, and whatever else waits
in the workspace) gets done, then it returns and its kernels are gone. A program that ends while it still runs
stops it on the way out (atexit): nothing is left behind, and cut-off turns resume at the next runner start.
One per workspace per process; a runner of another process always comes first (the lock decides).
"""
from __future__ import annotations

import atexit
import threading
from pathlib import Path

from primefs.errors import PrimefsError
from primefs.store.control import lock_held
from primefs.store.workspace import Workspace

_lock = threading.Lock()
_running: dict[Path, LocalRunner] = {}


class LocalRunner:
    def __init__(self, ws: Workspace):
        from primefs.eval import run_gate
        from primefs.runner.core import Runner

        self.problems: list[str] = []  # errors and warnings it logged: said if a goal is never taken
        self.failure: BaseException | None = None
        self.runner = Runner(Workspace(ws.root), log=self._log)
        self.runner.turns.gate_runner = run_gate
        self.thread = threading.Thread(target=self._run, name="primefs-local-runner", daemon=True)

    def _log(self, msg: str) -> None:
        if msg.startswith(("error", "goal error", "warning")):
            self.problems.append(msg)

    def _run(self) -> None:
        try:
            self.runner.run(once=True)
        except BaseException as exc:  # noqa: BLE001 - e.g. another process took the lock first: said by waiters
            self.failure = exc

    def alive(self) -> bool:
        return self.thread.is_alive()

    def look(self, path: Path) -> None:
        """A file this process just wrote (a goal, mail, a stop request): look at it now. A runner that
        runs once has no watcher; without this it would see the file at its next periodic scan. (Before
        it has recovered it knows not what is taken; its first scan, after, sees the file.)"""
        if self.runner.recovered.is_set():
            self.runner.guarded("a file event", self.runner.hint, path, True)  # written whole, by rename

    def stop(self) -> None:
        self.runner.stop()
        self.thread.join()


def ensure(ws: Workspace) -> LocalRunner | None:
    """The runner doing ws's work: None if a runner of another process is up, else this process's
    (started now if it was not running)."""
    with _lock:
        mine = _running.get(ws.root)
        if mine is not None and mine.alive():
            return mine
        if lock_held(ws):
            return None
        if mine is not None and mine.failure is not None:  # said once; the next call tries again
            failure, mine.failure = mine.failure, None
            if isinstance(failure, PrimefsError):
                raise PrimefsError(f"the runner in this process stopped: {failure}") from None
            raise failure
        mine = _running[ws.root] = LocalRunner(ws)
        mine.thread.start()
        return mine


def current(ws: Workspace) -> LocalRunner | None:
    """This process's runner of ws, if it runs."""
    mine = _running.get(ws.root)
    return mine if mine is not None and mine.alive() else None


def look(ws: Workspace, path: Path) -> None:
    """Tell this process's runner of ws (if any) about a file just written; a runner elsewhere watches."""
    mine = current(ws)
    if mine is not None:
        mine.look(path)


def stop(ws: Workspace | None = None) -> None:
    """Stop this process's runner of ws (all of them: None) and wait for it to end."""
    with _lock:
        chosen = [r for root, r in _running.items() if ws is None or root == ws.root]
    for r in chosen:
        r.stop()


atexit.register(stop)
