"""Kernels as local processes, forked from one template process (forkserver.py).

Each kernel gets a token that is never reused; a request on the runner's socket is served only if
its token belongs to a live kernel *and* the calling process (SO_PEERCRED) is that kernel or one of
its descendants. Kernels are non-dumpable, run in their own process group with a scrubbed
environment, and die with the template, which dies with the runner (EOF on its stdin).
"""
from __future__ import annotations

import itertools
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
from pathlib import Path

from .kernelclient import CellResult, KernelClient, connection_info
from .kernelhost import Handler, KernelHandle, KernelHost, KernelSpec
from .rpc import RpcServer
from .sandbox import CGROUP_ROOTS

# Environment variables a kernel may see; everything else (API keys above all) stays in the runner.
SAFE_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TERM", "TZ", "TMPDIR", "SHELL",
            "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHASHSEED")
START_TIMEOUT_S = 60.0


def kernel_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k in SAFE_ENV or k.startswith("LC_")}
    env["PYTHONUNBUFFERED"] = "1"
    env["MPLBACKEND"] = "agg"
    env.setdefault("JUPYTER_PLATFORM_DIRS", "1")
    return env


def process_state(pid: int) -> str | None:
    """The state letter of a process (R, S, Z, ...), None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return None


def parent_pid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def descends_from(pid: int, ancestor: int) -> bool:
    """`pid` is `ancestor` or one of its descendants (walks /proc parents)."""
    for _ in range(64):
        if pid == ancestor:
            return True
        if pid <= 1:
            return False
        pid = parent_pid(pid)
    return False


class LocalKernel(KernelHandle):
    def __init__(self, host: "LocalKernelHost", session_id: str, token: str, pid: int, info: dict, base: Path):
        self.host, self.session_id, self.token, self.pid = host, session_id, token, pid
        self.base = base
        self.dead = False
        self.client = KernelClient(info, alive=self.alive, interrupt=self.interrupt)

    def execute(self, code: str, timeout: float | None = None, on_timeout=None) -> CellResult:
        return self.client.execute(code, timeout=timeout, on_timeout=on_timeout)

    def evaluate(self, expr: str, timeout: float = 60.0) -> str:
        return self.client.evaluate(expr, timeout)

    def alive(self) -> bool:
        return not self.dead and process_state(self.pid) not in (None, "Z", "X")

    def connection(self) -> dict | None:
        return dict(self.client.info)

    def interrupt(self) -> None:
        if not self.dead:
            try:
                os.killpg(self.pid, signal.SIGINT)
            except OSError:
                pass

    def shutdown(self) -> None:
        self.host.forget(self)
        self.client.close()
        if not self.dead:
            self.dead = True
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except OSError:
                pass
        for i in range(1, 6):
            _unlink(Path(f"{self.base}-{i}"))
        for root in CGROUP_ROOTS:  # a sandboxed kernel's pids cgroup (as root), empty once it is gone
            try:
                os.rmdir(os.path.join(root, f"primefs-{os.getuid()}", self.base.name))
            except OSError:
                pass
        log = Path(f"{self.base}.log")
        try:
            if log.stat().st_size == 0:
                log.unlink()
        except OSError:
            pass


class LocalKernelHost(KernelHost):
    name = "local"

    def __init__(self, runtime_dir: Path, cwd: Path, handler: Handler, log=lambda msg: None):
        self.dir = Path(runtime_dir) / "kernels"
        self.dir.mkdir(parents=True, exist_ok=True)
        for stale in self.dir.iterdir():  # left by a killed runner (one runner per workspace: ours now)
            _unlink(stale)
        for root in CGROUP_ROOTS:  # empty pids cgroups of sandboxed kernels that are gone
            folder = os.path.join(root, f"primefs-{os.getuid()}")
            for name in os.listdir(folder) if os.path.isdir(folder) else []:
                try:
                    os.rmdir(os.path.join(folder, name))
                except OSError:
                    pass
        self.cwd = Path(cwd)
        self.handler = handler
        self.log = log
        self.closed = False
        self._lock = threading.Lock()
        self._by_token: dict[str, LocalKernel] = {}
        self._by_pid: dict[int, LocalKernel] = {}
        self._ids = itertools.count(1)
        self._waiting: dict[int, list] = {}  # request id -> [event, reply]
        self._server: subprocess.Popen | None = None
        self._ready = threading.Event()
        self.rpc = RpcServer(Path(runtime_dir) / "rpc.sock", self._serve)
        self._start_server()  # in the background: its imports overlap with the runner's own start

    # -- the template process ---------------------------------------------------------------------
    def _start_server(self) -> None:
        self._ready.clear()
        log = open(self.dir / "forkserver.log", "ab")
        self._server = subprocess.Popen([sys.executable, "-m", "primefs.forkserver"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=log, env=kernel_env(), cwd=self.cwd,
                                        start_new_session=True, close_fds=True)
        log.close()
        threading.Thread(target=self._read, args=(self._server,), name="primefs-forkserver", daemon=True).start()

    def _read(self, server: subprocess.Popen) -> None:
        for line in server.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if msg.get("ready"):
                self._ready.set()
            elif "exited" in msg:
                with self._lock:
                    k = self._by_pid.get(msg["exited"])
                if k is not None:
                    k.dead = True
            elif "id" in msg:
                with self._lock:
                    slot = self._waiting.get(msg["id"])
                if slot is not None:
                    slot[1] = msg
                    slot[0].set()
        # the template is gone (and with it, through PR_SET_PDEATHSIG, every kernel it forked)
        with self._lock:
            for k in self._by_pid.values():
                k.dead = True
            for slot in self._waiting.values():
                slot[1] = {"error": "the kernel template process exited"}
                slot[0].set()
        self._ready.set()

    def _spawn(self, request: dict) -> int:
        with self._lock:
            if self._server is None or self._server.poll() is not None:
                if not self.closed:
                    self.log("warning: the kernel template process is gone; starting a new one")
                    self._start_server()
        if not self._ready.wait(START_TIMEOUT_S) or self._server.poll() is not None:
            raise RuntimeError(f"the kernel template process did not start; see {self.dir / 'forkserver.log'}")
        rid = next(self._ids)
        slot = [threading.Event(), None]
        with self._lock:
            self._waiting[rid] = slot
            try:
                self._server.stdin.write((json.dumps({**request, "id": rid}) + "\n").encode())
                self._server.stdin.flush()
            except (OSError, ValueError) as exc:
                self._waiting.pop(rid, None)
                raise RuntimeError(f"cannot reach the kernel template process: {exc}") from None
        slot[0].wait(START_TIMEOUT_S)
        with self._lock:
            self._waiting.pop(rid, None)
        reply = slot[1] or {"error": "no answer from the kernel template process"}
        if "pid" not in reply:
            raise RuntimeError(f"kernel start failed: {reply.get('error')}")
        return int(reply["pid"])

    # -- kernels ----------------------------------------------------------------------------------
    def start(self, spec: KernelSpec) -> LocalKernel:
        if self.closed:
            raise RuntimeError("the kernel host is closed (the runner is stopping)")
        token = secrets.token_hex(16)  # per kernel, never reused: a restarted kernel gets a new one
        base = self.dir / f"{spec.session_id}-{next(self._ids)}"
        info = connection_info(base)
        setup = {**spec.setup, "sock": str(self.rpc.path), "token": token, "session_id": spec.session_id}
        env = kernel_env()
        box = None
        if spec.sandbox:  # writable: the workspace and our socket folder, nothing else
            box = {"settings": spec.sandbox, "writable": [str(spec.cwd), str(self.rpc.path.parent)],
                   "tmpdir": spec.tmpdir or str(spec.cwd / ".primefs" / "tmp"), "name": base.name}
            env["MALLOC_ARENA_MAX"] = "2"  # glibc reserves 64 MB of address space per thread otherwise
        pid = self._spawn({"op": "spawn", "conn": info, "cwd": str(spec.cwd), "env": env, "setup": setup,
                           "log": f"{base}.log", "sandbox": box})
        k = LocalKernel(self, spec.session_id, token, pid, info, base)
        with self._lock:
            self._by_token[token] = k
            self._by_pid[pid] = k
        try:
            k.client.wait_ready(START_TIMEOUT_S, cancelled=lambda: self.closed)
        except RuntimeError as exc:  # say why, from the kernel's own last words
            why = _last_line(Path(f"{base}.log"))
            k.shutdown()
            raise RuntimeError(f"{exc}{': ' + why if why else ''}") from None
        except BaseException:
            k.shutdown()
            raise
        return k

    def forget(self, k: LocalKernel) -> None:
        with self._lock:
            self._by_token.pop(k.token, None)
            if self._by_pid.get(k.pid) is k:
                self._by_pid.pop(k.pid)

    def kernel_pids(self) -> list[int]:
        with self._lock:
            return sorted(self._by_pid)

    def _serve(self, token: str, peer: int, op: str, args: dict):
        with self._lock:
            k = self._by_token.get(token)
        if k is None or k.dead:
            raise PermissionError("request refused: unknown or expired kernel token")
        if not descends_from(peer, k.pid):
            raise PermissionError("request refused: the caller is not a process of the kernel this token "
                                  "was issued to")
        return self.handler(k.session_id, op, args)

    def close(self) -> None:
        self.closed = True
        with self._lock:
            kernels = list(self._by_token.values())
        for k in kernels:
            k.shutdown()
        server = self._server
        if server is not None:
            try:
                server.stdin.close()  # EOF: the template kills what is left and exits
            except OSError:
                pass
            try:
                server.wait(5)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(5)
        self.rpc.close()


def _last_line(path: Path) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1].strip()[:500] if lines else ""


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass
