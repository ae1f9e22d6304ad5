"""Kernels on the nodes of a Ray cluster, behind the same seam as local ones (kernelhost.py).

The runner is the Ray driver. On every node of the cluster it starts one `NodeKernels` actor
(raynode.py), pinned there: a fork server and the node's kernels, their cells, interrupts and
snapshots (written to the shared workspace, mounted at the same path on every node). A kernel's
requests are verified by its node's actor (token + calling process, as on one machine) and reach
the runner through the long poll below; no kernel port is ever exposed across machines.

Placement (placement.py): a new kernel goes to the least-loaded node that has what it needs. When a
node (or its actor) is lost, its kernels report death: a running cell ends `died`, `alive()` is
False, and the session's next kernel starts on another node from its last snapshot (kernel.py).
Ray is imported only for this host (rayconnect.py, which reaches the cluster), only when `primefs run --ray`
(or `hosts:` kind ray) asks for it.
"""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from primefs.errors import PrimefsError
from primefs.kernels.client import INTERRUPT_GRACE_S, CellResult
from primefs.kernels.host import Handler, KernelHandle, KernelHost, KernelSpec
from primefs.kernels.inside.rpc import error_reply
from primefs.kernels.placement import Node, choose, describe, kernel_needs, never_fits
from primefs.kernels.rayconnect import connect, import_ray, reachable  # noqa: F401 - re-exported

POLL_S = 1.0  # a node's long poll returns at least this often, empty
REFRESH_S = 2.0  # how often the list of the cluster's nodes is read again
# A node that is hung, not gone (SIGSTOP, a stuck machine), is dead to Ray only after its health checks give
# up (~62 s with Ray's defaults); its cells would sit stuck that long. primefs asks each node's actor every
# HEARTBEAT_S and loses the node after MISSES rounds without an answer: ~10-15 s.
HEARTBEAT_S = 2.0
HEARTBEAT_TIMEOUT_S = 3.0
MISSES = 3
START_TIMEOUT_S = 60.0  # a node actor's start, a kernel's start, waiting for room on a node
CALL_TIMEOUT_S = 30.0  # a control call to a node actor (alive, shutdown)
RETRY_LOST_S = 10.0  # a node whose actor was lost while the node lives: a new actor after this
NOT_KERNEL_RESOURCES = ("object_store_memory",)


class RayNode:
    """One node of the cluster as the runner sees it: its actor, its room, its kernels."""

    def __init__(self, info: dict, actor, ready):
        total = {k: float(v) for k, v in info["Resources"].items()
                 if not k.startswith("node:") and k not in NOT_KERNEL_RESOURCES}
        self.slot = Node(info["NodeID"], f"{info['NodeID'][:8]}@{info['NodeManagerAddress']}", total)
        self.actor, self.ready_ref = actor, ready
        self.ready = False  # its actor answered and the workspace is mounted there
        self.lost: str | None = None
        self.lost_at = 0.0
        self.handles: set[RayKernel] = set()

    @property
    def name(self) -> str:
        return self.slot.name


