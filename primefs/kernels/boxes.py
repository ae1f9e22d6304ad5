"""The runner's side of the sandbox (sandbox.py is the side that runs in the kernel's process): the box a
kernel or a command enters, commands run in one, and what this machine allows."""
from __future__ import annotations

import json
import os
import signal
import stat
import sys
import threading

from primefs.kernels.cgroups import Cgroup, remove_group
from primefs.kernels.sandbox import SandboxError, kernel_ids


def box_for(settings: dict, workspace, rooms: list, cwd, *, sockets: str | None = None, hide=(), hide_files=(),
            cgroup: "Cgroup | None" = None) -> dict:
    """What enter() needs: the rooms made (and, for a root runner, given to the kernel's uid), plus the
    folders a person's `sandbox: {write: [...]}` grants."""
    uid, gid = kernel_ids()
    rooms = [str(r) for r in rooms]
    for room in rooms:
        os.makedirs(room, exist_ok=True)
        if uid != os.getuid():
            give(room, uid, gid)
    for folder in settings.get("write") or []:
        st = os.stat(folder)
        if uid != os.getuid() and not (st.st_uid == uid or st.st_mode & 0o002):
            raise SandboxError(f"sandbox.write: {folder} cannot be written by uid {uid}, the uid of sandboxed "
                               f"kernels of a runner running as root: `chown -R {uid} {folder}`, or run primefs "
                               "as a normal user")
        rooms.append(folder)
    return {"settings": settings, "workspace": str(workspace), "rooms": rooms, "cwd": str(cwd), "uid": uid,
            "gid": gid, "sockets_host": sockets, "hide": [str(h) for h in hide],
            "hide_files": [str(f) for f in hide_files],
            "cgroup": cgroup.folders if cgroup else []}


def give(path, uid: int, gid: int) -> None:
    """Make the folder `path` (and what is in it) the kernel's, when it is not yet. Never through a link:
    a room that is a link (made by a kernel without a sandbox) is refused, and what is inside is changed
    through folder descriptors (a folder swapped for a link meanwhile is not entered)."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise SandboxError(f"{path} is not a folder (a link?): refusing to give it to the kernel's uid {uid}")
    if st.st_uid == uid:
        return
    os.lchown(path, uid, gid)
    for _folder, dirs, files, dirfd in os.fwalk(path, follow_symlinks=False):
        for name in dirs + files:
            try:
                os.chown(name, uid, gid, dir_fd=dirfd, follow_symlinks=False)
            except OSError:
                pass


def run_in_box(box: dict | None, argv: list[str], timeout: float, env: dict, cwd=None) -> tuple[int | None, str]:
    """Run a program in a sandbox (or, with no box, as it is, in `cwd`): (exit code, or None if it ran
    over `timeout` and was ended with all it started; its output)."""
    import subprocess

    if box is not None:  # -P and "/": nothing of the room (where it goes) is on the launcher's sys.path
        argv, cwd = [sys.executable, "-P", "-m", "primefs.kernels.sandbox", json.dumps(box), "--", *argv], "/"
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=env, cwd=cwd, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        code = proc.returncode
    except subprocess.TimeoutExpired:  # the group; in a box the rest dies with its pid namespace
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        out, _ = proc.communicate()
        code = None
    return code, out.decode("utf-8", errors="replace")


_MACHINE: dict = {}
_MACHINE_LOCK = threading.Lock()  # one probe at a time: the runner's start and a first kernel
NONE_HERE = ("no sandbox can be had on this machine, so kernels run without one, with your user's rights "
             "(docs/reliability.md, \"Threat model\"); set `sandbox: off` to say you know")


def unavailable() -> str | None:
    """Why no sandbox can be had on this machine (None: it can). Found once per process, by running
    `true` in one (~70 ms: the runner starts it at once, beside the kernel template's imports)."""
    with _MACHINE_LOCK:
        return _probe()


def _probe() -> str | None:
    if "why" not in _MACHINE:
        import shutil
        import tempfile

        folder = tempfile.mkdtemp(prefix="primefs-probe-")
        try:
            os.chmod(folder, 0o755)
            settings = {"network": False, "memory_mb": 256, "cpu_s": 10, "processes": 16, "open_files": 64,
                        "disk_mb": 1}
            box = box_for(settings, folder, [os.path.join(folder, "room")], os.path.join(folder, "room"))
            env = {k: os.environ[k] for k in ("PATH", "PYTHONPATH") if k in os.environ}
            code, out = run_in_box(box, ["true"], 30, env)
            lines = [ln for ln in out.splitlines() if ln.strip()]
            _MACHINE["why"] = None if code == 0 else (lines[-1] if lines else f"exit status {code}")
        except (OSError, SandboxError) as exc:
            _MACHINE["why"] = str(exc)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    return _MACHINE["why"]


def weaker_limits() -> str | None:
    """What the sandbox limits less well on this machine (once per process): without a writable cgroup,
    memory and CPU seconds count per process, not over a kernel's whole tree."""
    if "limits" not in _MACHINE:  # (a race makes two probes: both give the same answer)
        probe = Cgroup.make(f"probe-{os.getpid()}", "probe", 64, 16)
        if probe is not None:
            probe.remove()
            remove_group(f"probe-{os.getpid()}")
        _MACHINE["limits"] = None if probe else (
            "no cgroup can be made here: memory (sandbox.memory_mb) and CPU seconds (sandbox.cpu_s) are capped per "
            "process, not over all the processes of a kernel; processes are still capped per kernel")
    return _MACHINE["limits"]


def machine_notes(box: dict | None) -> tuple[dict | None, list[str]]:
    """What this machine makes of a checked `sandbox:` setting: the box to use (None: none) and what to
    say of it. The one check, made by the runner at start (its log) and for each session (its history):
    the default sandbox where none can be had runs without one; limits kept only per process are said."""
    if box is None:
        return None, []
    why = unavailable() if box.get("default") else None
    if why:
        return None, [f"{NONE_HERE}: {why}"]
    limits = weaker_limits()
    return box, [limits] if limits else []
