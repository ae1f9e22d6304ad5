"""The kernel template: imports ipykernel, IPython and primefs.kernels.inside.api once, then forks a fresh
kernel per request (~30 ms and ~0.02 CPU-s here, against ~0.9 s and ~0.74 CPU-s for a new process).

Run by the runner as `python -m primefs.kernels.forkserver`, with a scrubbed environment. Forked kernels inherit
this process's memory, so no secret is ever in it: a spawn request carries no key and no token. The
kernel asks for its own, once, over the runner's socket (`hello`), after it has entered its sandbox; the
runner answers only the process tree of the pid this template reported for that request. The template
is non-dumpable: other processes of the user cannot read its memory. Protocol on stdin/stdout, one
JSON object per line:

    -> {"op": "spawn", "id": N, "conn": {connection info, no key}, "sock": PATH, "cwd": DIR, "env": {...},
        "setup": {kernel_api.setup keyword arguments}, "log": FILE, "sandbox": BOX or null}
    <- {"id": N, "pid": PID}  or  {"id": N, "error": "..."}
    <- {"exited": PID, "status": "exit 0" | "signal 9"}     whenever a kernel ends
    <- {"ready": true}                                       once, after the imports

Before a fork this process holds no thread and no zmq context (forking either is unsafe). EOF on
stdin means the runner is gone (however it died): every kernel and what it started is killed and the
template exits. Each kernel runs in its own session and process group, dies with the template
(PR_SET_PDEATHSIG), is non-dumpable, and (unsandboxed) is a subreaper, so what it starts stays in its
tree and is killed with it; a sandboxed kernel is the first process of its own pid namespace (sandbox.py).
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
        "encodings.idna", "unicodedata", "dill", "primefs.kernels.inside.api", "primefs.kernels.inside.snapshot",
        "primefs.kernels.inside.tools", "primefs.kernels.sandbox")

PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER = 1, 4, 36
START_TIMEOUT_S = 60.0


def _prctl(option: int, value: int) -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except Exception:  # not Linux: no parent-death signal, no dumpable flag
        pass


def hide_from_same_user() -> None:
    """Make this process non-dumpable (Linux): other processes of the same user, kernels among them, can
    then not read its memory or /proc/<pid>/environ. No effect against root."""
    _prctl(PR_SET_DUMPABLE, 0)


def descendants(pid: int) -> list[int]:
    """`pid`'s descendants now (Linux /proc), children before grandchildren: from each process's own list of
    children (/proc/<pid>/task/<tid>/children: a process's children are those of all its threads), not a look
    at every process of the machine (a kernel's end cost ~10 ms of CPU that way, with many processes)."""
    out, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue  # gone already
        for tid in tasks:
            try:
                with open(f"/proc/{parent}/task/{tid}/children", "rb") as f:
                    kids = [int(c) for c in f.read().split()]
            except FileNotFoundError:  # a kernel built without CONFIG_PROC_CHILDREN: look at every process
                return _descendants_by_scan(pid)
            except (OSError, ValueError):
                continue
            out += kids
            todo += kids
    return out


def _descendants_by_scan(pid: int) -> list[int]:
    parents: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(name))
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_tree(pid: int) -> None:
    """SIGKILL a kernel's process group and every process it started, also those that left the group
    (`setsid`): they stay in its tree because the kernel is a subreaper."""
    for _ in range(3):
        rest = descendants(pid)
        for p in [pid, *rest]:
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        if not rest:
            return


def warm() -> None:
    import importlib

    for name in WARM:
        try:
            importlib.import_module(name)
        except Exception:  # an optional piece missing only costs time later
            pass
    from primefs.kernels import sandbox

    sandbox.python_paths()  # once here, not in every forked kernel
    try:  # a cell parsed once here: tokenize's and IPython's regular expressions, compiled on the first cell
        from IPython.core.inputtransformer2 import TransformerManager  # (4.6 ms), stay compiled in every kernel

        compile(TransformerManager().transform_cell("x = 1 + 1\n"), "<warm>", "exec")
    except Exception:  # only costs time later
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
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)
    # SIGINT stays ignored until this is the kernel: a sandbox's keeper process outside must not stop
    null = os.open(os.devnull, os.O_RDONLY)
    log = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(null, 0)
    os.dup2(log, 1)  # stray output of C code and subprocesses; cells' output goes to iopub
    os.dup2(log, 2)
    os.closerange(3, 1 << 30)  # the control pipe above all: a kernel must not hold the runner's pipe
    os.environ.clear()
    os.environ.update(req["env"])
    sys.stdout = sys.__stdout__ = open(1, "w", buffering=1, closefd=False)
    sys.stderr = sys.__stderr__ = open(2, "w", buffering=1, closefd=False)
    try:
        os.chdir(req["cwd"])
        if req.get("sandbox"):
            from primefs.kernels import sandbox

            sandbox.enter(req["sandbox"])  # returns in the sandboxed kernel; this process waits outside
        else:
            _prctl(PR_SET_DUMPABLE, 0)
            _prctl(PR_SET_CHILD_SUBREAPER, 1)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from primefs.kernels.inside.rpc import call

        mine = call(req["sock"], "", "hello", {"spawn": req["id"]}, timeout=START_TIMEOUT_S)
        app = _make_app({**req["conn"], "key": mine["key"]})
        app.initialize([])
        import primefs.kernels.inside.api as api
        from primefs.kernels.inside.cells import keep_recent

        api.route_thread_output(app.kernel.shell)
        keep_recent(app.kernel.shell)
        api.setup(app.kernel.shell.user_ns, **req["setup"], sock=req["sock"], token=mine["token"])
        del mine
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

        def parse_command_line(self, argv=None):
            # There is none (initialize([])): building the parser of every option to parse nothing was
            # ~3 ms of CPU of a kernel's ~30 ms start, paid once per child in a fan-out.
            self.argv, self.extra_args = [], []

    c = Config()
    c.Session.key = conn["key"].encode()
    c.Session.signature_scheme = conn.get("signature_scheme", "hmac-sha256")
    c.HistoryManager.enabled = False  # no sqlite file, no writer thread
    c.Session.digest_history_size = 1024  # as its client's (client.py): the kernel lives for days
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
    hide_from_same_user()
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
        kill_tree(pid)


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
