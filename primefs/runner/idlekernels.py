"""The kernels of idle sessions: kept for their next turn, within limits.max_idle_kernels. The oldest
idle ones are snapshotted and shut down (their next turn restores them); at the runner's stop every
kernel is snapshotted, then shut down."""
from __future__ import annotations

import threading
from collections import OrderedDict


class IdleKernels:
    def __init__(self, limit: int):
        self.limit = limit
        self._lock = threading.Lock()
        self._idle: OrderedDict = OrderedDict()  # session id -> its agent, for idle ones holding a kernel, oldest first

    def taken(self, sid: str) -> None:
        """A turn starts: its kernel is no longer idle."""
        with self._lock:
            self._idle.pop(sid, None)

    def park(self, agent) -> None:
        """A turn ended: keep its kernel (or let it go, if asked for during the turn or stopped)."""
        if not agent.kernel.running():
            return
        if agent.retire_kernel:  # asked for during the turn
            why, agent.retire_kernel = agent.retire_kernel, None
            agent.kernel.shutdown(snapshot="idle")
            agent.kernel_gone = why
            return
        if agent.session.status == "stopped":
            agent.kernel.shutdown(snapshot="stopped")
            return
        with self._lock:
            self._idle[agent.session.id] = agent
            self._idle.move_to_end(agent.session.id)
            evict = []
            while len(self._idle) > self.limit:
                evict.append(self._idle.popitem(last=False)[1])
        for old in evict:
            threading.Thread(target=self.evict, args=(old,), name=f"evict-{old.session.id}", daemon=True).start()

    @staticmethod
    def evict(agent, why: str = "it was shut down while the session was idle") -> bool:
        """Snapshot and shut down an idle session's kernel; False if a turn holds it (it keeps it)."""
        if not agent.turn_lock.acquire(blocking=False):
            return False
        try:
            if agent.kernel.running():
                agent.kernel.shutdown(snapshot="idle")
                agent.kernel_gone = why
                agent.record("kernel", event="stopped", reason=why)  # (for a later Agent of it: Turns.forget_idle)
        finally:
            agent.turn_lock.release()
        return True

    def retire(self, agent, why: str) -> None:
        """This session's kernel must go (e.g. its connection file was revoked): now if it is idle, else
        when its turn ends."""
        if not self.evict(agent, why):
            agent.retire_kernel = why

    @staticmethod
    def shutdown_all(agents) -> None:
        """Runner stop: every kernel is snapshotted, then shut down (in parallel)."""
        threads = [threading.Thread(target=a.kernel.shutdown, kwargs={"snapshot": "stop"}, daemon=True)
                   for a in agents if a.kernel.handle is not None]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)

    @staticmethod
    def interrupt_all(agents) -> None:
        for a in agents:
            try:
                a.kernel.interrupt()
            except Exception:  # already gone
                pass
