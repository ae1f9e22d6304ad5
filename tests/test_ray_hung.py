"""A hung Ray node (its processes stopped, not crashed), on a cluster of its own: Ray's own health checks
at their defaults, its dashboard on for the state API. Its own module, so the cluster of test_ray.py is
gone first (two clusters at once on a small machine starve each other)."""
from __future__ import annotations

import os
import signal
import time

import pytest
from conftest import BackgroundRunner, wait_for
from test_ray import by_name, on_ray

from primefs.store.goals import write_goal

pytestmark = [pytest.mark.netns, pytest.mark.slow]


def test_a_hung_node_is_lost_within_seconds_and_its_session_goes_on(ws):
    """A node whose processes are stopped (SIGSTOP: hung, not crashed) is dead to Ray only after ~30-60 s;
    primefs's heartbeat loses it in 10-15 s and the session goes on on the other node. The node's actor is
    found through Ray's own state API."""
    pytest.importorskip("ray")
    from ray.cluster_utils import Cluster
    from ray.util.state import list_actors

    c = Cluster(initialize_head=True, connect=False, head_node_args={"num_cpus": 0, "include_dashboard": True})
    workers = {name: c.add_node(num_cpus=4, resources={name: 1000, "worker": 1000}) for name in ("w1", "w2")}
    c.wait_for_nodes()
    (ws.root / "script.yaml").write_text(
        "rules:\n  - match: '^Work'\n    replies:\n      - code: \"import time\\nopen('started.txt', 'w').write('1')\\n"
        "time.sleep(300)\"\n      - code: \"print('after')\"\n      - text: finished\n")
    ws = on_ray(ws, c, model="scripted/script.yaml")
    write_goal(ws, "Work", name="w")
    stopped = []
    try:
        with BackgroundRunner(ws) as br:
            w = wait_for(lambda: by_name(ws).get("w"), what="the session")
            wait_for(lambda: (w.dir / "work" / "started.txt").exists(), 90, "the long cell")
            node = w.reload()["node"]
            actor = next(a for a in list_actors(address=c.address, filters=[("class_name", "=", "NodeKernels")])
                         if node.startswith(a.node_id[:8]))
            doomed = next(n for n in workers.values() if n.node_id == actor.node_id)
            for pid in [actor.pid, *(p.process.pid for procs in doomed.all_processes.values() for p in procs)]:
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
            started = time.monotonic()
            wait_for(lambda: w.read_result() == "finished", 60, "the session to finish on the other node")
            lost_after = time.monotonic() - started
            assert any("did not answer" in line for line in br.lines), br.lines
    finally:
        for pid in stopped:
            try:
                os.kill(pid, signal.SIGCONT)
            except OSError:
                pass
        c.shutdown()
    kernels = w.events("kernel")
    assert kernels[-1]["event"] == "restarted" and "did not answer" in kernels[-1]["reason"] and kernels[-1]["node"] != node
    assert lost_after < 45  # Ray alone would take ~60 s here (its health checks' 10 s timeout, 5 misses)
