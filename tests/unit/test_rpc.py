"""The kernel -> runner socket: a kernel that connects while the runner's backlog is full waits its turn (up to
its timeout) instead of failing at once; many kernels starting together each say hello."""
import socket
import threading

import pytest

from primefs.kernels.inside.rpc import RpcServer, _Server, call


def test_a_full_backlog_is_waited_out_not_a_failure(tmp_path):
    server = RpcServer(tmp_path / "rpc", lambda token, pid, op, args: f"{op} from {token}")
    server.server.shutdown()  # no more accepts: connections pile up in the backlog
    server.thread.join()
    filler = []
    try:
        while True:  # fill the backlog: then a connect with a timeout fails at once (EAGAIN)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.setblocking(False)
            filler.append(s)
            s.connect(str(server.path))
    except BlockingIOError:
        pass
    assert len(filler) > _Server.request_queue_size
    with pytest.raises(TimeoutError, match="did not accept a connection in 0.2 s"):
        call(str(server.path), "t", "hello", timeout=0.2)

    got = []
    caller = threading.Thread(target=lambda: got.append(call(str(server.path), "t", "hello", timeout=30)))
    caller.start()
    for s in filler:  # the runner catches up: the backlog drains
        s.close()
    accept = threading.Thread(target=server.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    accept.start()
    caller.join(30)
    assert got == ["hello from t"]
    server.close()


def test_slow_and_many_requests_hold_neither_memory_nor_files(tmp_path, monkeypatch):
    """A kernel is untrusted: a byte of its request every few seconds held a connection for ever (the timeout
    was per read), and thousands of such connections took every file the runner may open; a few huge ones
    took gigabytes. Now a request must arrive whole in READ_TIMEOUT_S, and past MAX_READING connections (or
    MAX_READING_BYTES) still arriving, a new one is refused at once; the others are served."""
    import time

    from primefs.kernels.inside import rpc

    monkeypatch.setattr(rpc, "READ_TIMEOUT_S", 1.0)
    monkeypatch.setattr(rpc, "MAX_READING", 3)
    monkeypatch.setattr(rpc, "MAX_READING_BYTES", 3 * rpc.CHUNK)
    monkeypatch.setattr(rpc, "BUSY_RETRY_S", 0.0)  # (refused at once: see the test below for the retries)
    server = RpcServer(tmp_path / "rpc", lambda token, pid, op, args: f"{op} from {token}")

    def slow() -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(str(server.path))
        s.sendall(b'{"token": "t", ')
        return s

    try:
        drips = [slow() for _ in range(3)]
        time.sleep(0.2)  # (all three being read)
        with pytest.raises(rpc.RpcError, match="too many requests at once"):
            call(str(server.path), "t", "hello", timeout=5)
        started = time.monotonic()
        for s in drips:  # a byte now and then does not keep it: closed after 1 s in all
            try:
                while not _readable(s) and time.monotonic() - started < 10:
                    s.sendall(b" ")
                    time.sleep(0.1)
            except OSError:  # (closed between two looks)
                pass
            s.close()
        assert time.monotonic() - started < 6
        assert call(str(server.path), "t", "hello", timeout=5) == "hello from t"
        big = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # more bytes than all may hold at once
        big.connect(str(server.path))
        try:
            big.sendall(b'{"token": "' + b"x" * (4 * rpc.CHUNK))
        except OSError:  # refused part way, its connection closed
            pass
        assert b"request over" in big.recv(4096)
        big.close()
        assert call(str(server.path), "t", "hello", timeout=5) == "hello from t"
    finally:
        server.close()


def _readable(s: socket.socket) -> bool:
    import select

    return bool(select.select([s], [], [], 0)[0])


def test_a_request_refused_as_busy_is_sent_again_until_it_is_read(tmp_path, monkeypatch):
    """A burst of a tree's own requests past its share is not a failure: `call` sends a request the runner
    refused unread (Busy) again, for up to BUSY_RETRY_S."""
    import time

    from primefs.kernels.inside import rpc

    monkeypatch.setattr(rpc, "MAX_READING", 2)
    server = RpcServer(tmp_path / "rpc", lambda token, pid, op, args: f"{op} from {token}")
    drips = []
    try:
        for _ in range(2):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(str(server.path))
            s.sendall(b'{"token": ')
            drips.append(s)
        time.sleep(0.2)  # (both being read)
        got = []
        caller = threading.Thread(target=lambda: got.append(call(str(server.path), "t", "hello", timeout=30)))
        caller.start()
        time.sleep(0.3)
        assert not got  # refused, and trying again
        for s in drips:
            s.close()
        caller.join(10)
        assert got == ["hello from t"]
    finally:
        server.close()
