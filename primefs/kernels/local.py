"""Kernels as local processes, forked from one template process (forkserver.py).

Each kernel gets a signing key and a token that are never reused and never pass through the template:
the kernel fetches them itself (`hello`, once, from the process tree of the pid the template reported).
A request on the runner's socket is served only if its token belongs to a live kernel *and* the calling
process (SO_PEERCRED) is that kernel or one of its descendants. Kernels are non-dumpable, run in their own
process group with a scrubbed environment, and die with the template, which dies with the runner (EOF on
its stdin). A sandboxed kernel (sandbox.py) sees only its own socket folder, at sandbox.SOCKETS.
"""
from __future__ import annotations

import itertools
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Iterator

from primefs.kernels import boxes, cgroups, sandbox, treelimits
from primefs.kernels.client import CellResult, KernelClient, connection_info
from primefs.kernels.forkserver import kill_tree
from primefs.kernels.host import Handler, KernelHandle, KernelHost, KernelSpec
from primefs.kernels.inside.rpc import RpcServer
from primefs.kernels.treelimits import room_bytes  # noqa: F401 - re-exported

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


def ancestors(pid: int) -> Iterator[int]:
    """`pid`, its parent, theirs, ... (walks /proc parents; at most 64, up to init)."""
    for _ in range(64):
        yield pid
        if pid <= 1:
            return
        pid = parent_pid(pid)


def descends_from(pid: int, ancestor: int) -> bool:
    """`pid` is `ancestor` or one of its descendants."""
    return ancestor in ancestors(pid)


class LocalKernel(KernelHandle):
    def __init__(self, host: "LocalKernelHost", spec: KernelSpec, token: str, pid: int, info: dict, base: Path,
                 cgroup: cgroups.Cgroup | None):
        self.host, self.session_id, self.token, self.pid = host, spec.session_id, token, pid
        self.spec, self.base, self.cgroup = spec, base, cgroup
        self.dead = False
        self.requests = 0  # its requests being served now
        self.client = KernelClient(info, alive=self.alive, interrupt=self.interrupt)

    def execute(self, code: str, timeout: float | None = None, on_timeout=None, stop=None) -> CellResult:
        return self.client.execute(code, timeout=timeout, on_timeout=on_timeout, stop=stop)

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

    def kill(self, why: str | None = None) -> None:
        """End the kernel and everything it started (its cgroup, its pid namespace, or its tree)."""
        if why and not self.lost:
            self.lost = why
        if not self.dead:
            self.dead = True
            kill_tree(self.pid)
        if self.cgroup is not None:
            self.cgroup.kill()

    def shutdown(self) -> None:
        self.host.forget(self)
        self.client.close()
        self.kill()
        shutil.rmtree(self.base, ignore_errors=True)
        if self.cgroup is not None:
            self.cgroup.remove()
        log = Path(f"{self.base}.log")
        try:
            if log.stat().st_size == 0:
                log.unlink()
        except OSError:
            pass


