"""The runner's side of `ask_runner` (store/control.py): requests from the command line, as files in
the private runtime folder. Run code in a session's live kernel (`primefs exec`), hand out its kernel's
connection file (`primefs kernel`), archive finished trees (`primefs archive`: the runner knows which
sessions are in use).

A request is claimed once (renamed `<id>.taken`), done in a thread of its own and answered with
`<id>.reply`; one older than STALE_S when claimed is dropped unread (its command is gone: never run old
code). A runner that dies meanwhile leaves no reply; the command sees the lock free and says so.
"""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

from primefs.errors import PrimefsError
from primefs.kernels.client import cut
from primefs.store.control import requests_dir
from primefs.store.fsutil import NAME_RE, write_atomic

STALE_S = 120.0  # a request older than this is dropped unread
BUSY_WAIT_S = 60.0  # exec during a turn waits this long for the cells of the current step to end


class LiveRequests:
    """The runner side."""

    def __init__(self, ws, turns, log, *, archive, approvals):
        """archive(request) -> reply: the runner's archiver (runner/core.py), called one at a time.
        approvals: the runner's approval gate (runner/approvals.py), which takes a person's answers."""
        self.ws, self.turns, self.log, self.archive, self.approvals = ws, turns, log, archive, approvals
        self.archiving = threading.Lock()
        self.dir = requests_dir(ws)
        self.connected: set[str] = set()  # sessions whose kernel's connection file was handed out
        self.in_hand: set[Path] = set()  # requests being served (a runner with --idle-exit does not stop under them)

    def close(self) -> None:
        """Runner stop: its kernels go, and with them what the connection files pointed at."""
        for p in (self.ws.runtime / "connect").glob("kernel-*.json"):
            try:
                p.unlink()
            except OSError:
                pass

    def revoke(self) -> None:
        """`kernel_connect` turned off: the files go, and so do the kernels whose keys they gave away (a
        new kernel, restored from its snapshot, has a new key: the old file opens nothing)."""
        self.close()
        for sid in sorted(self.connected):
            self.log(f"{sid}: kernel_connect is off: its kernel, whose connection file was handed out, is replaced")
            self.turns.kernels.retire(self.turns.agent(sid), "its connection file was revoked (kernel_connect "
                                                            "was turned off)")
        self.connected.clear()

    def scan(self) -> None:
        """Requests whose file event was missed (the listing is the truth)."""
        if self.dir.is_dir():
            for p in self.dir.glob("*.json"):
                self.take(p)

    def take(self, path: Path) -> None:
        if path.suffix != ".json" or path.parent != self.dir:
            return
        taken = path.with_suffix(".taken")
        try:
            os.rename(path, taken)  # claimed once, even if a scan and a file event both see it
            if time.time() - taken.stat().st_mtime > STALE_S:  # its CLI is gone: never run old code
                taken.unlink()
                return
            request = json.loads(taken.read_text())
        except (OSError, ValueError):
            return
        reply_path = taken.with_suffix(".reply")
        self.in_hand.add(reply_path)  # before its thread starts: an idle look meanwhile sees it (set ops: atomic)
        threading.Thread(target=self._serve, args=(reply_path, request), name=f"request-{path.stem}",
                         daemon=True).start()

    def busy(self) -> bool:
        return bool(self.in_hand)

    def _serve(self, reply_path: Path, request) -> None:
        try:
            reply = self._do(request if isinstance(request, dict) else {})
        except PrimefsError as exc:
            reply = {"error": str(exc)}
        except Exception as exc:  # noqa: BLE001 - the CLI gets the reason, the runner goes on
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        try:
            write_atomic(reply_path, json.dumps(reply, default=str), durable=False)
        except OSError as exc:
            self.log(f"warning: could not answer a request: {exc}")
        finally:
            self.in_hand.discard(reply_path)

    def _do(self, request: dict) -> dict:
        op, sid = request.get("op"), request.get("session")
        if op == "archive":
            with self.archiving:
                return self.archive(request)
        if op not in ("exec", "kernel", "approve"):
            raise PrimefsError(f"unknown request {op!r}")
        if not isinstance(sid, str) or not NAME_RE.fullmatch(sid) or not self.turns.tree.knows(sid):
            raise PrimefsError(f"the runner does not know session {sid!r}")
        if op == "approve":  # a person's answer (`primefs approve/deny`, attach, the web view)
            n, reason = request.get("n"), request.get("reason")
            if n is not None and (isinstance(n, bool) or not isinstance(n, int)):
                raise PrimefsError(f"an approval is named by its number, not {n!r}")
            return self.approvals.answer(sid, n, request.get("verdict"), str(reason) if reason else None,
                                         str(request.get("by") or "user")[:100], str(request.get("via") or "cli"))
        if op == "kernel":
            return self._with_kernel(sid, self._connection)
        code = request.get("code")
        if not isinstance(code, str) or not code.strip():
            raise PrimefsError("no code to run")
        return self._with_kernel(sid, lambda agent: self._exec(agent, code))

    def _with_kernel(self, sid: str, fn) -> dict:
        """Run fn(agent) with the session's kernel to ourselves: at once when no turn runs (starting the
        kernel, with its variables restored, if it is not up), else between two steps of the turn."""
        deadline, busy = time.monotonic() + BUSY_WAIT_S, True
        agent = self.turns.agent(sid)
        while True:
            if agent.turn_lock.acquire(blocking=False):
                if agent.forgotten:  # let go of by the runner meanwhile: the session's agent now
                    agent.turn_lock.release()
                    agent = self.turns.agent(sid)
                    continue
                try:
                    with agent.kernel.lock:
                        agent.ensure_conversation()
                        agent.ensure_kernel()
                        return fn(agent)
                finally:
                    agent.turn_lock.release()
                    self.turns.kernels.park(agent)
            if agent.kernel.lock.acquire(timeout=0.2):  # between two steps of the turn
                busy = False
                try:
                    if agent.kernel.running():
                        return fn(agent)
                finally:
                    agent.kernel.lock.release()
                time.sleep(0.05)  # the turn is starting (or restarting) its kernel: look again
            if time.monotonic() > deadline:
                raise PrimefsError(f"the session's kernel has been running a cell of its turn for {BUSY_WAIT_S:g} s; "
                                   "try again later (or primefs stop it)" if busy else
                                   "the session's kernel did not come up (its turn is starting or restarting it); "
                                   "try again")

    def _exec(self, agent, code: str) -> dict:
        """The user's code in the session's kernel, recorded in its history as the user's (the model is
        not told: it sees what the code changed, in its kernel)."""
        res = agent.kernel.execute(code, timeout=agent.limits.cell_timeout_s)
        limit = agent.limits.output_chars
        agent.record("exec", by="user", code=code, output=cut(res.output, limit),
                     error=cut(res.error, limit) if res.error else None, timed_out=res.timed_out,
                     restarted=res.restarted, elapsed_s=res.elapsed_s)
        return {"ran": not res.not_run, "output": res.output, "error": res.error, "timed_out": res.timed_out,
                "restarted": res.restarted, "elapsed_s": res.elapsed_s}

    def _connection(self, agent) -> dict:
        if not self.ws.config.get("kernel_connect"):
            raise PrimefsError("kernel connection files are off in this workspace: set `kernel_connect: true` in "
                               "primefs.yaml first (docs/cli.md, `primefs kernel`: whoever can read the file can "
                               "run code as you)")
        info = agent.kernel.handle.connection()
        if info is None:
            raise PrimefsError(f"the session's kernel runs on {agent.kernel.handle.node}, not on this machine: "
                               "no connection file for it")
        folder = self.ws.runtime / "connect"
        folder.mkdir(mode=0o700, exist_ok=True)
        path = folder / f"kernel-{agent.session.id}.json"
        write_atomic(path, json.dumps({**info, "kernel_name": "python3"}, indent=1), durable=False)
        os.chmod(path, 0o600)
        agent.record("kernel_connect", by="user", file=str(path))  # who else may be in this kernel
        self.connected.add(agent.session.id)
        return {"connection_file": str(path), "pid": agent.kernel.handle.pid}
