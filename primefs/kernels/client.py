"""The runner's side of one kernel: a jupyter_client connection (shell + iopub) to a kernel process.

Where the process runs and how it started is the kernel host's business (kernelhost.py); this
module only speaks the Jupyter protocol: wait until ready, run a cell, evaluate an expression.
"""
from __future__ import annotations

import re
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_context = None


def close_thread_loop() -> None:
    """jupyter_client's blocking calls make an asyncio loop for each thread that calls them and never
    close it: an epoll and a socket pair left open per thread (a runner's turn is a thread of its own,
    so thousands over days). A thread that may have called a kernel closes its loop before it ends."""
    import asyncio
    import threading

    if threading.current_thread() is threading.main_thread():
        return  # one loop for the life of the process; asking for it here would make one
    try:
        loop = asyncio.get_event_loop_policy().get_event_loop()
    except RuntimeError:  # none was made in this thread
        return
    if not loop.is_running():
        loop.close()
    asyncio.set_event_loop(None)


def zmq_context():
    """One zmq context for every kernel connection of this process.

    Reconnects every 5 ms instead of zmq's 100 ms: a client connects before its kernel has bound
    its sockets, and the first retry would otherwise be most of a kernel's start time."""
    global _context
    if _context is None:
        import zmq

        ctx = zmq.Context()
        ctx.setsockopt(zmq.RECONNECT_IVL, 5)
        ctx.setsockopt(zmq.LINGER, 0)
        ctx.MAX_SOCKETS = 65536  # 2 per kernel: the default (1023) would cap a runner at ~500 kernels
        _context = ctx
    return _context


def connection_info(base: Path) -> dict:
    """ipc transport, a unique path per kernel (TCP races on ports when hundreds start at once)."""
    return {"transport": "ipc", "ip": str(base), "shell_port": 1, "iopub_port": 2, "stdin_port": 3,
            "control_port": 4, "hb_port": 5, "key": secrets.token_hex(32), "signature_scheme": "hmac-sha256"}


ABORTED = ("the cell was not run: the kernel aborted it twice, because code queued before it raised (from a "
           "connected console?); nothing of it ran")
INTERRUPT_GRACE_S = 5.0  # a cell still busy this long after an interrupt is given up (the kernel is dead)


@dataclass
class CellResult:
    output: str = ""
    error: str | None = None  # "Name: value" plus traceback, if the cell raised
    timed_out: bool = False
    died: bool = False  # the kernel process ended during the cell
    not_run: bool = False  # the kernel aborted it (code queued before it raised): nothing of it ran
    restarted: bool = False  # set by the session's kernel when it started a new one after a death
    notice: str | None = None  # what the model is told about such a restart
    elapsed_s: float = 0.0
    parts: list[str] = field(default_factory=list)


def cut(text: str, limit: int) -> str:
    """Keep head and tail of long output, and say how much was cut."""
    if limit <= 0 or len(text) <= limit:
        return text
    head = limit * 2 // 3
    tail = limit - head
    return f"{text[:head]}\n... [{len(text) - limit} characters cut] ...\n{text[-tail:]}"


