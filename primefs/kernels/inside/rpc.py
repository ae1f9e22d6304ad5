"""Kernel -> runner requests over one unix socket (newline-delimited JSON, one request per connection).

Kernels never import litellm or touch other sessions' state: helpers such as llm() and done()
ask the runner. Each request carries its kernel's token, and the server passes the handler the
caller's pid as the OS reports it (SO_PEERCRED), so the host can check that the token is used by
the process tree it was issued to: a stolen token is useless elsewhere.
"""
from __future__ import annotations

import json
import os
import re
import socket
import socketserver
import struct
import threading
import time
from pathlib import Path
from typing import Callable

from primefs.errors import PrimefsError

Handler = Callable[[str, int, str, dict], object]  # (token, caller pid, op, args) -> JSON-able result
MAX_REQUEST_BYTES = 512 * 1024 * 1024  # a request is one line: an rlm() context travels in it
READ_TIMEOUT_S = 30.0  # for the whole request line, not for each read: a byte now and then holds nothing
# Requests still arriving, over all connections (a kernel is untrusted: slow or huge requests by the thousand
# took the runner's memory and every file descriptor it may open): past either, a new one is refused at once.
MAX_READING = 256
MAX_READING_BYTES = 2 * MAX_REQUEST_BYTES
# ... and from the kernels of one owner (a session tree: `owner`), so that one holding all of them cannot make
# every other kernel's requests fail
MAX_READING_EACH = 32
MAX_READING_BYTES_EACH = MAX_REQUEST_BYTES
CHUNK = 1 << 20


class Busy(RuntimeError):
    """The runner reads too many requests at once (of this caller's tree, or of all): nothing of it was done."""


BUSY_RETRY_S = 10.0  # how long a caller tries again (a burst of its own passes; a flood of another's is not its)


class RpcError(Exception):
    def __init__(self, message: str, kind: str = ""):
        super().__init__(message)
        self.kind = kind  # the runner-side exception type name


def error_reply(exc: Exception) -> dict:
    """The reply for a request that raised: its message and the name of its type (kept as it was
    when the error was forwarded from another process, e.g. from the runner through a Ray node)."""
    if isinstance(exc, RpcError) and exc.kind:
        kind = exc.kind
    else:
        kind = "PrimefsError" if isinstance(exc, PrimefsError) else type(exc).__name__
    return {"ok": False, "error": str(exc), "type": kind}


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128  # (socketserver's 5: kernels starting together found it full)


def _loads(line: bytes) -> dict:
    """A request as the runner takes it: lone surrogates (JSON's \\ud800, e.g. a document's broken bytes read
    with surrogateescape) replaced by U+FFFD, since no file, YAML or model request can hold them (a done() answer
    with one failed its session). Strings are walked only if the line has such an escape."""
    req = json.loads(line)
    if _SURROGATE.search(line):
        from primefs.store.history import mend_surrogates  # (where requests are served, never in a kernel)

        req = mend_surrogates(req)
    return req


_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")


