"""The kernel sandbox: one room per session, a process boundary, limits that count the kernel's tree.

Entered by a freshly forked, single-threaded process (a kernel from the template, or an end-condition
command) before it runs anything of the model's. `enter(box)` returns in the sandboxed process only:

    C (forked by the template; runs only this module)  --fork-->  K (the kernel: pid 1 of its own pid namespace)

- **pid namespace**: K sees and signals only its own processes; when K ends, the kernel kills every process
  left in it (a `setsid` child too). C waits for K and exits with its status.
- **mounts**: a mount namespace where everything is read-only except the session's room (its `work/` and
  `kernel/` folders, and what a person's `sandbox: {write: [...]}` grants), a private `/tmp` and `/dev/shm`
  (memory-backed). `/tmp`, `/var/tmp`, `/run` (without network), the runner's home and runtime folder are
  hidden behind empty mounts: the runtime folder's sockets and requests are not reachable, nor host unix
  sockets in the usual places. What the kernel must still read there (the workspace, Python and its
  packages) is bound back in, read-only. `/proc` is the kernel's own, read-only.
- **identity**: a user namespace of its own, locking the mounts (read-only stays read-only), with an
  unprivileged uid: as root, kernels run as uid 65534 (nobody), never uid 0; as a normal user, as that
  user. No capabilities, no_new_privs (setuid programs gain nothing), non-dumpable.
- **network**: a network namespace of its own with no interface up (unless `network: true`): no
  connection anywhere, and no abstract unix socket of the host.
- **limits**: a cgroup per kernel where one is writable (memory and processes of the whole tree, CPU time
  of the tree measured by the runner); rlimits always (address space, CPU seconds, open files, file
  size, and processes counted in the kernel's own user namespace, not the user's whole machine).

Works as root and as a normal user where unprivileged user namespaces are allowed (Debian, Ubuntu,
Fedora by default). Anything that cannot be set up stops the process with the reason: a session asked for
a sandbox never runs without one. `python -m primefs.kernels.sandbox BOXFILE -- PROGRAM ARGS` runs a program in a
sandbox (end-condition commands).
"""
from __future__ import annotations

import ctypes
import functools
import json
import os
import resource
import signal
import sys

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_BIND, MS_REC, MS_PRIVATE = 4096, 0x4000, 1 << 18
MOUNT_ATTR_RDONLY, AT_RECURSIVE, AT_FDCWD, SYS_MOUNT_SETATTR = 0x1, 0x8000, -100, 442
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 4, 24, 38
PR_SET_CHILD_SUBREAPER, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 36, 47, 4
NOBODY = 65534  # the uid and gid of kernels when the runner is root
SOCKETS = "/tmp/.primefs"  # where a sandboxed kernel finds its own sockets and the runner's (rpc)


class SandboxError(RuntimeError):
    pass


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        raise SandboxError(f"{what}: {os.strerror(ctypes.get_errno())}")


def prctl(option: int, value: int) -> int:
    return _libc.prctl(option, value, 0, 0, 0)


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(_libc.mount(source and source.encode(), target.encode(), fstype and fstype.encode(), flags,
                       data and data.encode()), f"cannot mount {target}")


def _set_read_only(path: str, read_only: bool) -> None:
    """Read-only: the mount at `path` and every mount below it. Writable: that one mount only (a writable
    /tmp must not make what is bound inside it writable too)."""
    attr = _MountAttr(MOUNT_ATTR_RDONLY if read_only else 0, 0 if read_only else MOUNT_ATTR_RDONLY, 0, 0)
    _check(_libc.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, path.encode(), AT_RECURSIVE if read_only else 0,
                         ctypes.byref(attr),
                         ctypes.sizeof(attr)), f"cannot make {path} {'read-only' if read_only else 'writable'}")


def write_control(path: str, text: str) -> None:
    """Write a kernel's control file (/proc/<pid>/uid_map, a cgroup's limit): in place, never atomically."""
    with open(path, "w") as f:
        f.write(text)


# -- what the kernel still reads behind the hidden folders ------------------------------------------
@functools.lru_cache(maxsize=1)
def python_paths() -> list[str]:
    """Python, its standard library and every package folder this process imports from (editable installs
    included): what a kernel must still read where these lie inside a hidden folder. Found once, in the
    kernel template after its imports (forked kernels inherit the answer)."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             os.path.dirname(os.path.realpath(sys.executable))}
    paths.update(p for p in sys.path if p and os.path.isabs(p))
    for name, module in list(sys.modules.items()):  # editable installs: the package folders themselves
        if name.startswith("__editable__") and isinstance(getattr(module, "MAPPING", None), dict):
            paths.update(module.MAPPING.values())
    return sorted(p for p in paths if os.path.exists(p))


def _traversable(path: str, uid: int) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    if st.st_uid == uid:
        return bool(st.st_mode & 0o100)
    return bool(st.st_mode & 0o001)


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _topmost(paths) -> list[str]:
    real = sorted({os.path.realpath(p) for p in paths})
    return [p for p in real if not any(_under(p, q) and p != q for q in real)]


def _home() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_dir
    except KeyError:
        return ""


def hidden_folders(box: dict, exposed: list[str]) -> list[str]:
    """Folders replaced by an empty mount: temporary and runtime folders (host sockets live there), the
    runner's home, and (as root) any folder on the way to an exposed path that the kernel's uid could not
    pass anyway. Top-most only: a folder inside another is hidden with it."""
    found = ["/tmp", "/var/tmp", "/sys/fs/cgroup", *box.get("hide", [])]
    found += [os.environ.get("HOME") or "", _home()]
    found.append("/run" if not box["settings"].get("network") else f"/run/user/{os.getuid()}")
    uid = box["uid"]
    if uid != os.getuid():
        for path in exposed:
            parts = path.strip("/").split("/")
            for i in range(1, len(parts)):
                folder = "/" + "/".join(parts[:i])
                if not _traversable(folder, uid):
                    found.append(folder)
                    break
    return _topmost(p for p in found if p and p != "/" and os.path.isdir(p))


# -- entering -------------------------------------------------------------------------------------
def enter(box: dict) -> None:
    """Sandbox this process (single-threaded, freshly forked). Returns in the sandboxed child only; the
    calling process stays outside, waits for it and exits with its status.

    `box`: settings (settings.SANDBOX), workspace (read), rooms (written), cwd, uid (the kernel's uid
    outside) and gid, and optionally sockets_host (the kernel's socket folder, seen at SOCKETS inside), hide (more
    folders to hide: the runner's runtime folder), cgroup (folders to join)."""
    _new_pid_namespace(box)
    to_keeper_r, to_keeper_w = os.pipe()
    to_kernel_r, to_kernel_w = os.pipe()
    pid = os.fork()
    if pid:
        os.close(to_keeper_w)
        os.close(to_kernel_r)
        _keep(pid, box, to_keeper_r, to_kernel_w)  # never returns
    os.close(to_keeper_r)
    os.close(to_kernel_w)
    try:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        _build_mounts(box)
        _become_kernel(box, to_keeper_w, to_kernel_r)
        os.close(to_kernel_r)
        os.close(to_keeper_w)
        _set_limits(box["settings"])
        os.chdir(box["cwd"])  # through the room's writable mount, not the read-only one beneath
        os.environ.update({"TMPDIR": "/tmp", "HOME": "/tmp", "IPYTHONDIR": "/tmp/.ipython"})
        import tempfile

        tempfile.tempdir = "/tmp"  # the template may have cached another one
    except BaseException as exc:
        print(f"primefs sandbox: {exc}", file=sys.stderr, flush=True)
        os._exit(1)


def _new_pid_namespace(box: dict) -> None:
    """Join the kernel's cgroups, then unshare the pid namespace whose first process the next fork makes (as
    a normal user, inside a user namespace of our own that maps our own ids)."""
    for folder in box.get("cgroup") or []:
        write_control(os.path.join(folder, "cgroup.procs"), "0")
    if os.getuid() == 0:
        os.setgroups([])
        _check(_libc.unshare(CLONE_NEWPID), "cannot create a pid namespace")
    else:
        _check(_libc.unshare(CLONE_NEWUSER | CLONE_NEWPID),
               "cannot create namespaces (are unprivileged user namespaces allowed?)")
        prctl(PR_SET_DUMPABLE, 1)  # (the template is not): our own uid map is ours to write only then
        _map_ids("self", os.getuid(), os.getgid(), os.getuid(), os.getgid())
    prctl(PR_SET_DUMPABLE, 0)


def _become_kernel(box: dict, to_keeper: int, from_keeper: int) -> None:
    """In the kernel's process, its mounts built: its own user namespace (its uid mapped by the keeper,
    outside), and the other namespaces; the kernel's uid and gid, no capabilities, no_new_privs. Ends the
    process if the keeper is gone already."""
    flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS
    if not box["settings"].get("network"):
        flags |= CLONE_NEWNET
    prctl(PR_SET_DUMPABLE, 1)  # the keeper writes our uid map: /proc/<us> must be ours until then
    _check(_libc.unshare(flags), "cannot create the kernel's user namespace")
    os.write(to_keeper, b"u")
    if os.read(from_keeper, 1) != b"m":  # nothing: the keeper is gone
        raise SandboxError("the uid map of the sandbox could not be written")
    os.setresgid(box["gid"], box["gid"], box["gid"])
    os.setresuid(box["uid"], box["uid"], box["uid"])
    _drop_capabilities()
    _check(prctl(PR_SET_NO_NEW_PRIVS, 1), "cannot set no_new_privs")
    prctl(PR_SET_DUMPABLE, 0)
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # new credentials cleared it
    os.set_blocking(from_keeper, False)  # the first process of a pid namespace has no parent to ask:
    try:  # the keeper holds the other end of this pipe for as long as it lives
        if os.read(from_keeper, 1) == b"":
            os._exit(1)
    except BlockingIOError:
        pass


def _map_ids(pid: str, inner_uid: int, inner_gid: int, outer_uid: int, outer_gid: int) -> None:
    write_control(f"/proc/{pid}/setgroups", "deny")
    write_control(f"/proc/{pid}/uid_map", f"{inner_uid} {outer_uid} 1")
    write_control(f"/proc/{pid}/gid_map", f"{inner_gid} {outer_gid} 1")


def _keep(pid: int, box: dict, from_kernel: int, to_kernel: int) -> None:
    """The process outside: map the kernel's ids once it has its user namespace, then wait for it."""
    try:
        if os.read(from_kernel, 1) == b"u":
            outer = NOBODY if os.getuid() == 0 else os.getuid()
            outer_gid = NOBODY if os.getuid() == 0 else os.getgid()
            _map_ids(str(pid), box["uid"], box["gid"], outer, outer_gid)
            os.write(to_kernel, b"m")  # `to_kernel` stays open while we live: the kernel checks it
    except OSError as exc:
        print(f"primefs sandbox: cannot map the kernel's uid: {exc}", file=sys.stderr, flush=True)
    os.close(from_kernel)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except ChildProcessError:
            os._exit(1)
        except InterruptedError:
            continue
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))


