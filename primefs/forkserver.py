"""The kernel template: imports ipykernel, IPython and primefs.kernel_api once, then forks a fresh
kernel per request (~30 ms and ~0.02 CPU-s here, against ~0.9 s and ~0.74 CPU-s for a new process).

Run by the runner as `python -m primefs.forkserver`, with a scrubbed environment (forked kernels
inherit this process's memory, so no secret may ever be in it). Protocol on stdin/stdout, one JSON
object per line:

    -> {"op": "spawn", "id": N, "conn": {connection info}, "cwd": DIR, "env": {...},
        "setup": {kernel_api.setup keyword arguments}, "log": FILE}
    <- {"id": N, "pid": PID}  or  {"id": N, "error": "..."}
    <- {"exited": PID, "status": "exit 0" | "signal 9"}     whenever a kernel ends
    <- {"ready": true}                                       once, after the imports

Before a fork this process holds no thread and no zmq context (forking either is unsafe). EOF on
stdin means the runner is gone (however it died): every kernel is killed and the template exits.
Each kernel runs in its own session and process group, dies with the template (PR_SET_PDEATHSIG)
and is non-dumpable (PR_SET_DUMPABLE 0: other processes of the user cannot read its memory).
"""
from __future__ import annotations

import gc
import json
import os
import select
import signal
import sys

# What a kernel imports while it initializes and runs its first cell: imported here once, so a fork
# only has to build objects (ipykernel.debugger alone pulls in debugpy, ~60 ms).
WARM = ("ipykernel.kernelapp", "ipykernel.ipkernel", "ipykernel.zmqshell", "ipykernel.debugger",
        "ipykernel.comm", "IPython.core.completerlib", "IPython.core.debugger", "IPython.core.oinspect",
        "IPython.extensions.storemagic", "IPython.utils.wildcard", "tornado.platform.asyncio",
        "tornado.queues", "tornado.locks", "pdb", "pydoc", "code", "http.server", "xmlrpc.server",
        "encodings.idna", "unicodedata", "dill", "primefs.kernel_api", "primefs.kernel_snapshot",
        "primefs.kernel_tools", "primefs.sandbox")

PR_SET_PDEATHSIG, PR_SET_DUMPABLE = 1, 4


def _prctl(option: int, value: int) -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except Exception:  # not Linux: no parent-death signal, no dumpable flag
        pass


def hide_from_same_user() -> None:
    """Make this process non-dumpable (Linux): other processes of the same user, kernels among them, can
    then not read its memory or /proc/<pid>/environ (API keys, other kernels' tokens). No effect for root."""
    _prctl(PR_SET_DUMPABLE, 0)


def warm() -> None:
    import importlib

    for name in WARM:
        try:
            importlib.import_module(name)
        except Exception:  # an optional piece missing only costs time later
            pass
    gc.collect()
    gc.freeze()  # objects made so far are never scanned again: fewer copy-on-write pages per kernel


def _send(obj: dict) -> None:
    os.write(1, (json.dumps(obj) + "\n").encode())


def _kernel(req: dict, server_pid: int) -> None:
    """In the forked child: become the kernel (never returns)."""
    os.setsid()  # own process group: an interrupt reaches the kernel and its subprocesses only
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != server_pid:  # the template died before the line above took effect
        os._exit(1)
    if not req.get("sandbox"):  # (a sandbox is set up first: its uid maps live in /proc/self, which a
        _prctl(PR_SET_DUMPABLE, 0)  # non-dumpable process does not own)
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    null = os.open(os.devnull, os.O_RDONLY)
    log = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(null, 0)
    os.dup2(log, 1)  # stray output of C code and subprocesses; cells' output goes to iopub
    os.dup2(log, 2)
    os.closerange(3, 256)  # the control pipe above all: a kernel must not hold the runner's pipe
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    sys.stdout = sys.__stdout__ = open(1, "w", buffering=1, closefd=False)
    sys.stderr = sys.__stderr__ = open(2, "w", buffering=1, closefd=False)
    try:
        if req.get("sandbox"):
            from primefs import sandbox

            box = req["sandbox"]
            sandbox.enter(box["settings"], box["writable"], box["tmpdir"], box["name"])
            # new credentials cleared both (commit_creds): set them again, and check the parent is alive
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            _prctl(PR_SET_DUMPABLE, 0)
            if os.getppid() != server_pid:
                os._exit(1)
        app = _make_app(req["conn"])
        app.initialize([])
        import primefs.kernel_api as api

        api.setup(app.kernel.shell.user_ns, **req["setup"])
        app.start()
    except BaseException as exc:  # noqa: BLE001 - the log is all a failed kernel can leave
        print(f"primefs kernel failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        os._exit(1)
    os._exit(0)


def _make_app(conn: dict):
    from ipykernel.kernelapp import IPKernelApp
    from traitlets.config import Config

    class KernelApp(IPKernelApp):
        # The connection info comes from the request, never from or to a file: the signing key
        # only ever exists in the memory of the runner and of this kernel.
        def init_connection_file(self):
            pass

        def write_connection_file(self, **kwargs):
            pass

        def log_connection_info(self):
            pass

    c = Config()
    c.Session.key = conn["key"].encode()
    c.Session.signature_scheme = conn.get("signature_scheme", "hmac-sha256")
    c.HistoryManager.enabled = False  # no sqlite file, no writer thread
    app_cfg = c.IPKernelApp
    app_cfg.transport = conn["transport"]
    app_cfg.ip = conn["ip"]
    for port in ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port"):
        setattr(app_cfg, port, conn[port])
    app_cfg.quiet = True
    return KernelApp(config=c)


def _exit_text(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"signal {os.WTERMSIG(status)}"
    return f"exit {os.WEXITSTATUS(status)}"


def serve() -> None:
    # A blocked signal mask survives fork and exec: started from a thread that blocks signals (as a Ray
    # worker's threads do), the kernels would never see the SIGINT of an interrupt.
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    warm()
    me = os.getpid()
    kernels: set[int] = set()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake select() through the wakeup fd
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in the runner's terminal is the runner's
    _send({"ready": True, "pid": me})
    buf = b""
    while True:
        try:
            readable, _, _ = select.select([0, wake_r], [], [])
        except InterruptedError:
            continue
        if wake_r in readable:
            try:
                while os.read(wake_r, 512):
                    pass
            except BlockingIOError:
                pass
            _reap(kernels)
        if 0 not in readable:
            continue
        data = os.read(0, 65536)
        if not data:  # the runner is gone
            break
        buf += data
        *lines, buf = buf.split(b"\n")
        for line in lines:
            if line.strip():
                _handle(json.loads(line), kernels, me)
    for pid in kernels:
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass


def _handle(req: dict, kernels: set[int], me: int) -> None:
    if req.get("op") != "spawn":
        _send({"id": req.get("id"), "error": f"unknown op {req.get('op')!r}"})
        return
    try:
        pid = os.fork()
    except OSError as exc:
        _send({"id": req["id"], "error": f"fork failed: {exc}"})
        return
    if pid == 0:
        try:
            _kernel(req, me)
        finally:
            os._exit(1)
    kernels.add(pid)
    _send({"id": req["id"], "pid": pid})


def _reap(kernels: set[int]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        kernels.discard(pid)
        _send({"exited": pid, "status": _exit_text(status)})


if __name__ == "__main__":
    serve()
