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