class LocalKernelHost(KernelHost):
    name = "local"

    def __init__(self, runtime_dir: Path, cwd: Path, handler: Handler, log=lambda msg: None):
        self.runtime = Path(runtime_dir).resolve()
        self.dir = self.runtime / "kernels"
        self.dir.mkdir(parents=True, exist_ok=True)
        for stale in self.dir.iterdir():  # left by a killed runner (one runner per workspace: ours now)
            shutil.rmtree(stale, ignore_errors=True) if stale.is_dir() else _unlink(stale)
        cgroups.remove_stale_cgroups(self.runtime.name)
        self.cwd = Path(cwd)
        self.handler = handler
        self.log = log
        self.closed = False
        self._lock = threading.Lock()
        self._by_token: dict[str, LocalKernel] = {}
        self._by_pid: dict[int, LocalKernel] = {}
        self._ids = itertools.count(1)
        self._waiting: dict[int, list] = {}  # request id -> [event, reply]
        self._hellos: dict[int, dict] = {}  # request id -> {key, token, pid, known}: what its kernel fetches
        self._server: subprocess.Popen | None = None
        self._ready = threading.Event()
        self.rpc = RpcServer(self.runtime / "rpc.sock", self._serve, owner=self._owner)
        if os.getuid() == 0:  # sandboxed kernels run as nobody; the folder is root's alone (0700)
            os.chmod(self.rpc.path, 0o666)
        self._watch: threading.Thread | None = None
        self._start_server()  # in the background: its imports overlap with the runner's own start

    # -- the template process ---------------------------------------------------------------------
    def _start_server(self) -> None:
        self._ready.clear()
        log = open(self.dir / "forkserver.log", "ab")
        # -P: the working folder (the workspace) is not on sys.path: a module planted there never loads
        self._server = subprocess.Popen([sys.executable, "-P", "-m", "primefs.kernels.forkserver"], stdin=subprocess.PIPE,
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
                    hello = self._hellos.get(msg["id"])
                if hello is not None and "pid" in msg:
                    hello["pid"] = int(msg["pid"])
                    hello["known"].set()
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

    def _spawn(self, rid: int, request: dict) -> int:
        with self._lock:
            if self._server is None or self._server.poll() is not None:
                if not self.closed:
                    self.log("warning: the kernel template process is gone; starting a new one")
                    self._start_server()
        if not self._ready.wait(START_TIMEOUT_S) or self._server.poll() is not None:
            raise RuntimeError(f"the kernel template process did not start; see {self.dir / 'forkserver.log'}")
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
        rid = next(self._ids)
        token = secrets.token_hex(16)  # per kernel, never reused: a restarted kernel gets a new one
        base = self.dir / f"{spec.session_id}-{rid}"  # its sockets; a sandboxed kernel sees only this folder
        base.mkdir(mode=0o700)
        Path(spec.cwd).mkdir(parents=True, exist_ok=True)
        info = connection_info(base / "k")
        conn, sock = {k: v for k, v in info.items() if k != "key"}, str(self.rpc.path)
        env, box, cgroup = kernel_env(), None, None
        hello = {"key": info["key"], "token": token, "pid": None, "known": threading.Event(), "owner": spec.owner}
        with self._lock:
            self._hellos[rid] = hello
        try:
            if spec.sandbox:
                box, cgroup = self._box(spec, base)
                conn["ip"], sock = f"{sandbox.SOCKETS}/k", f"{sandbox.SOCKETS}/rpc"
                env["MALLOC_ARENA_MAX"] = "2"  # glibc reserves 64 MB of address space per thread otherwise
            pid = self._spawn(rid, {"op": "spawn", "conn": conn, "sock": sock, "cwd": str(spec.cwd), "env": env,
                                    "setup": {**spec.setup, "session_id": spec.session_id}, "log": f"{base}.log",
                                    "sandbox": box})
        except BaseException:
            with self._lock:
                self._hellos.pop(rid, None)
            shutil.rmtree(base, ignore_errors=True)
            if cgroup is not None:
                cgroup.remove()
            raise
        k = LocalKernel(self, spec, token, pid, info, base, cgroup)
        with self._lock:
            self._by_token[token] = k
            self._by_pid[pid] = k
        try:
            k.client.wait_ready(START_TIMEOUT_S, cancelled=lambda: self.closed)
            if box is not None and box["uid"] != os.getuid():  # its sockets are bound: the folder is ours
                os.chown(base, os.getuid(), os.getgid())  # again (none of them can be swapped for a link)
                os.chmod(base, 0o755)
        except RuntimeError as exc:  # say why, from the kernel's own last words
            why = _last_line(Path(f"{base}.log"))
            k.shutdown()
            raise RuntimeError(f"{exc}{': ' + why if why else ''}") from None
        except BaseException:
            k.shutdown()
            raise
        finally:
            with self._lock:
                self._hellos.pop(rid, None)
        if cgroup is not None or spec.sandbox:
            self._start_watch()
        return k

    def _box(self, spec: KernelSpec, base: Path) -> tuple[dict, cgroups.Cgroup | None]:
        """What sandbox.enter() needs for this kernel, and its cgroup (None where no cgroup can be made:
        then limits are per process)."""
        uid, gid = sandbox.kernel_ids()
        os.link(self.rpc.path, base / "rpc")  # the runner's socket, seen inside as SOCKETS/rpc
        if uid != os.getuid():
            os.chown(base, uid, gid)
        settings = spec.sandbox
        cgroup = cgroups.Cgroup.make(self.runtime.name, base.name, int(settings["memory_mb"]), int(settings["processes"]))
        box = boxes.box_for(settings, spec.workspace, spec.rooms, spec.cwd, sockets=str(base),
                              hide=[self.runtime.parent], hide_files=spec.hidden, cgroup=cgroup)
        return box, cgroup

    # -- limits over a kernel's tree (treelimits.py) ------------------------------------------------
    def _start_watch(self) -> None:
        with self._lock:
            if self._watch is None:
                self._watch = threading.Thread(target=treelimits.watch, args=(self._watched, lambda: self.closed),
                                               name="primefs-kernel-limits", daemon=True)
                self._watch.start()

    def _watched(self) -> list[LocalKernel]:
        """The live sandboxed kernels: those whose tree's limits are watched."""
        with self._lock:
            return [k for k in self._by_token.values() if k.spec.sandbox and not k.dead]

    def forget(self, k: LocalKernel) -> None:
        with self._lock:
            self._by_token.pop(k.token, None)
            if self._by_pid.get(k.pid) is k:
                self._by_pid.pop(k.pid)

    def kernel_pids(self) -> list[int]:
        with self._lock:
            return sorted(self._by_pid)

    def _owner(self, pid: int) -> str:
        """Whose a calling process is: the owner of the kernel it is or descends from (a kernel still starting
        too), "" if none (the shares of the requests the runner reads at once: inside/rpc.py)."""
        for p in ancestors(pid):
            with self._lock:  # (a look per step: no copy of every kernel at every request)
                k = self._by_pid.get(p)
                owner = k.spec.owner if k is not None else \
                    next((h["owner"] for h in self._hellos.values() if h["pid"] == p), None)
            if owner is not None:
                return owner
        return ""

    def _serve(self, token: str, peer: int, op: str, args: dict):
        if op == "hello":
            return self._hello(peer, args.get("spawn"))
        with self._lock:
            k = self._by_token.get(token)
        if k is None or k.dead:
            raise PermissionError("request refused: unknown or expired kernel token")
        if not descends_from(peer, k.pid):
            raise PermissionError("request refused: the caller is not a process of the kernel this token "
                                  "was issued to")
        with self._lock:
            if k.requests >= MAX_REQUESTS:  # one kernel cannot take every thread of the runner
                raise PermissionError(f"request refused: this kernel has {MAX_REQUESTS} requests waiting already")
            k.requests += 1
        try:
            return self.handler(k.session_id, op, args)
        finally:
            with self._lock:
                k.requests -= 1

    def _hello(self, peer: int, rid) -> dict:
        """A new kernel's key and token: once, and only to the process tree the template forked for it."""
        with self._lock:
            hello = self._hellos.get(rid) if isinstance(rid, int) else None
        if hello is None or not hello["known"].wait(START_TIMEOUT_S) or not descends_from(peer, hello["pid"]):
            raise PermissionError("request refused: no kernel of this caller is starting")
        with self._lock:
            if self._hellos.pop(rid, None) is None:
                raise PermissionError("request refused: this kernel's key was handed out already")
        return {"key": hello["key"], "token": hello["token"]}

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
        cgroups.remove_group(self.runtime.name)


MAX_REQUESTS = 256  # requests one kernel may have waiting at once (threads blocked in wait(), llm(), ...)


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
