"""A session's kernel for the session's whole life.

No kernel is ever handed from one session to another (a reset cannot remove threads, patched
modules or sockets that code left behind). When the kernel has to go (the session is idle and
kernels are scarce, the runner stops) its user namespace is saved to `sessions/<id>/kernel/`
first; the next kernel of the session loads it back, and the model is told in one line what came
back and what did not. A kernel that dies mid-cell is replaced the same way, from the last snapshot.
"""
from __future__ import annotations

import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Callable

from primefs.kernels.client import CellResult
from primefs.kernels.host import KernelHandle, KernelHost, KernelSpec
from primefs.store.settings import Limits

SNAPSHOT_MODES = ("turn", "idle", "off")


class SessionKernel:
    def __init__(self, host: KernelHost, spec: Callable[[], KernelSpec], folder: Path, limits: Limits, record,
                 on_start: Callable[[str], None] = lambda node: None):
        self.host, self.spec, self.folder = host, spec, Path(folder)  # spec: built when a kernel starts
        self.limits = limits
        self.record = record  # history events of the session: kernel started, snapshot, restored
        self.on_start = on_start  # told the node of each new kernel (the session's `node` in session.yaml)
        self.handle: KernelHandle | None = None
        self.dirty = False  # cells ran since the last snapshot (or restore)
        self._starting: tuple[threading.Thread, list] | None = None  # start_soon(): its thread and its error
        # One talker at a time: a cell, a snapshot and a restore share the client's sockets, and each drops
        # the messages that are not its own. A turn holds it for a whole step (`primefs exec` runs between).
        self.lock = threading.RLock()

    @property
    def mode(self) -> str:
        return self.limits.snapshot

    def held(self) -> bool:
        """A kernel started or starting (running() asks whether it is alive, which costs a call on Ray)."""
        return self.handle is not None or self._starting is not None

    def running(self) -> bool:
        return self.handle is not None and self.handle.alive()

    def ensure(self, why: str | None = None) -> str | None:
        """Start the kernel unless it runs. `why`: the session had a kernel before, and this is why
        it is gone; then the last snapshot is restored. Returns what to tell the model, if anything."""
        with self.lock:
            if self.running():
                return None
            self._discard()
            started = time.monotonic()
            self.handle = self.host.start(self.spec())
            self.record("kernel", event="restarted" if why else "started", reason=why, pid=self.handle.pid,
                        node=self.handle.node, start_s=round(time.monotonic() - started, 4))
            self.on_start(self.handle.node)
            return self._restore(why) if why else None

    def start_soon(self) -> None:
        """Start a first kernel (none to restore, nothing to tell the model) in a thread of its own, so that a
        new session's first model call does not wait ~0.1 s for it; ready() waits for it."""
        error: list = []

        def start():
            try:
                self.ensure()
            except BaseException as exc:  # noqa: BLE001 - raised again by ready(), in the turn's thread
                error.append(exc)

        thread = threading.Thread(target=start, name="primefs-kernel-start", daemon=True)
        self._starting = (thread, error)
        thread.start()

    def ready(self) -> None:
        """Wait for a kernel start_soon() began; its start's error is raised here (once)."""
        if self._starting is not None:
            thread, error = self._starting
            thread.join()
            self._starting = None
            if error:
                raise error[0]

    def execute(self, code: str, timeout: float | None, on_timeout=None, stop=None) -> CellResult:
        with self.lock:
            self.dirty = True
            res = self.handle.execute(code, timeout=timeout, on_timeout=on_timeout, stop=stop)
            if res.died:
                res.restarted = True
                res.notice = self.ensure(self.handle.lost or "it died or would not stop during a cell")
            return res

    def interrupt(self) -> None:
        if self.handle is not None:
            self.handle.interrupt()

    def snapshot(self, reason: str) -> dict | None:
        """Save the namespace now (unless snapshots are off). Never raises: a failed snapshot is recorded."""
        with self.lock:
            if self.mode == "off" or not self.running():
                return None
            max_bytes = int(self.limits.snapshot_max_mb * 1024 * 1024)
            try:
                m = self.handle.snapshot(self.folder, max_bytes, reason)
            except Exception as exc:  # a hung or broken kernel: the previous snapshot stays
                self.record("snapshot", reason=reason, error=f"{type(exc).__name__}: {exc}")
                return None
            self.dirty = False
            if m["skipped"]:  # what a later restore cannot bring back is worth a line in the log
                self.record("snapshot", reason=reason, saved=len(m["saved"]), bytes=m["bytes"],
                            skipped=[f"{x['name']} ({x['reason']})" for x in m["skipped"]])
            return m

    def shutdown(self, snapshot: str | None = None) -> None:
        """Shut the kernel down, saving its namespace first (when `snapshot` names why and cells ran
        since the last snapshot)."""
        with self.lock:  # not under a cell another thread runs
            if snapshot and self.dirty:
                self.snapshot(snapshot)
            self._discard()

    def _discard(self) -> None:
        handle, self.handle = self.handle, None
        if handle is not None:
            handle.shutdown()

    def _restore(self, why: str) -> str:
        lost = f"Your kernel was restarted ({why})"
        if self.mode == "off" or not (self.folder / "manifest.json").is_file():
            return f"{lost}: the variables you made are gone (`context` and the kernel API are defined again)."
        try:
            r = self.handle.restore(self.folder)
        except Exception as exc:
            self.record("restored", error=f"{type(exc).__name__}: {exc}")
            return f"{lost}: its snapshot could not be loaded ({exc}); the variables you made are gone."
        self.record("restored", restored=r["restored"], modules=r["modules"],
                    failed=[f["name"] for f in r["failed"]], skipped=[s["name"] for s in r["skipped"]])
        return f"{lost}: {describe_restore(r)}"


def describe_restore(r: dict) -> str:
    """One line: what came back from the snapshot and what did not (and why)."""
    when = datetime.fromtimestamp(r["created"]).strftime("%H:%M:%S") if r.get("created") else "?"
    names = r["restored"] + [f"{m} (module)" for m in r["modules"]]
    text = (f"restored from the snapshot of {when}: {_names(names)}" if names
            else f"the snapshot of {when} held no variables")
    missing = [f"{x['name']} ({x['reason']})" for x in r["failed"] + r["skipped"]]
    if missing:
        text += f"; not restored: {_names(missing, 8)}"
    return text + ". Variables made after that snapshot are gone."


def _names(items: list[str], limit: int = 30) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")
