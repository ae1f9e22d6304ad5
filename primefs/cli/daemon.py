"""The runner in the background: `primefs up`, `primefs down`, `primefs runner`.

Whether a runner runs is decided by its lock (`.primefs/runner.lock`, an flock the kernel drops
when the process dies), never by a pid file alone: `.primefs/runner.json` (written by the runner
every couple of seconds) only adds detail, and may be stale after a SIGKILL.

This module does not import `primefs.cli` at import time (cli imports it), so it can be imported
first; the `-w` option is declared here with the same behaviour as `cli.ws_option`.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

import click

from primefs.errors import PrimefsError
from primefs.store.control import lock_held, lock_path, read_lock_file, read_state, runner_state, state_path
from primefs.views.sessions import cut_middle
from primefs.views.when import human_age

LOG_NAME = "runner.log"
LOG_MAX_BYTES = 10 * 1024 * 1024  # past this, runner.log becomes runner.log.1 (the one before it dropped)
LOG_LOOK_S = 60.0
UP_TIMEOUT_S = 60.0
DOWN_TIMEOUT_S = 30.0


from primefs.cli.options import emit, idle_exit_option, json_option, ray_address, ray_option, workspace, ws_option  # noqa: E402  (shared options)


# -- the runner's log and its process ---------------------------------------------------------------
def log_path(ws) -> Path:
    return ws.state / LOG_NAME


def rotate_log(ws, fds: tuple[int, ...] = ()) -> bool:
    """runner.log past LOG_MAX_BYTES moved to runner.log.1 (replacing the one before) and a new one begun,
    dup'ed onto `fds` (a runner's output). A runner that runs for months writes a line or two a turn."""
    path = log_path(ws)
    try:
        if os.stat(path).st_size < LOG_MAX_BYTES:
            return False
        os.replace(path, path.with_name(LOG_NAME + ".1"))
        if fds:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            for target in fds:
                os.dup2(fd, target)
            os.close(fd)
    except OSError:  # gone, or not ours to move: written on as it is, looked at again next time
        return False
    return True


def keep_log_small(ws) -> bool:
    """If this process's output is the workspace's runner.log (`primefs up` started it), a daemon thread
    rotates it every LOG_LOOK_S seconds (rotate_log). False if the output is anything else."""
    try:
        out, log = os.fstat(1), os.stat(log_path(ws))
    except OSError:
        return False
    if (out.st_dev, out.st_ino) != (log.st_dev, log.st_ino):
        return False

    def look() -> None:
        # No flush of sys.stdout here: one between print's text and its newline would cut the line in
        # two across the files. What is still buffered goes to the new file, in order.
        while True:
            time.sleep(LOG_LOOK_S)
            rotate_log(ws, (1, 2))

    threading.Thread(target=look, name="primefs-log", daemon=True).start()
    return True


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


# -- memory, from /proc -----------------------------------------------------------------------------
def proc_memory(pid: int) -> dict | None:
    """{"rss_kb", "pss_kb"} of a process (pss from smaps_rollup when readable, else None); None if gone."""
    out: dict = {"rss_kb": None, "pss_kb": None}
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("Rss", "Pss"):
                out[key.lower() + "_kb"] = int(rest.split()[0])
    except (OSError, ValueError, IndexError):
        pass
    if out["rss_kb"] is None:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    out["rss_kb"] = int(line.split()[1])
        except (OSError, ValueError, IndexError):
            return None
    return out


def child_pids(pid: int) -> list[int]:
    """Direct children of a process (scans /proc/*/stat)."""
    kids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                kids.append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue
    return sorted(kids)


def _is_template(pid: int) -> bool:
    try:
        return b"primefs.kernels.forkserver" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def memory_report(pid: int, kernel_pids: list[int]) -> dict:
    """The runner's memory and its kernels': those of sessions (runner.json) and the template they
    are forked from (a child of the runner). Forked kernels share the template's pages: PSS adds up."""
    runner = proc_memory(pid) or {"rss_kb": None, "pss_kb": None}
    session_kernels = [p for p in kernel_pids if isinstance(p, int)]
    templates = [p for p in child_pids(pid) if _is_template(p)]
    kernels = []
    for p, role in [(p, "session") for p in session_kernels] + [(p, "template") for p in templates]:
        mem = proc_memory(p)
        if mem is not None:
            kernels.append({"pid": p, "role": role, **mem})

    def total(key: str, rows: list[dict]) -> int:
        return sum(r[key] or 0 for r in rows)

    k_rss, k_pss = total("rss_kb", kernels), total("pss_kb", kernels)
    return {"runner_rss_kb": runner["rss_kb"], "runner_pss_kb": runner["pss_kb"], "kernels": kernels,
            "kernels_rss_kb": k_rss, "kernels_pss_kb": k_pss,
            "total_pss_kb": (runner["pss_kb"] or runner["rss_kb"] or 0) + (k_pss or k_rss)}


def _mb(kb: int | None) -> str:
    return "?" if kb is None else f"{kb / 1024:.1f} MB"


def _tail(path: Path, since: int = 0, lines: int = 20) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(since)
            data = f.read()
    except OSError:
        return ""
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])


# -- commands ---------------------------------------------------------------------------------------
def spawn(ws, *, ray: str | None = None, idle_exit: float | None = None) -> tuple[subprocess.Popen, int]:
    """Start `primefs run` detached, its output appended to .primefs/runner.log: (the process, where
    its output begins in the log). Refuses if a runner already runs in this workspace."""
    ws.state.mkdir(exist_ok=True)
    if lock_held(ws):
        pid, _ = read_lock_file(ws)
        raise PrimefsError(f"a runner is already running in {ws.root}" + (f" (pid {pid})" if pid else "")
                           + "; see `primefs runner`, stop it with `primefs down`")
    rotate_log(ws)
    with open(os.open(log_path(ws), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), "ab") as f:  # the runner's only
        os.fchmod(f.fileno(), 0o600)
        f.write(f"--- primefs up {datetime.now().isoformat(timespec='seconds')} ---\n".encode())
        start_offset = f.tell()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        args = (["--ray", ray] if ray else []) + (["--idle-exit", f"{idle_exit:g}"] if idle_exit is not None else [])
        proc = subprocess.Popen([sys.executable, "-P", "-m", "primefs", "-w", str(ws.root), "run", *args], cwd=ws.root,
                                stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True, close_fds=True)
    return proc, start_offset


def wait_started(ws, proc: subprocess.Popen, start_offset: int, timeout: float, ready) -> None:
    """Wait until `ready()` (the runner spawned holds the lock, or has written runner.json); raise,
    with the end of its output, if it exits first or `timeout` passes."""
    log = log_path(ws)
    deadline = time.monotonic() + timeout
    while not ready():
        code = proc.poll()
        if code is not None:
            tail = _tail(log, start_offset)
            if tail:
                click.echo(tail, err=True)
            raise PrimefsError(f"the runner exited at start (code {code}); its output is in {log}")
        if time.monotonic() > deadline:
            raise PrimefsError(f"the runner (pid {proc.pid}) has not reported ready after {timeout:g} s; it is "
                               f"still running: see {log}, stop it with `primefs down`")
        time.sleep(0.02)


def keep_alive(ws, seconds: float) -> bool:
    """A runner for `ask` or `wait` when none is up (`keep_alive_s`, cli.md "Keep-alive"): started in the
    background, stopping once it has had no work for `seconds`, so the next `ask` finds litellm imported
    and kernels warm. True once a runner holds the lock (this one, or another that came first); False,
    said on stderr, if it could not start (the caller then runs one itself)."""
    try:
        proc, start_offset = spawn(ws, idle_exit=seconds)
        wait_started(ws, proc, start_offset, UP_TIMEOUT_S, lambda: lock_held(ws))
        return True
    except PrimefsError as exc:
        if lock_held(ws):
            return True
        click.echo(f"note: the keep-alive runner did not start ({exc}): running here instead", err=True)
        return False


@click.command()
@click.option("--timeout", type=float, default=UP_TIMEOUT_S, show_default=True, metavar="S",
              help="Seconds to wait for the runner to report itself ready.")
@idle_exit_option
@ray_option
@json_option
@ws_option
@click.pass_context
def up(ctx, timeout, idle_exit, ray, as_json):
    """Start the runner in the background (like `primefs run`, detached); its output goes to .primefs/runner.log.

    Waits until the runner has written .primefs/runner.json, then prints its pid. Refuses if a
    runner already runs in this workspace. Stop it with `primefs down` (or let --idle-exit do it).
    """
    ws = workspace(ctx)
    proc, start_offset = spawn(ws, ray=ray_address(ws, ray), idle_exit=idle_exit)
    wait_started(ws, proc, start_offset, timeout, lambda: (read_state(ws) or {}).get("pid") == proc.pid)
    log = log_path(ws)
    emit(as_json, {"pid": proc.pid, "log": str(log)}, f"runner started: pid {proc.pid}, log {log}")


@click.command()
@click.option("--timeout", type=float, default=DOWN_TIMEOUT_S, show_default=True, metavar="S",
              help="Seconds to wait after SIGTERM before sending SIGKILL.")
@json_option
@ws_option
@click.pass_context
def down(ctx, timeout, as_json):
    """Stop the background runner: SIGTERM, then SIGKILL after --timeout seconds.

    Sessions that were mid-turn are left resumable: the next runner continues them.
    """
    ws = workspace(ctx)
    if not lock_held(ws):
        emit(as_json, {"pid": None, "outcome": "none running"}, "no runner is running")
        return
    info = runner_state(ws)
    pid = info["pid"]
    if not pid or not alive(pid):
        raise PrimefsError(f"the runner lock {lock_path(ws)} is held but its pid is unknown "
                           f"({pid or 'none recorded'}); find the process with `fuser {lock_path(ws)}`")
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    if _wait_gone(ws, pid, timeout):
        emit(as_json, {"pid": pid, "outcome": "stopped"}, f"runner stopped (pid {pid})")
        return
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    if not _wait_gone(ws, pid, 10.0):
        raise PrimefsError(f"the runner (pid {pid}) did not exit even after SIGKILL")
    state = read_state(ws)
    if state is not None and state.get("pid") == pid:  # it could not remove its own state file
        try:
            state_path(ws).unlink()
        except FileNotFoundError:
            pass
    emit(as_json, {"pid": pid, "outcome": "killed"}, f"runner killed (pid {pid}) after {timeout:g} s without "
         "stopping; sessions that were running resume when a runner starts again")


def _wait_gone(ws, pid: int, timeout: float) -> bool:
    """Until the lock is free and the process gone (or not a zombie of ours)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not lock_held(ws) and not alive(pid):
            return True
        time.sleep(0.05)
    return not lock_held(ws) and not alive(pid)


SHOW_SESSIONS = 5  # of each list in `primefs runner` (a runner may have thousands queued)


def _session_labels(ws, ids: list[str]) -> list[str]:
    from primefs.store.session import Session

    out = []
    for sid in ids:
        try:
            name = Session(ws.sessions / sid).meta.get("name")
        except Exception:
            name = None
        out.append(f"{sid} ({cut_middle(str(name), 48)})" if name and name != sid else sid)
    return out


@click.command("runner")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
@ws_option
@click.pass_context
def runner_cmd(ctx, as_json):
    """Whether a runner runs here: pid, since when, kernels, sessions at work, memory."""
    ws = workspace(ctx)
    info = runner_state(ws)
    now = time.time()
    if not info["running"]:
        if as_json:
            click.echo(json.dumps({"running": False, "workspace": str(ws.root), "log": str(log_path(ws))}, indent=1))
        else:
            click.echo("no runner is running" + ("" if not log_path(ws).exists() else f" (last log: {log_path(ws)})"))
        return
    state = info["state"] or {}
    started = info["started"]
    pid = info["pid"]
    out = {
        "running": True,
        "workspace": str(ws.root),
        "pid": pid,
        "started": started,
        "started_iso": datetime.fromtimestamp(started).astimezone().isoformat(timespec="seconds") if started else None,
        "uptime_s": round(now - started, 1) if started else None,
        "updated": info["updated"],
        "state_age_s": round(now - info["updated"], 1) if info["updated"] else None,
        "live_kernels": state.get("live_kernels"),
        "kernel_pids": state.get("kernel_pids") or [],
        "nodes": state.get("nodes"),  # kernels on a Ray cluster: per node, its kernels (none: this machine)
        "active_sessions": state.get("active_sessions") or [],
        "waiting_sessions": state.get("waiting_sessions") or [],
        "queued_sessions": state.get("queued_sessions") or [],
        "idle_exit_s": state.get("idle_exit_s"),  # it stops once without work that long (None: runs until stopped)
        "memory": memory_report(pid, state.get("kernel_pids") or []) if pid else None,
        "log": str(log_path(ws)),
    }
    if as_json:
        click.echo(json.dumps(out, indent=1))
        return
    since = (f"{datetime.fromtimestamp(started):%Y-%m-%d %H:%M:%S} ({out['started_iso']}), "
             f"up {human_age(out['uptime_s'])}") if started else "?"
    lines = [f"runner: running, pid {pid}", f"since: {since}"]
    if not info["state"]:
        lines.append("state: .primefs/runner.json not written yet (the runner is starting)")
    else:
        lines.append(f"state: updated {human_age(out['state_age_s'])} ago")
        lines.append(f"live kernels: {out['live_kernels']}")
        for n in out["nodes"] or []:
            lines.append(f"  Ray node {n['node']}: " + (f"lost ({n['lost']})" if n["lost"] else f"{n['kernels']} kernel(s)"))
        for key in ("active", "waiting", "queued"):
            ids = out[f"{key}_sessions"]
            lines.append(f"{key} sessions: {len(ids):,}" + (f" (the first {SHOW_SESSIONS}; `primefs status` lists all)"
                                                           if len(ids) > SHOW_SESSIONS else ""))
            lines += [f"  {label}" for label in _session_labels(ws, ids[:SHOW_SESSIONS])]
        if out["idle_exit_s"] is not None:
            lines.append(f"stops after {out['idle_exit_s']:g} s without work (--idle-exit)")
    mem = out["memory"]
    if mem:
        runner_mem = f"runner {_mb(mem['runner_rss_kb'])} RSS"
        if mem["runner_pss_kb"] is not None:
            runner_mem += f" ({_mb(mem['runner_pss_kb'])} PSS)"
        n_sessions = sum(1 for k in mem["kernels"] if k["role"] == "session")
        kernels = (f"{n_sessions} kernel(s) and their template {_mb(mem['kernels_pss_kb'])} PSS, "
                   f"{_mb(mem['kernels_rss_kb'])} RSS")
        lines += [f"memory: {runner_mem}", f"  {kernels}", f"  total {_mb(mem['total_pss_kb'])} PSS"]
    lines.append(f"log: {out['log']}")
    click.echo("\n".join(lines))
