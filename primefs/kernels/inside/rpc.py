"""Kernel -> runner requests over one unix socket (newline-delimited JSON, one request per connection).

Kernels never import litellm or touch other sessions' state: helpers such as llm() and done()
ask the runner. Each request carries its kernel's token, and the server passes the handler the
caller's pid as the OS reports it (SO_PEERCRED), so the host can check that the token is used by
the process tree it was issued to: a stolen token is useless elsewhere.
"""
from __future__ import annotations

import json
import os
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
READ_TIMEOUT_S = 30.0


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


class RpcServer:
    def __init__(self, path: Path, handler: Handler):
        self.path = Path(path)
        self.handler = handler
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        outer = self

        class Conn(socketserver.StreamRequestHandler):
            timeout = READ_TIMEOUT_S  # a caller that connects and says nothing holds no thread for long

            def handle(self):
                try:
                    line = self.rfile.readline(MAX_REQUEST_BYTES + 1)
                except OSError:
                    return
                if not line:
                    return
                if len(line) > MAX_REQUEST_BYTES or not line.endswith(b"\n"):
                    self._reply(error_reply(ValueError(f"request over {MAX_REQUEST_BYTES:,} bytes, or cut off")))
                    return
                self.connection.settimeout(None)  # the answer may take hours (wait(), recv())
                try:
                    req = json.loads(line)
                    result = outer.handler(str(req.get("token", "")), peer_pid(self.connection), str(req["op"]),
                                           req.get("args") or {})
                    reply = {"ok": True, "result": result}
                except Exception as exc:  # becomes an exception in the cell, not a runner crash
                    reply = error_reply(exc)
                self._reply(reply)

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
    """Client side (runs in the kernel): send one request, wait for its reply."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        _connect(s, path, timeout)
        s.sendall((json.dumps({"token": token, "op": op, "args": args or {}}) + "\n").encode())
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