class KernelClient:
    """Shell and iopub channels to one kernel. `alive` and `interrupt` are given by the host."""

    def __init__(self, info: dict, alive, interrupt):
        from jupyter_client import BlockingKernelClient

        self.info = info
        self.alive = alive
        self.interrupt = interrupt
        self.busy = False  # a cell runs (the host's limit watch looks at busy kernels' rooms)
        self.kc = BlockingKernelClient(context=zmq_context())
        # jupyter_client keeps the signature of every message received (a replay check), up to 65,536 (~8.5 MB)
        # for the life of a client: a kernel that lives for days. Its own child, on a private socket with a key
        # of its own: the last 1,024 are enough (~150 KB).
        self.kc.session.digest_history_size = 1024
        self.kc.load_connection_info(info)
        self.kc.start_channels(shell=True, iopub=True, stdin=False, hb=False, control=False)
        # read from the channels themselves: the client's get_*_msg run each read in an asyncio loop of
        # their own (jupyter_client's run_sync), which cost the runner more than the read
        self.shell, self.iopub = self.kc.shell_channel, self.kc.iopub_channel

    def wait_ready(self, timeout: float = 30.0, cancelled=lambda: False) -> None:
        """Ready = a kernel_info reply on shell *and* a message on iopub: output sent before the iopub
        subscription is live would be lost (re-send kernel_info while waiting). Both sockets are waited on
        at once, 50 ms at most: not polled in turn (a kernel's start is ~100 ms of such waiting)."""
        import zmq

        deadline = time.monotonic() + timeout
        sent: set[str] = set()
        shell = iopub = False
        next_send = 0.0
        poller = zmq.Poller()
        poller.register(self.shell.socket, zmq.POLLIN)
        poller.register(self.iopub.socket, zmq.POLLIN)
        while not (shell and iopub):
            now = time.monotonic()
            if now > deadline:
                raise RuntimeError(f"kernel did not become ready in {timeout:g} s")
            if cancelled():
                raise RuntimeError("kernel start cancelled")
            if not self.alive():
                raise RuntimeError("kernel died while starting")
            if not shell and now >= next_send:
                sent.add(self.kc.kernel_info())
                next_send = now + 0.05
            wait = min(0.05, next_send - now) if not shell else 0.05  # (and look again at alive and cancelled)
            ready = dict(poller.poll(max(1, int(wait * 1000))))
            if self.shell.socket in ready:
                reply = self.shell.get_msg(timeout=0)
                shell = shell or reply["parent_header"].get("msg_id") in sent
            if self.iopub.socket in ready:
                self.iopub.get_msg(timeout=0)
                iopub = True
        self._drain_iopub()
        self._drain_shell()

    def execute(self, code: str, timeout: float | None = None, on_timeout=None, stop=None) -> CellResult:
        """Run a cell; interrupt it past `timeout` seconds of its own running (calling `on_timeout` first),
        or once `stop()` is true: time spent queued behind other code (a connected console's) does not
        count, and what the interrupt would hit then is not ours. A cell that will not stop within
        INTERRUPT_GRACE_S of the interrupt, or a kernel that dies, ends with `died`. A cell the kernel
        aborted (code queued before it raised) is sent once more; aborted again, it ends `not_run`."""
        self.busy = True
        try:
            result = self._execute(code, timeout, on_timeout, stop)
            if result.not_run:
                result = self._execute(code, timeout, on_timeout, stop)
            if result.not_run:
                result.error = ABORTED
            return result
        finally:
            self.busy = False

    def _execute(self, code: str, timeout: float | None, on_timeout, stop) -> CellResult:
        started = time.monotonic()
        result = CellResult()
        msg_id = self.kc.execute(code, store_history=True, allow_stdin=False)
        # The kernel runs this cell's handler. ipykernel ignores SIGINT until then (an interrupt sent at its
        # `busy` can land before, and be lost): the sign is its `execute_input`, or any output of it (iopub
        # drops messages past its high-water mark), not `busy`.
        running = False
        deadline = None  # then, with a timeout: when it is interrupted
        interrupted_at = None
        last_alive_check = started
        while True:
            try:
                msg = self.iopub.get_msg(timeout=0.1)
            except Exception:  # nothing yet
                msg = None
            now = time.monotonic()
            if msg is None and now - last_alive_check > 0.5:
                last_alive_check = now
                if not self.alive():
                    result.died = True
                    result.error = result.error or "the kernel died while running this cell"
                    break
            if deadline and now > deadline and interrupted_at is None:
                result.timed_out = True
                if on_timeout:
                    on_timeout()
                self.interrupt()
                interrupted_at = now
            elif running and stop is not None and interrupted_at is None and stop():
                self.interrupt()  # (a stop that came before the cell ran: the interrupt would have been lost)
                interrupted_at = now
            elif interrupted_at is not None and now - interrupted_at > INTERRUPT_GRACE_S:
                result.died = True  # would not stop: only a new kernel goes on
                break
            if msg is None or msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if not running and kind != "status":
                running = True
                if timeout:
                    deadline = time.monotonic() + timeout
            if kind == "stream":
                result.parts.append(content.get("text", ""))
            elif kind in ("execute_result", "display_data"):
                text = content.get("data", {}).get("text/plain")
                if text:
                    result.parts.append(text + "\n")
            elif kind == "error":
                tb = "\n".join(ANSI.sub("", line) for line in content.get("traceback", []))
                result.error = tb or f"{content.get('ename')}: {content.get('evalue')}"
            elif kind == "status" and content.get("execution_state") == "idle":
                break
            elif kind == "clear_output":
                result.parts.clear()
        if not result.died:
            # (an interrupt that landed in ipykernel's code around the cell's leaves no reply)
            reply = self._shell_reply(msg_id, timeout=1.0 if interrupted_at else 5.0)
            result.not_run = reply is not None and reply["content"].get("status") == "aborted"
        self._drain_shell()
        result.output = "".join(result.parts)
        result.elapsed_s = round(time.monotonic() - started, 4)
        return result

    def _shell_reply(self, msg_id: str, timeout: float = 5.0) -> dict | None:
        """The shell reply to our request (it comes before the iopub `idle` that ended the wait)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                reply = self.shell.get_msg(timeout=0.1)
            except Exception:
                continue
            if reply["parent_header"].get("msg_id") == msg_id:
                return reply
        return None

    def evaluate(self, expr: str, timeout: float = 60.0) -> str:
        """The repr of a Python expression evaluated in the kernel (silently: no output, no history)."""
        msg_id = self.kc.execute("", silent=True, store_history=False, user_expressions={"r": expr},
                                 allow_stdin=False)
        deadline = time.monotonic() + timeout
        while True:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the kernel did not evaluate {expr[:60]!r} within {timeout:g} s")
            try:
                reply = self.shell.get_msg(timeout=0.1)
            except Exception:
                if not self.alive():
                    raise RuntimeError("the kernel died") from None
                continue
            if reply["parent_header"].get("msg_id") != msg_id:
                continue
            value = reply["content"].get("user_expressions", {}).get("r", {})
            if value.get("status") != "ok":
                raise RuntimeError(f"{value.get('ename')}: {value.get('evalue')}")
            self._drain_iopub()
            return value["data"]["text/plain"]

    def _drain_iopub(self) -> None:
        _drain(self.iopub.get_msg)

    def _drain_shell(self) -> None:
        _drain(self.shell.get_msg)

    def close(self) -> None:
        try:
            self.kc.stop_channels()
        except Exception:
            pass


def _drain(get) -> None:
    """Take every message waiting on a channel (get: a client's get_*_msg), until none is left."""
    try:
        while True:
            get(timeout=0)
    except Exception:  # queue.Empty, or a channel already closed
        pass