class RayKernel(KernelHandle):
    def __init__(self, host: "RayKernelHost", rn: RayNode, session_id: str, token: str, pid: int, need: dict):
        self.host, self.rn, self.session_id, self.token, self.pid, self.need = host, rn, session_id, token, pid, need
        self.node = rn.name
        self.actor = rn.actor
        self.dead = False

    def gone(self, why: str) -> None:
        self.dead, self.lost = True, why

    def execute(self, code: str, timeout: float | None = None, on_timeout=None, stop=None) -> CellResult:
        """Run a cell on the node; the timeout is kept here, where the cell's requests can be voided
        (`on_timeout`) before the interrupt reaches the kernel, as on one machine. `stop()` true: the
        cell is interrupted at once (this side cannot tell whether the node has begun it)."""
        ray = self.host.ray
        started = time.monotonic()
        ref = self.actor.execute.remote(self.token, code)
        interrupted_at, timed_out = None, False
        while True:
            done, _ = ray.wait([ref], timeout=0.25)
            now = time.monotonic()
            if done:
                try:
                    res = ray.get(ref)
                except Exception as exc:  # noqa: BLE001 - the actor or the node is gone, or the kernel was shut down
                    return self._died(started, self._why(exc), timed_out)
                res.timed_out = res.timed_out or timed_out
                return res
            if self.dead:
                return self._died(started, self.lost or "the kernel died", timed_out)
            if timeout and interrupted_at is None and now - started > timeout:
                timed_out = True
                if on_timeout:
                    on_timeout()
                self.interrupt()
                interrupted_at = now
            elif stop is not None and interrupted_at is None and stop():
                self.interrupt()
                interrupted_at = now
            elif interrupted_at is not None and now - interrupted_at > INTERRUPT_GRACE_S:
                return self._died(started, None, timed_out)  # would not stop: only a new kernel goes on

    def _died(self, started: float, why: str | None, timed_out: bool) -> CellResult:
        self.dead = True
        error = "the kernel died while running this cell" + (f" ({why})" if why else "")
        return CellResult(error=error, died=True, timed_out=timed_out,
                          elapsed_s=round(time.monotonic() - started, 4))

    def _why(self, exc: Exception) -> str:
        if isinstance(exc, self.host.ray.exceptions.RayActorError):
            self.host.suspect(self.rn)
            return self.lost or f"its node {self.node} cannot be reached"
        cause = getattr(exc, "cause", None) or exc  # a RayTaskError's text is the whole remote traceback
        return f"{type(cause).__name__}: {cause}"

    def evaluate(self, expr: str, timeout: float = 60.0) -> str:
        ray = self.host.ray
        if self.dead:
            raise RuntimeError(f"the kernel died ({self.lost or 'gone'})")
        try:
            return ray.get(self.actor.evaluate.remote(self.token, expr, timeout), timeout=timeout + CALL_TIMEOUT_S)
        except ray.exceptions.RayTaskError as exc:  # the kernel's own error (a timeout, a failed expression)
            cause = exc.cause
            raise (cause if isinstance(cause, Exception) else RuntimeError(str(exc))) from None
        except ray.exceptions.RayError as exc:
            raise RuntimeError(f"the kernel died ({self._why(exc)})") from None

    def interrupt(self) -> None:
        if not self.dead:
            self.actor.interrupt.remote(self.token)  # no need to wait: the cell's end says it worked

    def alive(self) -> bool:
        if self.dead:
            return False
        ray = self.host.ray
        try:
            ok = ray.get(self.actor.alive.remote(self.token), timeout=CALL_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:  # a busy node is not a dead one; its loss is noticed elsewhere
            return not self.dead
        except ray.exceptions.RayError as exc:
            self.gone(self._why(exc))
            return False
        if not ok:
            self.dead = True
        return ok

    def shutdown(self) -> None:
        self.host.forget(self)
        was_dead, self.dead = self.dead, True
        if was_dead and self.rn.lost:
            return
        try:  # also after a cell that would not stop: the kernel must not live on, unseen
            self.host.ray.get(self.actor.shutdown.remote(self.token), timeout=CALL_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - its node is gone, and the kernel with it
            pass

    def describe(self) -> dict:
        return {"pid": self.pid, "node": self.node, "host": "ray"}


class RayKernelHost(KernelHost):
    name = "ray"

    def __init__(self, address: str, cwd: Path, handler: Handler, log=lambda msg: None,
                 resources: dict | None = None):
        self.ray = ray = import_ray()
        self.cwd, self.handler, self.log = Path(cwd), handler, log
        self.defaults = dict(resources or {})  # what every kernel needs (hosts: resources), before the session's own
        self.owns = connect(ray, address)  # False: a test or a script had connected already
        from primefs.kernels.raynode import NodeKernels

        self.actor_class = ray.remote(NodeKernels)
        self.cond = threading.Condition()
        self.nodes: dict[str, RayNode] = {}
        self.closed = False
        self.threads: list[threading.Thread] = []  # those that call Ray: all ended before ray.shutdown()
        self.refresh()
        self._thread(self._watch, "primefs-ray-nodes")
        self._thread(self._heartbeat, "primefs-ray-heartbeat")

    def _thread(self, target, name: str, *args) -> None:  # (self.cond is reentrant: refresh holds it)
        t = threading.Thread(target=target, args=args, name=name, daemon=True)
        with self.cond:
            self.threads.append(t)
        t.start()

    def _pause(self, seconds: float) -> bool:
        """Sleep, or less if the host closes; False once it has."""
        with self.cond:
            return not self.cond.wait_for(lambda: self.closed, timeout=seconds)

    # -- nodes ------------------------------------------------------------------------------------
    def refresh(self) -> None:
        """Read the cluster's nodes: an actor on each new one; nodes that left are lost."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        # Nodes without CPUs get no kernels (placement.py): no actor, no fork server there either
        alive = {n["NodeID"]: n for n in self.ray.nodes() if n.get("Alive") and n["Resources"].get("CPU", 0) > 0}
        with self.cond:
            if self.closed:
                return
            for nid, info in alive.items():
                old = self.nodes.get(nid)
                if old is not None and not (old.lost and time.monotonic() - old.lost_at > RETRY_LOST_S):
                    continue
                actor = self.actor_class.options(
                    num_cpus=0, max_concurrency=10_000, max_restarts=0,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(nid, soft=False)).remote(str(self.cwd), nid)
                rn = self.nodes[nid] = RayNode(info, actor, actor.info.remote())
                self._thread(self._poll, f"primefs-ray-{nid[:8]}", rn)
            gone = [rn for nid, rn in self.nodes.items() if nid not in alive and not rn.lost]
        for rn in gone:
            self.lose(rn, "it left the cluster")

    def _watch(self) -> None:
        while self._pause(REFRESH_S):
            try:
                self.refresh()
            except Exception as exc:  # noqa: BLE001 - the cluster's head may be busy; try again later
                if not self.closed:
                    self.log(f"warning: reading the Ray cluster's nodes: {type(exc).__name__}: {exc}")

    def _heartbeat(self) -> None:
        """Each ready node's actor is asked `info` every HEARTBEAT_S; MISSES rounds without an answer in
        HEARTBEAT_TIMEOUT_S and the node is lost (its sessions go on elsewhere)."""
        missed: dict[str, int] = {}
        while self._pause(HEARTBEAT_S):
            with self.cond:
                nodes = [rn for rn in self.nodes.values() if rn.ready and not rn.lost]
            try:
                refs = {rn.actor.info.remote(): rn for rn in nodes}
                done, _ = self.ray.wait(list(refs), num_returns=len(refs), timeout=HEARTBEAT_TIMEOUT_S) if refs \
                    else ([], [])
            except Exception:  # noqa: BLE001 - the driver's connection: the node list decides
                continue
            answered = {refs[r].slot.id for r in done}
            for rn in nodes:
                missed[rn.slot.id] = 0 if rn.slot.id in answered else missed.get(rn.slot.id, 0) + 1
                if missed[rn.slot.id] >= MISSES and not self.closed:
                    missed[rn.slot.id] = 0
                    self.lose(rn, f"it did not answer for {MISSES * (HEARTBEAT_S + HEARTBEAT_TIMEOUT_S):g} s (hung?)")

    def lose(self, rn: RayNode, detail: str) -> None:
        """A node (or its actor) is gone: its kernels are dead, its room is no longer offered."""
        why = f"its node {rn.name} was lost: {detail}"
        with self.cond:
            if rn.lost:
                return
            rn.lost, rn.lost_at = why, time.monotonic()
            for k in list(rn.handles):
                k.gone(why)
            self.cond.notify_all()
        if not self.closed:
            self.log(f"warning: Ray node {rn.name} lost ({detail}); its sessions continue on other nodes "
                     "from their last snapshots")
        try:
            self.ray.kill(rn.actor)  # if only the actor was sick, its kernels must go with it
        except Exception:  # noqa: BLE001 - already gone
            pass

    def suspect(self, rn: RayNode) -> None:
        """A call to the node's actor failed: ask the cluster now rather than at the next refresh."""
        if rn.lost:  # every cell of a lost node lands here: one question to the cluster is enough
            return
        try:
            if not any(n["NodeID"] == rn.slot.id and n.get("Alive") for n in self.ray.nodes()):
                self.lose(rn, "Ray reports it dead")
            else:
                self.lose(rn, "the primefs actor there died")
        except Exception:  # noqa: BLE001
            self.lose(rn, "it cannot be reached")

    # -- requests of the node's kernels -----------------------------------------------------------
    def _poll(self, rn: RayNode) -> None:
        ray = self.ray
        try:
            info = ray.get(rn.ready_ref, timeout=START_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001
            self.lose(rn, f"the primefs actor did not start there: {type(exc).__name__}: {exc}")
            return
        if not info.get("workspace_ok"):
            self.log(f"warning: Ray node {rn.name} ({info.get('hostname')}): the workspace {self.cwd} is not "
                     "mounted there (see docs/scale-out.md); no kernel goes to it")
            self.lose(rn, "the workspace is not mounted there")
            return
        with self.cond:
            rn.ready = True
            self.cond.notify_all()
        while not self.closed and not rn.lost:
            try:  # no timeout: a poll given up on could still take requests off the queue, and lose them
                batch = ray.get(rn.actor.poll.remote(POLL_S))
            except ray.exceptions.ActorUnavailableError:  # perhaps for a moment: the node list decides
                time.sleep(0.2)
                continue
            except Exception:  # noqa: BLE001 - the actor died
                if not self.closed:
                    self.suspect(rn)
                return
            for req in batch:  # each in its own thread: wait() and recv() may block for long
                threading.Thread(target=self._serve, args=(rn, req), name="primefs-ray-request", daemon=True).start()

    def _serve(self, rn: RayNode, req: dict) -> None:
        try:
            reply = {"ok": True, "result": self.handler(req["sid"], req["op"], req["args"])}
        except Exception as exc:  # becomes an exception in the cell, not a runner crash
            reply = error_reply(exc)
        if self.closed:  # the kernel that asked is gone with the host
            return
        try:
            rn.actor.reply.remote(req["rid"], json.dumps(reply, default=str))
        except Exception:  # noqa: BLE001 - the node is gone, and the kernel that asked with it
            pass

    # -- kernels ----------------------------------------------------------------------------------
    def start(self, spec: KernelSpec) -> RayKernel:
        need = kernel_needs(self.defaults, spec.resources)
        for _ in range(3):  # a node lost while its kernel starts: the next node
            rn = self._place(need)
            try:
                info = self.ray.get(rn.actor.start.remote(spec.to_dict()),
                                    timeout=START_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001
                with self.cond:
                    rn.slot.give_back(need)
                    self.cond.notify_all()
                if isinstance(exc, self.ray.exceptions.RayTaskError):
                    raise RuntimeError(f"kernel start on node {rn.name} failed: {exc.cause}") from None
                if isinstance(exc, self.ray.exceptions.GetTimeoutError):  # a busy node, not a lost one
                    raise RuntimeError(f"kernel start on node {rn.name} took over {START_TIMEOUT_S:g} s") from None
                self.suspect(rn)
                continue
            k = RayKernel(self, rn, spec.session_id, info["token"], int(info["pid"]), need)
            with self.cond:
                if rn.lost:
                    k.gone(rn.lost)
                rn.handles.add(k)
            return k
        raise RuntimeError("kernel start failed: the Ray nodes chosen were lost one after another")

    def _place(self, need: dict) -> RayNode:
        """Reserve room on the least-loaded node that fits; wait for nodes still starting and for room."""
        deadline = time.monotonic() + START_TIMEOUT_S
        with self.cond:
            while True:
                if self.closed:
                    raise RuntimeError("the kernel host is closed (the runner is stopping)")
                starting = any(not rn.ready and not rn.lost for rn in self.nodes.values())
                usable = {rn.slot.id: rn for rn in self.nodes.values() if rn.ready and not rn.lost}
                if not starting and usable:  # every node has its say: not decided by start-up order
                    best = choose([rn.slot for rn in usable.values()], need)
                    if best is not None:
                        best.take(need)
                        return usable[best.id]
                    why = never_fits([rn.slot for rn in usable.values()], need)
                    if why:
                        raise PrimefsError(why)
                if time.monotonic() > deadline:
                    raise RuntimeError(self._no_room(need, starting, usable))
                self.cond.wait(0.5)

    def _no_room(self, need: dict, starting: bool, usable: dict) -> str:
        if starting:
            return f"the Ray nodes did not start their primefs actors within {START_TIMEOUT_S:g} s"
        if not usable:
            lost = "; ".join(sorted({rn.lost for rn in self.nodes.values() if rn.lost})) or "the cluster has no node"
            return f"no usable Ray node for a kernel ({lost})"
        return f"no room for a kernel needing {describe(need)} on any Ray node within {START_TIMEOUT_S:g} s"

    def forget(self, k: RayKernel) -> None:
        with self.cond:
            if k in k.rn.handles:
                k.rn.handles.discard(k)
                k.rn.slot.give_back(k.need)
                self.cond.notify_all()

    def state(self) -> dict:
        with self.cond:
            nodes = [{"node": rn.name, "kernels": len(rn.handles), "lost": rn.lost} for rn in self.nodes.values()]
        return {"host": "ray", "live_kernels": sum(n["kernels"] for n in nodes), "kernel_pids": [], "nodes": nodes}

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()
            nodes = list(self.nodes.values())
        live = [rn for rn in nodes if not rn.lost]
        refs = [rn.actor.close.remote() for rn in live]
        try:
            self.ray.wait(refs, num_returns=len(refs), timeout=CALL_TIMEOUT_S)
        except Exception:  # noqa: BLE001
            pass
        for rn in nodes:
            try:
                self.ray.kill(rn.actor)
            except Exception:  # noqa: BLE001
                pass
        deadline = time.monotonic() + CALL_TIMEOUT_S
        for t in self.threads:  # a long poll ends within POLL_S, a killed actor's at once
            t.join(max(0.0, deadline - time.monotonic()))
        if self.owns:
            self.ray.shutdown()
