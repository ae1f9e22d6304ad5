"""Pre-started, connected kernels, so a new session's first cell does not pay a kernel start.

A kernel costs ~0.35 CPU-s and ~0.25-1 s to start, but a warm one answers in ~5 ms. The pool
keeps `size` spare kernels started in the background, and takes back kernels of sessions that
no longer need theirs: such a kernel is reset (namespace cleared, working directory restored)
before another session uses it.
"""
from __future__ import annotations

import itertools
import threading
from pathlib import Path

from .kernel import Kernel

RESET = ("get_ipython().reset(new_session=False)\n"
         "import os as _os; _os.chdir({root!r}); del _os")


class KernelPool:
    def __init__(self, runtime_dir: Path, cwd: Path, size: int):
        self.runtime_dir, self.cwd, self.size = Path(runtime_dir), Path(cwd), max(0, int(size))
        self._ready: list[Kernel] = []
        self._lock = threading.Lock()
        self._wanted = threading.Event()
        self._closed = False
        self._names = itertools.count(1)
        self.started = 0  # kernels started by this pool (for measurements)
        self._thread = threading.Thread(target=self._fill, name="primefs-kernel-pool", daemon=True)
        if self.size:
            self._wanted.set()
            self._thread.start()

    def _new(self) -> Kernel:
        k = Kernel(self.runtime_dir, f"k{next(self._names)}", self.cwd)
        k.start()
        with self._lock:
            self.started += 1
        return k

    def _fill(self) -> None:
        while not self._closed:
            self._wanted.wait()
            with self._lock:
                missing = self.size - len(self._ready)
                if missing <= 0 or self._closed:
                    self._wanted.clear()
                    continue
            try:
                k = self._new()
            except Exception:
                self._wanted.clear()  # cannot start kernels now; take() will start (and report) one
                continue
            with self._lock:
                if self._closed:
                    k.shutdown()
                    return
                self._ready.append(k)

    def take(self, bootstrap: str) -> Kernel:
        """A kernel for a session: warm from the pool, else started now. `bootstrap` runs in it."""
        with self._lock:
            k = self._ready.pop() if self._ready else None
        if self.size:
            self._wanted.set()
        if k is None or not k.is_alive():
            if k is not None:
                k.shutdown()
            k = self._new()
        k.bootstrap = bootstrap
        result = k.execute(bootstrap, timeout=60)
        if result.error:
            k.shutdown()
            raise RuntimeError(f"kernel bootstrap failed: {result.error}")
        return k

    def give_back(self, k: Kernel) -> None:
        """Reuse a kernel a session no longer needs (reset first), or shut it down if the pool is full."""
        with self._lock:
            keep = not self._closed and len(self._ready) < self.size
        if keep and k.is_alive():
            r = k.execute(RESET.format(root=str(self.cwd)), timeout=10)
            if not r.error and not r.timed_out and not r.restarted:
                k.bootstrap = None
                with self._lock:
                    self._ready.append(k)
                return
        k.shutdown()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            ready, self._ready = self._ready, []
        self._wanted.set()
        for k in ready:
            k.shutdown()
