"""One MCP server as the runner keeps it (mcptools.py has the hub): a task on the hub's loop starts
the server, keeps its client session, notices when it ends and starts it again, after a backoff
while it keeps failing; a call that times out kills the server's process before it is reported, so
the call cannot run afterwards. A stdio server runs through a transport of our own, since the SDK's
stdio_client keeps the process to itself: its exit code and the end of its stderr say why it ended."""
from __future__ import annotations

import collections
import math
import os
import signal
import threading
import time
from contextlib import asynccontextmanager, suppress

import anyio

from primefs.errors import PrimefsError

STDERR_LINES = 8       # the end of a server's stderr that is kept to say why it ended
QUIT_GRACE_S = 2.0     # after its stdin is closed a server may take this long to exit, then it is signalled
STEADY_S = 10.0        # a server that ran this long is started again at once when it ends
MAX_BACKOFF_S = 60.0   # retries of a failing server: after 1, 2, 4 ... s, then every minute


class Process:
    """A stdio server's process: the end of its stderr, and whether it ended by itself."""

    def __init__(self, lost: anyio.Event):
        self.proc = None
        self.lost = lost            # set when its stdout closes
        self.stderr: collections.deque[str] = collections.deque(maxlen=STDERR_LINES)
        self.stderr_done = anyio.Event()
        self.ours = False           # we closed or killed it (its end is not news)
        self.ended_itself = False

    def kill(self) -> None:
        self.ours = True
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # its own group (start_new_session): children too

    async def reaped(self, timeout: float) -> bool:
        # polled: asyncio's wait() also waits for pipes that a surviving child may hold open
        with anyio.move_on_after(timeout):
            while self.proc.returncode is None:
                await anyio.sleep(0.01)
        return self.proc.returncode is not None

    def ending(self, starting: bool) -> str:
        code = self.proc.returncode
        how = ("closed its stdout" if code is None else f"exited with code {code}" if code >= 0
               else f"was killed by signal {-code} ({signal.Signals(-code).name})")
        return how + (" while starting" if starting else "") + self.said()

    def said(self) -> str:
        tail = " | ".join(self.stderr)[-1000:]
        return f"; its stderr ends: {tail}" if tail else ""


@asynccontextmanager
async def stdio_transport(argv: list[str], env: dict, cwd, p: Process):
    """The SDK's read and write streams over a server process's stdout and stdin (JSON lines)."""
    p.proc = await anyio.open_process(argv, env=env, cwd=cwd, start_new_session=True)
    read_in, read_out = anyio.create_memory_object_stream(0)
    write_in, write_out = anyio.create_memory_object_stream(0)

    async def from_stdout():
        try:
            async with read_in:
                async for line in _lines(p.proc.stdout):
                    await read_in.send(_message(line))
            p.ended_itself = not p.ours  # its stdout closed, and not by our doing
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass
        finally:
            p.lost.set()

    async def to_stdin():
        try:
            async with write_out:
                async for m in write_out:
                    await p.proc.stdin.send(m.message.model_dump_json(by_alias=True, exclude_unset=True).encode()
                                            + b"\n")
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await read_in.aclose()  # the session sees the end instead of waiting for an answer

    async def from_stderr():
        with suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            async for line in _lines(p.proc.stderr):
                p.stderr.append(line.decode(errors="replace").strip()[:300])
        p.stderr_done.set()

    async with anyio.create_task_group() as tg:
        for task in (from_stdout, to_stdin, from_stderr):
            tg.start_soon(task)
        try:
            yield read_out, write_in
        finally:
            with anyio.CancelScope(shield=True):
                await _quit(p)
                for stream in (read_out, write_in):
                    await stream.aclose()
            tg.cancel_scope.cancel()


