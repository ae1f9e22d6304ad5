"""The kernel sandbox: entered by a freshly forked kernel process before it runs any code.

- no network: a network namespace of its own (only a loopback, down);
- writes only inside the workspace: a mount namespace where every mount is read-only except the
  workspace, the runner's socket folder and a private /dev/shm; the mounts are then locked by a
  second user namespace, so code in the kernel cannot make them writable again;
- memory (RLIMIT_AS), CPU seconds (RLIMIT_CPU), open files (RLIMIT_NOFILE) and processes+threads:
  RLIMIT_NPROC, which Linux enforces per user namespace for everyone but uid 0; for a runner running as
  root, a pids cgroup per kernel does it (when a pids cgroup hierarchy is writable).
The kernel's own user namespace maps its uid to the runner's, so files it writes are the runner's.
Works as root and as a normal user where unprivileged user namespaces are allowed (Debian, Ubuntu,
Fedora by default). Anything that cannot be set up stops the kernel with the reason: a session asked
for a sandbox never runs without one.
"""
from __future__ import annotations

import ctypes
import os
import resource

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET = 0x00020000, 0x10000000, 0x40000000
MS_BIND, MS_REC, MS_PRIVATE = 4096, 0x4000, 1 << 18
MOUNT_ATTR_RDONLY, AT_RECURSIVE, AT_FDCWD, SYS_MOUNT_SETATTR = 0x1, 0x8000, -100, 442
CGROUP_ROOTS = ("/sys/fs/cgroup/pids", "/sys/fs/cgroup")  # cgroup v1 pids hierarchy, or a v2 root


class SandboxError(RuntimeError):
    pass


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise SandboxError(f"{what}: {os.strerror(err)}")


def _own_namespaces(uid: int, gid: int, flags: int) -> None:
    _check(_libc.unshare(flags), "cannot create namespaces (are unprivileged user namespaces allowed?)")
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"{uid} {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"{gid} {gid} 1")


def _set_read_only(path: str, read_only: bool) -> None:
    attr = _MountAttr(MOUNT_ATTR_RDONLY if read_only else 0, 0 if read_only else MOUNT_ATTR_RDONLY, 0, 0)
    _check(_libc.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, path.encode(), AT_RECURSIVE, ctypes.byref(attr),
                         ctypes.sizeof(attr)), f"cannot make {path} {'read-only' if read_only else 'writable'}")


def weaknesses() -> list[str]:
    """What a sandbox cannot enforce on this machine (said in a session's log, once)."""
    if os.getuid() == 0 and not any(os.access(os.path.join(r, "cgroup.procs"), os.W_OK) for r in CGROUP_ROOTS):
        return ["processes are not capped: running as root without a writable pids cgroup"]
    return []


def pids_cgroup(name: str, limit: int) -> str | None:
    """As root, a pids cgroup for this process (`limit` processes and threads); None if none is writable."""
    for root in CGROUP_ROOTS:
        if not os.access(os.path.join(root, "cgroup.procs"), os.W_OK):
            continue
        if root == "/sys/fs/cgroup":  # v2: only if the pids controller is there
            try:
                if "pids" not in open(os.path.join(root, "cgroup.controllers")).read().split():
                    continue
            except OSError:
                continue
        folder = os.path.join(root, f"primefs-{os.getuid()}", name)
        try:
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, "pids.max"), "w") as f:
                f.write(str(limit))
            with open(os.path.join(folder, "cgroup.procs"), "w") as f:
                f.write("0")
            return folder
        except OSError:
            continue
    return None


def enter(settings: dict, writable: list[str], tmpdir: str, name: str) -> list[str]:
    """Sandbox this process (a forked kernel, single-threaded). Returns notes on what is weaker than asked."""
    notes = []
    uid, gid = os.getuid(), os.getgid()
    if uid == 0 and pids_cgroup(name, int(settings["processes"])) is None:
        notes.append("processes are not capped: running as root without a writable pids cgroup")
    mb = 1024 * 1024
    for limit, value in ((resource.RLIMIT_AS, int(settings["memory_mb"]) * mb),
                         (resource.RLIMIT_CPU, int(settings["cpu_s"])),
                         (resource.RLIMIT_NOFILE, int(settings["open_files"])),
                         (resource.RLIMIT_NPROC, int(settings["processes"]))):
        hard = value + 5 if limit == resource.RLIMIT_CPU else value  # SIGXCPU first, then SIGKILL
        resource.setrlimit(limit, (value, hard))
    os.makedirs(tmpdir, exist_ok=True)
    flags = CLONE_NEWUSER | CLONE_NEWNS | (0 if settings.get("network") else CLONE_NEWNET)
    _own_namespaces(uid, gid, flags)
    _check(_libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "cannot make mounts private")
    _check(_libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", 0, b"size=64m,mode=1777"), "cannot mount /dev/shm")
    for path in writable:
        _check(_libc.mount(path.encode(), path.encode(), None, MS_BIND | MS_REC, None), f"cannot bind {path}")
    _set_read_only("/", True)
    # /proc stays as it was: it holds no files of the host to write, and the user namespace below needs it
    for path in [*writable, "/dev/shm", "/proc"]:
        _set_read_only(path, False)
    # A second user namespace locks the mounts as they are now: read-only stays read-only.
    _own_namespaces(uid, gid, CLONE_NEWUSER | CLONE_NEWNS)
    os.chdir(os.getcwd())  # the working directory again, through the writable bind, not the mount below
    os.environ["TMPDIR"] = tmpdir
    import tempfile

    tempfile.tempdir = tmpdir  # the template may have cached /tmp already
    return notes