class RpcServer:
    def __init__(self, path: Path, handler: Handler, owner: Callable[[int], str] | None = None):
        """`owner(pid)`: whose the calling process is (its kernel's session tree; "" if no kernel's), for the
        shares of MAX_READING_EACH; without it, all callers are one."""
        self.path = Path(path)
        self.handler = handler
        self.owner = owner
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        outer = self

        self.lock = threading.Lock()
        self.reading = 0  # connections whose request is still arriving
        self.reading_bytes = 0  # what they sent so far
        self.reading_of: dict[str, list[int]] = {}  # owner -> [connections, bytes] of those

        class Conn(socketserver.StreamRequestHandler):
            timeout = READ_TIMEOUT_S  # a caller that connects and says nothing holds no thread for long

            def handle(self):
                pid = peer_pid(self.connection)
                owner = outer.owner(pid) if outer.owner is not None else ""
                with outer.lock:
                    mine = outer.reading_of.setdefault(owner, [0, 0])
                    busy = outer.reading >= MAX_READING or mine[0] >= MAX_READING_EACH
                    if not busy:
                        outer.reading += 1
                        mine[0] += 1
                    elif not mine[0]:
                        del outer.reading_of[owner]
                if busy:
                    self._reply(error_reply(Busy("the runner is reading too many requests at once; try again")))
                    return
                held = [0]
                try:
                    line = self._read_line(held, mine)
                except (OSError, ValueError) as exc:  # slow, huge, or cut off
                    if not isinstance(exc, ValueError):
                        return
                    self._reply(error_reply(exc))
                    return
                finally:
                    with outer.lock:
                        outer.reading -= 1
                        outer.reading_bytes -= held[0]
                        mine[0] -= 1
                        mine[1] -= held[0]
                        if not mine[0]:
                            outer.reading_of.pop(owner, None)
                if not line:
                    return
                self.connection.settimeout(None)  # the answer may take hours (wait(), recv())
                try:
                    req = _loads(line)
                    result = outer.handler(str(req.get("token", "")), pid, str(req["op"]), req.get("args") or {})
                    reply = {"ok": True, "result": result}
                except Exception as exc:  # becomes an exception in the cell, not a runner crash
                    reply = error_reply(exc)
                self._reply(reply)

            def _read_line(self, held: list, mine: list) -> bytes:
                """The request line, within READ_TIMEOUT_S in all; its bytes counted in outer.reading_bytes
                and its owner's (held[0]) while it arrives."""
                deadline = time.monotonic() + READ_TIMEOUT_S
                chunks = []
                while True:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError("the request did not arrive in time")
                    self.connection.settimeout(left)  # (recv, not a buffered readline: its reads each wait)
                    chunk = self.connection.recv(CHUNK)
                    if not chunk:
                        return b""  # the caller went away, or cut its request off
                    with outer.lock:
                        over = (outer.reading_bytes + len(chunk) > MAX_READING_BYTES
                                or mine[1] + len(chunk) > MAX_READING_BYTES_EACH)
                        if not over:
                            outer.reading_bytes += len(chunk)
                            mine[1] += len(chunk)
                            held[0] += len(chunk)
                    if over or held[0] > MAX_REQUEST_BYTES:
                        raise ValueError(f"request over {MAX_REQUEST_BYTES:,} bytes (with the others arriving)")
                    chunks.append(chunk)
                    if b"\n" in chunk:  # (one request per connection: nothing follows its line)
                        line = b"".join(chunks)
                        return line[:line.index(b"\n") + 1]

            def _reply(self, reply: dict) -> None:
                try:
                    self.wfile.write((json.dumps(reply, default=str) + "\n").encode())
                except OSError:
                    pass

        self.server = _Server(str(self.path), Conn)
        os.chmod(self.path, 0o600)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       name="primefs-rpc", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass


def peer_pid(conn: socket.socket) -> int:
    """The pid of the process at the other end of a unix socket, from the kernel (0 where unknown)."""
    try:
        pid, _uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                               struct.calcsize("3i")))
        return pid
    except (OSError, AttributeError):  # no SO_PEERCRED on this platform
        return 0


def _connect(s: socket.socket, path: str, timeout: float | None) -> None:
    """Connect; a full backlog (the runner busy accepting) is waited out, up to `timeout`. With a timeout the
    socket is non-blocking, and a unix socket's connect to a full backlog then fails at once (EAGAIN)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    pause = 0.001
    while True:
        try:
            s.connect(path)
            return
        except BlockingIOError:
            if deadline is not None and time.monotonic() + pause > deadline:
                raise TimeoutError(f"the primefs runner did not accept a connection in {timeout} s") from None
            time.sleep(pause)  # (no event to wait on: the backlog has room again when the runner accepts)
            pause = min(pause * 2, 0.05)


def call(path: str, token: str, op: str, args: dict | None = None, timeout: float | None = None):
    """Client side (runs in the kernel): send one request, wait for its reply. Refused as Busy (read by nobody),
    it is sent again for up to BUSY_RETRY_S (or `timeout`, if shorter)."""
    deadline = time.monotonic() + min(BUSY_RETRY_S, timeout if timeout is not None else BUSY_RETRY_S)
    pause = 0.01
    while True:
        try:
            return _call(path, token, op, args, timeout)
        except RpcError as exc:
            if exc.kind != "Busy" or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)  # (nothing to wait on: the runner's reads end in their own time)
        pause = min(pause * 2, 0.5)


def _call(path: str, token: str, op: str, args: dict | None, timeout: float | None):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        _connect(s, path, timeout)
        try:
            s.sendall((json.dumps({"token": token, "op": op, "args": args or {}}) + "\n").encode())
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused before it was sent (Busy): the reply that says so is still there to read
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                raise RpcError("the primefs runner closed the connection (was it stopped?)")
            buf += chunk
    reply = json.loads(buf)
    if not reply["ok"]:
        raise RpcError(reply["error"], reply.get("type", ""))
    return reply["result"]