async def _lines(stream):
    """The non-blank lines of a byte stream, however they come in chunks."""
    parts: list[bytes] = []
    async for chunk in stream:
        *lines, rest = chunk.split(b"\n")
        if lines:
            lines[0], parts = b"".join([*parts, lines[0]]), []
        parts.append(rest)
        for line in filter(bytes.strip, lines):
            yield line
    if b"".join(parts).strip():
        yield b"".join(parts)


def _message(line: bytes):
    import mcp_types
    from mcp.shared.message import SessionMessage

    try:
        return SessionMessage(mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as exc:  # handed to the session, which says so
        return exc


async def _quit(p: Process) -> None:
    """Ask the server to quit (the spec's way: close its stdin), then signal its group; keep its last words."""
    from mcp.os.posix.utilities import terminate_posix_process_tree

    p.ours = p.ours or not p.lost.is_set()
    with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        await p.proc.stdin.aclose()
    if not await p.reaped(QUIT_GRACE_S):
        await terminate_posix_process_tree(p.proc, 2.0)  # SIGTERM, then SIGKILL
        await p.reaped(2.0)
    with anyio.move_on_after(1):
        await p.stderr_done.wait()


class _Conn:
    """One connection to a server, from its start to its end."""

    def __init__(self):
        self.session = None
        self.lost = anyio.Event()   # it ended, or should: the supervisor closes it
        self.ended = anyio.Event()  # closed; `why` says why
        self.why: str | None = None
        self.process: Process | None = None
        self.scope: anyio.CancelScope | None = None


class Server:
    """A server's state for listings (`state`: starting, up or down; `problem`; `tools` as last listed)
    and calls; `supervise()` runs on the hub's loop for the runner's life."""

    def __init__(self, name: str, spec: dict, timeout: float, log, transport):
        self.name, self.spec, self.timeout, self.log, self._transport = name, spec, timeout, log, transport
        self.state, self.problem, self.tools = "starting", None, []
        self.retry_at: float | None = None
        self.attempts = 0               # starts that have ended (up or not)
        self.tried = threading.Event()  # the first start has ended, up or not
        self.conn: _Conn | None = None
        self._stopping = False
        self._news = self._wake = None

    def describe(self) -> str | None:
        """Why its tools cannot be used now (None while it is up)."""
        if self.state == "up":
            return None
        if self.problem is None:
            return f"MCP server {self.name}: starting"
        if self.state == "starting" or self.retry_at is None:
            return f"{self.problem}; retrying now"
        return f"{self.problem}; retrying in {max(0, math.ceil(self.retry_at - time.monotonic()))} s"

    def _set(self, state: str) -> None:
        self.state = state
        self._news.set()
        self._news = anyio.Event()

    def open(self) -> None:
        """On the hub's loop, before anything waits on this server."""
        self._news, self._wake = anyio.Event(), anyio.Event()

    async def supervise(self) -> None:
        failures = 0
        while not self._stopping:
            self._set("starting")
            up_for = await self._connect()
            self.attempts += 1
            if self._stopping:
                break
            failures = 0 if up_for >= STEADY_S else failures + 1
            delay = 0.0 if failures == 0 else min(2.0 ** (failures - 1), MAX_BACKOFF_S)
            problem = f"MCP server {self.name}: {self.conn.why}"
            if problem != self.problem:  # said once, not at every retry
                self.log(f"warning: {problem}")
            self.problem, self.retry_at = problem, time.monotonic() + delay
            self._wake = anyio.Event()
            self._set("down")
            self.tried.set()
            with anyio.move_on_after(delay):
                await self._wake.wait()  # or a call wants it now
        self.tried.set()

    async def _connect(self) -> float:
        """One connection, from the server's start to its end; how long it was up."""
        from mcp import ClientSession

        conn = self.conn = _Conn()
        up_since = None
        with anyio.CancelScope() as conn.scope:
            try:
                async with self._transport(conn) as streams, ClientSession(streams[0], streams[1]) as session:
                    with anyio.fail_after(self.timeout):
                        await session.initialize()
                        tools = (await session.list_tools()).tools
                    conn.session, self.tools = session, tools
                    up_since = time.monotonic()
                    if self.problem:
                        self.log(f"MCP server {self.name} is up again ({len(tools)} tools)")
                    self.problem = None
                    self._set("up")
                    self.tried.set()
                    await conn.lost.wait()
            except Exception as exc:  # noqa: BLE001 - whatever ends a server is said as its problem
                leaf = _leaf(exc)
                late = isinstance(leaf, TimeoutError) and up_since is None
                conn.why = conn.why or (f"did not start within {self.timeout:g} s" if late else _why(leaf))
        p = conn.process
        if p is not None and p.proc is not None and p.ended_itself:
            conn.why = p.ending(starting=up_since is None)
        elif p is not None:
            conn.why = (conn.why or "the connection ended") + p.said()
        conn.why = conn.why or "the connection ended"
        conn.session = None
        conn.ended.set()
        return 0.0 if up_since is None else time.monotonic() - up_since

    # -- calls ------------------------------------------------------------------------------------
    async def call(self, tool: str, arguments: dict):
        deadline = anyio.current_time() + self.timeout
        conn = await self._up(deadline)
        try:
            with anyio.fail_after(max(0.0, deadline - anyio.current_time())):
                return await conn.session.call_tool(tool, arguments)
        except TimeoutError:
            await self._restart(conn, f"restarted: its tool {tool} did not answer within {self.timeout:g} s")
            raise TimeoutError(f"MCP tool {tool} of server {self.name} did not answer within {self.timeout:g} s; "
                               + ("the server was restarted (its process killed)" if conn.process else
                                  "it was asked to cancel the call, and the connection was made anew")) from None
        except Exception as exc:
            if not conn.lost.is_set() and await _answers(conn.session):
                raise  # the tool's own error
            conn.lost.set()
            with anyio.move_on_after(QUIT_GRACE_S + 5):
                await conn.ended.wait()
            raise RuntimeError(f"MCP server {self.name} is gone ({conn.why or _why(exc)}); "
                               "it is started again") from None

    async def _up(self, deadline: float) -> _Conn:
        """The connection once the server is up; a call to a server that is down retries it at once."""
        seen = None  # the start this call waits on: once it has ended, the call has its answer
        while True:
            news, conn = self._news, self.conn
            if self.state == "up" and not conn.lost.is_set():
                return conn
            if self.state == "starting" and seen is None:
                seen = self.attempts
            elif self.state == "down":
                if seen is not None and self.attempts > seen:
                    raise RuntimeError(self.problem)
                seen = self.attempts
                self._wake.set()
            with anyio.move_on_after(max(0.0, deadline - anyio.current_time())):
                await news.wait()
            if anyio.current_time() >= deadline:
                raise TimeoutError(f"MCP server {self.name} did not come up within {self.timeout:g} s")

    async def _restart(self, conn: _Conn, why: str) -> None:
        conn.why = why
        if conn.process is not None and conn.process.proc is not None:
            conn.process.kill()
            await conn.process.reaped(5)  # dead before the timeout is reported
        conn.lost.set()

    def stop(self) -> None:
        """On the hub's loop: end the connection (a start in progress too) and the supervisor."""
        self._stopping = True
        if self._wake is not None:
            self._wake.set()
        if self.conn is not None and self.conn.scope is not None:
            self.conn.scope.cancel()


async def _answers(session) -> bool:
    """Does the server still answer? (a failed call may be the tool's failure, or the connection's)"""
    try:
        with anyio.fail_after(2):
            await session.send_ping()
        return True
    except Exception:  # noqa: BLE001
        return False


def _leaf(exc: BaseException) -> BaseException:
    """The first exception inside task groups' ExceptionGroups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _why(exc: BaseException) -> str:
    exc = _leaf(exc)
    if isinstance(exc, PrimefsError):  # says it all (a mistake in primefs.yaml)
        return str(exc)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
