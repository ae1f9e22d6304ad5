"""Reaching the runner through files: its lock and `runner.json` (is one running, which), the
requests the command line leaves for a runner that may or may not be running (`stop.request`,
`refine.request`: kept until one applies them), and `ask_runner`, the one request/reply exchange with
a running runner (`primefs exec`, `kernel`, `archive`; the runner's side is runner/liverequests.py)."""
from __future__ import annotations

import fcntl
import json
import os
import secrets
import shutil
import time
from contextlib import contextmanager
from pathlib import Path

from primefs.errors import PrimefsError
from primefs.store.fsutil import ring, write_atomic
from primefs.store.mail import deliver
from primefs.store.session import Session
from primefs.store.workspace import Workspace

STOP_FILE = "stop.request"  # written by `primefs stop`; the runner applies and removes it
REFINE_FILE = "refine.request"  # written by `primefs refine` while a runner runs
ALIVE_CHECK_S = 1.0  # how often a command waiting for a reply looks whether the runner is still there


# -- the lock and the state file --------------------------------------------------------------------
def lock_path(ws) -> Path:
    return ws.state / "runner.lock"


def state_path(ws) -> Path:
    return ws.state / "runner.json"


def lock_held(ws) -> bool:
    """True if a runner holds `.primefs/runner.lock`. Probes with a non-blocking flock, released at once."""
    path = lock_path(ws)
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing releases our probe lock, if we got it
    return False


def read_lock_file(ws) -> tuple[int | None, float | None]:
    """(pid, start time) from the lock file's "<pid> <time>" line; None where unreadable."""
    try:
        fields = lock_path(ws).read_text().split()
    except OSError:
        return None, None
    pid = int(fields[0]) if fields and fields[0].isdigit() else None
    try:
        started = float(fields[1]) if len(fields) > 1 else None
    except ValueError:
        started = None
    return pid, started


def runner_token(ws) -> str | None:
    """The running runner's identity: its lock file's "<pid> <start time>" while it holds the lock, else None
    (the index trusts the change journal of one runner: index/db.py, "trusted")."""
    if not lock_held(ws):
        return None
    pid, started = read_lock_file(ws)
    if pid is None or started is None:
        return None
    try:  # a command holding the lock for an instant (runner_lock) leaves a dead runner's line in the file
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return f"{pid} {started!r}"


def write_state(ws, state: dict) -> None:
    """The running runner's `.primefs/runner.json` (what `primefs runner` and `primefs tools` show)."""
    path = state_path(ws)
    try:
        write_atomic(path, json.dumps(state, indent=1), durable=False)
    except IsADirectoryError:  # a folder in the runner's own file's place: taken away, written next time
        shutil.rmtree(path, ignore_errors=True)
    except OSError:
        pass


