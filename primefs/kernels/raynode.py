"""The Ray actor on each node: that node's kernels, and their requests on their way to the runner.

One `NodeKernels` actor per node (raykernels.py pins it there) runs a `LocalKernelHost`: a fork
server on this node, kernels forked from it, and the unix socket the kernels call. A request is
checked here exactly as on one machine (the token of a live kernel of this node, and the calling
process, by SO_PEERCRED, in that kernel's process tree); only then is it queued as (session id, op,
args) for the runner, which is the Ray driver: it long-polls `poll()` and answers with `reply()`.
So no kernel port is ever reachable from another machine, and the runner needs no server of its own.

The actor is async (one event loop) and runs each blocking call in a thread: hundreds of cells may
be running at once, each waiting for its kernel. It needs Ray only to be run (never imported here).
"""
from __future__ import annotations

import asyncio
import itertools
import json
import os
import secrets
import socket
import tempfile
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from primefs.kernels.client import CellResult
from primefs.kernels.forkserver import hide_from_same_user
from primefs.kernels.host import KernelSpec
from primefs.kernels.inside.rpc import RpcError
from primefs.kernels.local import LocalKernel, LocalKernelHost

MAX_THREADS = 4096  # created only when needed: one per running cell or pending call


class NodeKernels:
    def __init__(self, workspace: str, node_id: str):
        hide_from_same_user()  # it holds every token of this node's kernels, which run as the same user
        self.workspace = Path(workspace)
        self.node_id = node_id
        # sockets on the node's own disk, never on the shared workspace (unix sockets do not cross NFS)
        self.dir = Path(tempfile.gettempdir()) / f"primefs-{os.getuid()}" / f"node-{secrets.token_hex(4)}"
        self.dir.mkdir(parents=True, mode=0o700)
        self.pool = ThreadPoolExecutor(MAX_THREADS, thread_name_prefix="primefs-node")
        self.kernels: dict[str, LocalKernel] = {}
        self.requests: deque = deque()
        self.cond = threading.Condition()
        self.replies: dict[int, list] = {}  # request id -> [event, JSON reply]
        self.ids = itertools.count(1)
        self.closed = False
        self.host = LocalKernelHost(self.dir, self.workspace, self._forward) if self.workspace.is_dir() else None

    async def _run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    def _kernel(self, token: str) -> LocalKernel:
        k = self.kernels.get(token)
        if k is None:
            raise LookupError("no such kernel on this node (it was shut down)")
        return k

    # -- what the runner calls --------------------------------------------------------------------
    async def info(self) -> dict:
        """Where this actor runs, and whether the shared workspace is mounted here."""
        return {"node_id": self.node_id, "hostname": socket.gethostname(), "pid": os.getpid(),
                "workspace_ok": (self.workspace / "primefs.yaml").is_file()}

    async def start(self, spec: dict) -> dict:
        if self.host is None:
            raise RuntimeError(f"the workspace {self.workspace} is not mounted on this node")
        # the node's fork server enters the sandbox, as the runner's does for local kernels
        k = await self._run(self.host.start, KernelSpec.from_dict(spec))
        self.kernels[k.token] = k
        return {"token": k.token, "pid": k.pid}

    async def execute(self, token: str, code: str) -> CellResult:
        # No timeout here: the runner times the cell and interrupts it (it must void the cell's requests first).
        return await self._run(self._kernel(token).execute, code, None, None)

    async def evaluate(self, token: str, expr: str, timeout: float) -> str:
        return await self._run(self._kernel(token).evaluate, expr, timeout)

    async def interrupt(self, token: str) -> None:
        k = self.kernels.get(token)
        if k is not None:
            k.interrupt()

    async def alive(self, token: str) -> bool:
        k = self.kernels.get(token)
        return k is not None and k.alive()

    async def shutdown(self, token: str) -> None:
        k = self.kernels.pop(token, None)
        if k is not None:
            await self._run(k.shutdown)


    async def poll(self, wait_s: float) -> list[dict]:
        """The runner's long poll: requests of this node's kernels, as soon as there is one."""
        return await self._run(self._take, wait_s)

    async def reply(self, rid: int, reply: str) -> None:
        slot = self.replies.get(rid)
        if slot is not None:
            slot[1] = reply
            slot[0].set()

    async def close(self) -> None:
        await self._run(self._close)

    # -- inside the node --------------------------------------------------------------------------
    def _take(self, wait_s: float) -> list[dict]:
        with self.cond:
            if not self.requests and not self.closed:
                self.cond.wait(wait_s)
            batch = list(self.requests)
            self.requests.clear()
        return batch

    def _forward(self, session_id: str, op: str, args: dict):
        """A verified kernel request (LocalKernelHost checked token and caller): to the runner, and wait."""
        rid = next(self.ids)
        slot = [threading.Event(), None]
        with self.cond:
            if self.closed:
                raise RpcError("the runner is stopping", "RuntimeError")
            self.replies[rid] = slot
            self.requests.append({"rid": rid, "sid": session_id, "op": op, "args": args})
            self.cond.notify_all()
        try:
            slot[0].wait()  # as long as it takes: wait() and recv() may block for hours
        finally:
            self.replies.pop(rid, None)
        reply = json.loads(slot[1] or '{"ok": false, "error": "the runner is stopping", "type": "RuntimeError"}')
        if reply["ok"]:
            return reply["result"]
        raise RpcError(reply["error"], reply.get("type") or "RpcError")  # the runner's exception type, kept

    def _close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()
            slots = list(self.replies.values())
        for slot in slots:  # requests still waiting end with an error in their cells
            slot[0].set()
        self.kernels.clear()
        if self.host is not None:
            self.host.close()
        try:
            self.dir.rmdir()
        except OSError:
            pass