def _build_mounts(box: dict) -> None:
    _check(_libc.unshare(CLONE_NEWNS), "cannot create a mount namespace")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    rooms = [os.path.realpath(p) for p in box["rooms"]]
    exposed = _topmost([box["workspace"], *python_paths()])
    hidden = hidden_folders(box, exposed)
    if not _traversable(os.path.realpath(box["workspace"]), box["uid"]):
        raise SandboxError(f"the workspace {box['workspace']} cannot be read by the kernel's uid {box['uid']}")
    sockets = box.get("sockets_host")
    devices = [d for d in DEVICES if os.path.exists(d)] + sorted(
        os.path.join("/dev", n) for n in os.listdir("/dev") if n.startswith(GPU_DEVICES))
    # Sources are opened now, in this mount namespace, before the hiding mounts cover them.
    fds = {p: os.open(p, os.O_PATH) for p in {*exposed, *rooms, *devices, *([sockets] if sockets else [])}}
    tmp_mb = max(16, int(box["settings"]["memory_mb"]) // 4)
    for folder in hidden:
        mode, size = ("1777", f"{tmp_mb}m") if folder == "/tmp" else ("0755", "1m")
        _mount("tmpfs", folder, "tmpfs", MS_NOSUID | MS_NODEV, f"mode={mode},size={size}")
    for path in exposed:  # parents first: a bind inside another stays visible
        if any(_under(path, h) for h in hidden):
            _bind_into_skeleton(fds[path], path)
    for path in box.get("hide_files") or []:  # a key file outside the workspace reads as empty
        if os.path.isfile(path):
            _mount("/dev/null", path, None, MS_BIND)
    _minimal_dev(devices, fds)
    if sockets:
        os.makedirs(SOCKETS, exist_ok=True)
        _mount(f"/proc/self/fd/{fds[sockets]}", SOCKETS, None, MS_BIND)
    for room in rooms:
        _mount(f"/proc/self/fd/{fds[room]}", room, None, MS_BIND | MS_REC)
    for fd in fds.values():
        os.close(fd)
    _set_read_only("/", True)
    for path in [*rooms, *([SOCKETS] if sockets else []), "/tmp", "/dev/shm"]:
        _set_read_only(path, False)
    _mount("proc", "/proc", "proc", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)


# The devices a kernel gets (the host's others, /dev/fuse or /dev/net/tun, are not there), and GPUs'.
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty")
GPU_DEVICES = ("nvidia", "kfd")


def _minimal_dev(devices: list[str], fds: dict) -> None:
    """A /dev of its own: the few devices above bound in, a new pts instance, a private /dev/shm."""
    _mount("tmpfs", "/dev", "tmpfs", MS_NOSUID, "mode=0755,size=1m")
    for dev in devices:
        open(dev, "w").close()
        _mount(f"/proc/self/fd/{fds[dev]}", dev, None, MS_BIND)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2"), ("ptmx", "pts/ptmx")):
        os.symlink(target, f"/dev/{name}")
    os.makedirs("/dev/pts")
    _mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620")
    os.makedirs("/dev/shm")
    _mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777,size=64m")


def _bind_into_skeleton(fd: int, path: str) -> None:
    if os.path.isdir(f"/proc/self/fd/{fd}"):
        os.makedirs(path, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if not os.path.exists(path):
            open(path, "w").close()
    _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)


def _drop_capabilities() -> None:
    for cap in range(64):
        if prctl(PR_CAPBSET_DROP, cap) != 0 and ctypes.get_errno() == 22:  # EINVAL: past the last one
            break
    _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    data = (_CapData * 2)()
    _check(_libc.capset(ctypes.byref(_CapHeader(0x20080522, 0)), data), "cannot drop capabilities")


def _set_limits(settings: dict) -> None:
    """Set inside the kernel's own user namespace: RLIMIT_NPROC then counts the processes of this kernel,
    not every process its uid has on the machine."""
    mb = 1024 * 1024
    for limit, value in ((resource.RLIMIT_AS, int(settings["memory_mb"]) * mb),
                         (resource.RLIMIT_CPU, int(settings["cpu_s"])),
                         (resource.RLIMIT_NOFILE, int(settings["open_files"])),
                         (resource.RLIMIT_NPROC, int(settings["processes"])),
                         (resource.RLIMIT_FSIZE, int(settings["disk_mb"]) * mb)):
        hard = value + 5 if limit == resource.RLIMIT_CPU else value  # SIGXCPU first, then SIGKILL
        resource.setrlimit(limit, (value, hard))


def kernel_ids() -> tuple[int, int]:
    """The uid and gid a sandboxed kernel has: never root."""
    return (NOBODY, NOBODY) if os.getuid() == 0 else (os.getuid(), os.getgid())


def main(argv: list[str]) -> None:
    """python -m primefs.kernels.sandbox BOX -- PROGRAM ARGS...: run PROGRAM in the box BOX describes (JSON, as
    enter() takes it); the exit status is the program's."""
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m primefs.kernels.sandbox BOX_JSON -- PROGRAM [ARGS...]", file=sys.stderr)
        raise SystemExit(2)
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # a runner that dies takes its end-condition commands along
    enter(json.loads(argv[0]))
    try:
        os.execvp(argv[2], argv[2:])
    except OSError as exc:
        print(f"primefs sandbox: cannot run {argv[2]}: {exc.strerror}", file=sys.stderr, flush=True)
        os._exit(127)


if __name__ == "__main__":
    main(sys.argv[1:])
