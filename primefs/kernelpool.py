"""Kernels for sessions: pre-started spares, reuse of idle sessions' kernels, bounded starts.

A kernel costs ~0.35 CPU-s and ~0.25-1 s to start, but a warm one answers in ~5 ms, so:
- the pool keeps `size` spare kernels, started in the background;
- a session that needs a kernel takes a spare, else reuses the kernel of the longest-idle
  session (reset: namespace cleared, working directory restored), else starts one, but never
  more than one start per CPU at once (parallel starts on 2 cores only slow each other down);
  otherwise it waits for whichever of these comes first.
"""
from __future__ import annotations

import itertools
import os
import threading
from pathlib import Path
from typing import Callable

from .kernel import Kernel, kernel_env

# Before another session uses a kernel: clear the namespace, restore the working directory and the
# environment, and reload primefs's own kernel modules (a session may have patched them). Imported
# third-party modules and running threads are NOT reset: set limits.reuse_kernels to 0 when sessions
# must not share a process even one after the other.
RESET = ("get_ipython().reset(new_session=False)\n"
         "import os as _os, importlib as _il, sys as _sys\n"
         "_os.chdir({root!r}); _os.environ.clear(); _os.environ.update({env!r})\n"
         "for _m in ('primefs.rpc', 'primefs.kernel_api'):\n"
         "    if _m in _sys.modules: _il.reload(_sys.modules[_m])\n"
         "_sys.modules.pop('skills', None)\n"
         "del _os, _il, _sys")


class KernelPool:
    def __init__(self, runtime_dir: Path, cwd: Path, size: int, max_starts: int | None = None, reuse: bool = True):
        self.runtime_dir, self.cwd, self.size = Path(runtime_dir), Path(cwd), max(0, int(size))
        self.reuse = reuse  # reset and hand used kernels to other sessions (else: shut them down)
        self.max_starts = max_starts or os.cpu_count() or 2
        self._ready: list[Kernel] = []
        self._launching: set[Kernel] = set()  # kernels being started now (killed if the pool closes)
        self._starting = 0
        self._cond = threading.Condition()
        self._closed = False
        self._names = itertools.count(1)
        self._thread = threading.Thread(target=self._fill, name="primefs-kernel-pool", daemon=True)
        if self.size:
            self._thread.start()

    def ready_count(self) -> int:
        with self._cond:
            return len(self._ready)

    def notify(self) -> None:
        """Something changed (e.g. a session went idle with a kernel): waiting takers look again."""
        with self._cond:
            self._cond.notify_all()

    def _start_one(self) -> Kernel | None:
        """Start a kernel, counted in _starting (the caller reserved the slot)."""
        k = Kernel(self.runtime_dir, f"k{next(self._names)}", self.cwd)
        with self._cond:
            self._launching.add(k)
        try:
            k.start()
            return k
        except BaseException:
            k.shutdown()
            raise
        finally:
            with self._cond:
                self._launching.discard(k)
                self._starting -= 1
                self._cond.notify_all()

    def _fill(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (len(self._ready) + self._starting >= self.size
                                            or self._starting >= self.max_starts):
                    self._cond.wait()
                if self._closed:
                    return
                self._starting += 1
            try:
                k = self._start_one()
            except Exception:
                return  # cannot start kernels now; takers start (and report) their own
            with self._cond:
                if not self._closed:
                    self._ready.append(k)
                    self._cond.notify_all()
                    continue
            k.shutdown()
            return

    def take(self, bootstrap: str, reclaim: Callable[[], Kernel | None] = lambda: None) -> tuple[Kernel, str]:
        """A kernel for a session and where it came from: "pool", "reclaimed" or "new"."""
        while True:
            with self._cond:
                if self._closed:
                    raise RuntimeError("the kernel pool is closed (the runner is stopping)")
                k = self._ready.pop() if self._ready else None
                self._cond.notify_all()  # the filler may start a replacement
            if k is not None:
                if k.is_alive():
                    return self.prepare(k, bootstrap), "pool"
                k.shutdown()
                continue
            k = reclaim()
            if k is not None:
                return self.prepare(k, bootstrap), "reclaimed"
            with self._cond:
                if self._ready:
                    continue
                if self._starting >= self.max_starts:
                    self._cond.wait(0.5)  # a start finishing, or a session parking its kernel, wakes us
                    continue
                self._starting += 1
            return self.prepare(self._start_one(), bootstrap), "new"

    @staticmethod
    def prepare(k: Kernel, bootstrap: str) -> Kernel:
        k.bootstrap = bootstrap
        result = k.execute(bootstrap, timeout=60)
        if result.error:
            k.shutdown()
            raise RuntimeError(f"kernel bootstrap failed: {result.error}")
        return k

    def reset(self, k: Kernel) -> bool:
        """Clear a used kernel for another session. False if it could not be reset (then shut it down)."""
        if not self.reuse or not k.is_alive():
            return False
        r = k.execute(RESET.format(root=str(self.cwd), env=kernel_env()), timeout=10)
        k.bootstrap = None
        return not (r.error or r.timed_out or r.restarted)

    def give_back(self, k: Kernel) -> None:
        """Reuse a kernel a session no longer needs (reset first), or shut it down if the pool is full."""
        with self._cond:
            keep = not self._closed and len(self._ready) < self.size
        if keep and self.reset(k):
            with self._cond:
                self._ready.append(k)
                self._cond.notify_all()
            return
        k.shutdown()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            ready, self._ready = self._ready, []
            for k in self._launching:
                k.cancelled = True  # its starter shuts it down
            self._cond.notify_all()
        shutdown_all(ready)
        if self._thread.is_alive():
            self._thread.join(5)


def shutdown_all(kernels: list[Kernel]) -> None:
    """Shut kernels down in parallel: each waits for its process to exit."""
    threads = [threading.Thread(target=k.shutdown, daemon=True) for k in kernels]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
