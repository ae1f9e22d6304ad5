"""One persistent IPython kernel per session (jupyter_client + ipykernel).

Kernels use the ipc transport with a unique path per kernel in the workspace's runtime folder
(TCP races on ports when many kernels start together), get a scrubbed environment (model-written
code must not read the runner's API keys), and run with the workspace root as working directory.
"""
from __future__ import annotations

import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from jupyter_client import KernelManager

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# Environment variables a kernel may see; everything else (API keys above all) stays in the runner.
SAFE_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TERM", "TZ", "TMPDIR", "SHELL",
            "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHASHSEED")


def kernel_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k in SAFE_ENV or k.startswith("LC_")}
    env["PYTHONUNBUFFERED"] = "1"
    env["MPLBACKEND"] = "agg"
    env.setdefault("JUPYTER_PLATFORM_DIRS", "1")
    return env


@dataclass
class CellResult:
    output: str = ""
    error: str | None = None  # "Name: value" plus traceback, if the cell raised
    timed_out: bool = False
    restarted: bool = False  # the kernel died (or would not stop) and was restarted: variables are gone
    elapsed_s: float = 0.0
    parts: list[str] = field(default_factory=list)


def cut(text: str, limit: int) -> str:
    """Keep head and tail of long output, and say how much was cut."""
    if limit <= 0 or len(text) <= limit:
        return text
    head = limit * 2 // 3
    tail = limit - head
    return f"{text[:head]}\n... [{len(text) - limit} characters cut] ...\n{text[-tail:]}"


class Kernel:
    def __init__(self, runtime_dir: Path, name: str, cwd: Path):
        self.runtime_dir = Path(runtime_dir)
        self.name = name
        self.cwd = Path(cwd)
        self.km: KernelManager | None = None
        self.kc = None
        self.bootstrap: str | None = None  # code run after every (re)start
        self.cancelled = False  # set from another thread to abandon a start in progress

    def start(self) -> None:
        self.runtime_dir.mkdir(parents=True, exist_ok=True)
        base = self.runtime_dir / self.name
        self.km = KernelManager(transport="ipc", ip=str(base), connection_file=str(base) + ".json",
                                kernel_name="python3")
        # Always the interpreter primefs runs in, so primefs.kernel_api is importable in the kernel.
        self.km.kernel_cmd = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}",
                              "--HistoryManager.enabled=False"]
        self.km.start_kernel(env=kernel_env(), cwd=str(self.cwd))
        self.kc = self.km.blocking_client()
        self.kc.start_channels(hb=False)  # liveness comes from the process; saves a thread per kernel
        self._wait_ready()
        # The file holds the key that signs messages to this kernel; code in other kernels (same user)
        # could read it and drive this one. Both sides have it in memory now: remove it.
        try:
            os.unlink(self.km.connection_file)
        except OSError:
            pass
        if self.bootstrap:
            result = self.execute(self.bootstrap, timeout=60)
            if result.error:
                raise RuntimeError(f"kernel bootstrap failed: {result.error}")

    def _wait_ready(self, timeout: float = 60.0) -> None:
        # Re-send kernel_info until a reply comes: faster than wait_for_ready's iopub handshake.
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.cancelled:
                raise RuntimeError("kernel start cancelled")
            msg_id = self.kc.kernel_info()
            try:
                while True:
                    reply = self.kc.get_shell_msg(timeout=0.05)
                    if reply["parent_header"].get("msg_id") == msg_id:
                        self._drain_iopub()
                        return
            except Exception:  # queue.Empty: not ready yet
                if not self.km.is_alive():
                    raise RuntimeError("kernel died while starting")
        raise RuntimeError("kernel did not become ready in time")

    def _drain_iopub(self) -> None:
        try:
            while True:
                self.kc.get_iopub_msg(timeout=0.01)
        except Exception:
            pass

    def is_alive(self) -> bool:
        return self.km is not None and self.km.is_alive()

    def execute(self, code: str, timeout: float | None = None, on_timeout=None) -> CellResult:
        """Run a cell; interrupt it past `timeout` seconds (calling `on_timeout` first); restart the
        kernel if it dies."""
        started = time.monotonic()
        result = CellResult()
        msg_id = self.kc.execute(code, store_history=True, allow_stdin=False)
        deadline = started + timeout if timeout else None
        interrupted_at = None
        last_alive_check = started
        while True:
            try:
                msg = self.kc.get_iopub_msg(timeout=0.1)
            except Exception:  # nothing yet
                now = time.monotonic()
                if now - last_alive_check > 0.5:
                    last_alive_check = now
                    if not self.km.is_alive():
                        self._restart(result)
                        result.error = result.error or "the kernel died while running this cell"
                        break
                if deadline and now > deadline and interrupted_at is None:
                    result.timed_out = True
                    if on_timeout:
                        on_timeout()
                    self.km.interrupt_kernel()
                    interrupted_at = now
                elif interrupted_at is not None and now - interrupted_at > 5:
                    self._restart(result)  # would not stop: a fresh kernel is the only way on
                    break
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
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
            if deadline and time.monotonic() > deadline and interrupted_at is None:
                result.timed_out = True
                if on_timeout:
                    on_timeout()
                self.km.interrupt_kernel()
                interrupted_at = time.monotonic()
        self._drain_shell()
        result.output = "".join(result.parts)
        result.elapsed_s = round(time.monotonic() - started, 4)
        return result

    def _drain_shell(self) -> None:
        try:
            while True:
                self.kc.get_shell_msg(timeout=0)
        except Exception:
            pass

    def _restart(self, result: CellResult) -> None:
        result.restarted = True
        self.shutdown()
        self.start()

    def interrupt(self) -> None:
        if self.km is not None:
            self.km.interrupt_kernel()

    def shutdown(self) -> None:
        if self.kc is not None:
            try:
                self.kc.stop_channels()
            except Exception:
                pass
            self.kc = None
        if self.km is not None:
            try:
                self.km.shutdown_kernel(now=True)
            except Exception:
                pass
            try:
                self.km.cleanup_resources()
            except Exception:
                pass
            self.km = None