def read_state(ws) -> dict | None:
    try:
        data = json.loads(state_path(ws).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def runner_state(ws) -> dict:
    """Everything known about the workspace's runner, from the lock, the lock file and runner.json.

    Keys: running, pid, started, updated, state (runner.json or None). `state` is only returned
    when it belongs to the running runner (same pid), so a stale file from a killed runner is ignored.
    """
    running = lock_held(ws)
    if not running:
        return {"running": False, "pid": None, "started": None, "updated": None, "state": None}
    lock_pid, lock_started = read_lock_file(ws)
    state = read_state(ws)
    if state is not None and lock_pid is not None and state.get("pid") != lock_pid:
        state = None  # stale: from an earlier runner that could not remove it
    pid = lock_pid if lock_pid is not None else (state or {}).get("pid")
    started = (state or {}).get("started") or lock_started
    return {"running": True, "pid": pid, "started": started, "updated": (state or {}).get("updated"),
            "state": state}


@contextmanager
def runner_lock(ws: Workspace):
    """Hold the runner lock while no runner runs (yields True: none can start meanwhile); yields False
    if a runner holds it."""
    ws.state.mkdir(exist_ok=True)
    with open(lock_path(ws), "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def request_stop(ws: Workspace, targets: list[str]) -> list[tuple[str, str]]:
    """Stop sessions (a session and its descendants: `index.descendants`). With a runner: a stop.request
    file it applies at once. Without one: mark them stopped directly (holding the runner lock so none
    starts meanwhile)."""
    out = []
    with runner_lock(ws) as no_runner:
        for t in targets:
            s = Session(ws.sessions / t)
            if s.status in ("stopped",):
                out.append((t, "already stopped"))
            elif not no_runner:
                write_atomic(s.dir / STOP_FILE, "stop\n")
                ring(s.dir)
                out.append((t, "stop requested (the runner applies it)"))
            else:
                s.set_status("stopped", stop_reason="stopped")
                parent = s.meta.get("parent")
                if parent:  # as the runner does: the parent learns of it by mail
                    deliver(ws.sessions / parent / "mail", sender=t, to=parent, kind="result",
                            text="(no result: stopped)", extra={"child": t, "name": s.name, "status": "stopped"})
                out.append((t, "stopped"))
    return out


def take_refine_request(folder) -> dict | None:
    """The request `primefs refine` left for the running runner (instructions, scope, model, gate), removed
    as it is taken; None if there is none or it cannot be read."""
    path = folder / REFINE_FILE
    try:
        request = json.loads(path.read_text())
        path.unlink()
    except (OSError, ValueError):
        return None
    if not isinstance(request, dict):
        return None
    if request.get("gate") is not None:
        from primefs.store.settings import check_harness

        try:
            check_harness({"gate": request["gate"]}, "refine request")
        except PrimefsError:
            return None
    return {k: request.get(k) for k in ("instructions", "scope", "model", "gate") if request.get(k) is not None}


# -- request and reply ------------------------------------------------------------------------------
def requests_dir(ws) -> Path:
    """In the private runtime folder (mode 0700, hidden from sandboxed kernels): no kernel can leave a
    request, so none can get code run in another session's kernel."""
    return ws.runtime / "requests"


def ask_runner(ws, request: dict, timeout: float, *, busy_hint: str = "") -> dict:
    """One request (`{"op": ..., ...}`) to the running runner, and its reply (a dict).

    The request is written as `<id>.json`; the runner claims it (renames it `<id>.taken`), does the work
    in a thread of its own and writes `<id>.reply`; we read it and remove all three. Raises PrimefsError
    for an error reply, when no runner runs, when it stops before answering, and after `timeout` s."""
    op = request.get("op")
    if not lock_held(ws):
        raise PrimefsError(f"no runner is running: `primefs {op}` needs one (start one: primefs up)")
    folder = requests_dir(ws)
    folder.mkdir(parents=True, exist_ok=True)
    rid = f"{time.strftime('%y%m%d-%H%M%S')}-{secrets.token_hex(4)}"
    write_atomic(folder / f"{rid}.json", json.dumps(request), durable=False)
    reply_path = folder / f"{rid}.reply"
    last_check = time.monotonic()
    deadline = last_check + timeout
    try:
        while not reply_path.exists():
            now = time.monotonic()
            if now > deadline:
                raise PrimefsError(f"the runner did not answer within {timeout:g} s{busy_hint}")
            if now - last_check > ALIVE_CHECK_S:
                last_check = now
                if not lock_held(ws) and not reply_path.exists():
                    raise PrimefsError(f"the runner stopped before answering; run `primefs {op}` again")
            time.sleep(0.05)
        reply = json.loads(reply_path.read_text())
    finally:
        for p in (folder / f"{rid}.json", folder / f"{rid}.taken", reply_path):
            try:
                p.unlink()
            except FileNotFoundError:
                pass
    if reply.get("error") and not reply.get("ran"):
        raise PrimefsError(reply["error"])
    return reply
