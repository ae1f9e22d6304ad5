"""Kernels on a Ray cluster: a head and two worker nodes on this machine (ray.cluster_utils.Cluster).

Run by `make test` inside a loopback-only network namespace (marker `netns`): Ray then uses 127.0.0.1
throughout. One cluster for the module; the test that removes a worker node runs last.
"""
from __future__ import annotations

import json
import subprocess
import time

import pytest
from click.testing import CliRunner
from conftest import BackgroundRunner, by_name, configure, run_once, use_server, wait_for

from primefs.index.accounting import UsageIndex
from primefs.store.goals import write_goal
from primefs.store.mail import deliver

pytestmark = [pytest.mark.netns, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster():
    pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    # Node deaths are noticed within ~1.5 s here (Ray's default is ~15 s; docs/scale-out.md)
    fast = {"health_check_period_ms": 500, "health_check_failure_threshold": 3, "health_check_initial_delay_ms": 0}
    c = Cluster(initialize_head=True, connect=False,
                head_node_args={"num_cpus": 0, "include_dashboard": False, "_system_config": fast})
    c.workers = {name: c.add_node(num_cpus=4, resources={name: 1000, "worker": 1000}) for name in ("w1", "w2")}
    c.wait_for_nodes()
    yield c
    c.shutdown()


def on_ray(ws, cluster, **changes):
    """Kernels of this workspace on the cluster's workers (every kernel needs `worker: 1`)."""
    return configure(ws, hosts=[{"kind": "ray", "address": cluster.address, "resources": {"worker": 1}}], **changes)


def node_of(cluster, worker: str) -> str:
    return cluster.workers[worker].node_id[:8]


def outputs(s):
    return [c["output"] + (c.get("error") or "") for c in s.events("cell")]


def test_the_ray_host_behind_the_kernel_host_seam(ws, cluster, tmp_path):
    from primefs.kernels.host import KernelSpec
    from primefs.kernels.ray import RayKernelHost

    calls = []

    def handler(sid, op, args):
        calls.append((sid, op, args))
        return f"ok from {sid}"

    host = RayKernelHost(cluster.address, ws.root, handler, resources={"worker": 1})
    try:
        a = host.start(KernelSpec("sa", ws.root, resources={"w1": 1}))
        b = host.start(KernelSpec("sb", ws.root, resources={"w2": 1}))
        assert a.node.startswith(node_of(cluster, "w1")) and b.node.startswith(node_of(cluster, "w2"))
        assert a.describe() == {"pid": a.pid, "node": a.node, "host": "ray"} and a.token != b.token
        # send() is answered by the handler: through the node's socket, its actor and Ray
        out = a.execute("import os\nrows = [1, 2, 3]\nprint(os.getcwd(), send('parent', 'hi'))").output
        assert out == f"{ws.root} ok from sa\n"
        assert calls == [("sa", "send", {"to": "parent", "text": "hi"})]
        assert a.evaluate("sum(rows)") == "6"
        snap = tmp_path / "snap"
        assert a.snapshot(snap, 10**6, "test")["saved"][0]["name"] == "rows"
        assert b.restore(snap)["restored"] == ["rows"] and b.evaluate("rows") == "[1, 2, 3]"
        started = time.monotonic()
        res = b.execute("import time\ntime.sleep(30)", timeout=0.5, on_timeout=lambda: calls.append("timeout"))
        assert res.timed_out and not res.died and "KeyboardInterrupt" in res.error and calls[-1] == "timeout"
        assert time.monotonic() - started < 5 and b.alive()
        a.shutdown()
        assert not a.alive() and b.alive() and host.state()["live_kernels"] == 1
        # a sandboxed session is sandboxed on its node too: no network there
        from primefs.store.settings import check_sandbox

        room = ws.root / "sessions" / "sc" / "work"
        boxed = host.start(KernelSpec("sc", ws.root, room, rooms=[room], resources={"w1": 1},
                                      sandbox=check_sandbox({"memory_mb": 1024}, "test")))
        out = boxed.execute("import socket\ntry:\n    socket.create_connection(('127.0.0.1', 9), timeout=2)\n"
                            "except OSError as e:\n    print(e.strerror)").output
        assert out == "Network is unreachable\n", out
    finally:
        host.close()
    # closed means closed: no thread of the host left to call Ray, which would connect again by itself
    import threading

    import ray

    assert not [t.name for t in threading.enumerate() if t.name.startswith("primefs-ray")]
    assert not ray.is_initialized()


def test_sessions_pinned_to_a_node_and_shown_there(ws, cluster):
    (ws.root / "script.yaml").write_text(
        "rules:\n  - replies:\n      - code: \"import os\\nprint(os.getcwd())\"\n      - text: ok\n")
    ws = on_ray(ws, cluster, model="scripted/script.yaml")
    write_goal(ws, "first", name="one", extra={"resources": {"w1": 1}})
    write_goal(ws, "second", name="two", extra={"resources": {"w2": 1, "num_cpus": 0.5}})
    write_goal(ws, "third", name="nowhere", extra={"resources": {"gpu_a100": 1}})
    run_once(ws)
    s = by_name(ws)
    assert s["one"].meta["node"].startswith(node_of(cluster, "w1"))
    assert s["two"].meta["node"].startswith(node_of(cluster, "w2"))
    assert s["two"].events("kernel")[0]["node"] == s["two"].meta["node"]
    assert outputs(s["one"]) == [f"{s['one'].dir}/work\n"]  # kernels work in their room of the (shared) workspace
    assert s["nowhere"].status == "failed"
    assert "no node of the Ray cluster has gpu_a100=1, worker=1 for one kernel" in s["nowhere"].meta["error"]
    from primefs.cli.main import main

    out = CliRunner().invoke(main, ["-w", str(ws.root), "status", "--json"])
    nodes = {r["name"]: r["node"] for r in json.loads(out.output)}
    assert nodes["one"] == s["one"].meta["node"] and nodes["two"] == s["two"].meta["node"]
    table = CliRunner().invoke(main, ["-w", str(ws.root), "agents", "--once"]).output
    assert "node" in table and node_of(cluster, "w1") in table


def test_fan_out_of_50_over_both_workers_with_exact_accounting(ws, cluster, server):
    # Every child asks for a model call from its kernel (through its node and Ray) and answers with it.
    parent = {"match": "^Fan", "replies": [
        {"code": "hs = [rlm(f'Leaf {i}') for i in range(50)]\nres = wait_all(hs, timeout=240)\n"
                 "print(len(res), sorted(set(res)))"},
        {"text": "all leaves done"}]}
    leaf = {"match": "^Leaf", "replies": [{"code": "done(llm('Q leaf'))"}]}
    qa = {"match": "^Q", "replies": [{"text": "A"}]}
    server.set_script({"rules": [parent, leaf, qa]})
    ws = on_ray(use_server(ws, server, limits={"max_concurrent_sessions": 8}), cluster)
    write_goal(ws, "Fan out to 50", name="fan")
    run_once(ws)
    s = by_name(ws)
    assert outputs(s["fan"])[0] == "50 ['A']\n" and s["fan"].read_result() == "all leaves done"
    leaves = [x for x in s.values() if x.meta.get("parent") == s["fan"].id]
    assert len(leaves) == 50 and all(x.status == "done" for x in leaves)
    per_node = {}
    for x in leaves:
        per_node[x.meta["node"][:8]] = per_node.get(x.meta["node"][:8], 0) + 1
    assert set(per_node) == {node_of(cluster, "w1"), node_of(cluster, "w2")}
    assert min(per_node.values()) >= 15, per_node  # spread, not piled on one worker
    index = UsageIndex(ws.sessions)
    tree = index.tree(s["fan"].id)
    assert tree["calls"] == len(server.usages) == 2 + 50 * 2  # parent turn, and each leaf's turn + llm()
    assert tree["input_tokens"] == sum(u["prompt_tokens"] for u in server.usages)
    assert tree["output_tokens"] == sum(u["completion_tokens"] for u in server.usages)
    assert all(index.own[x.id]["calls"] == 2 for x in leaves)


def test_mail_and_rlm_across_nodes(ws, cluster):
    (ws.root / "script.yaml").write_text("""\
rules:
  - match: "^Coordinate"
    replies:
      - code: |
          h = rlm('Echo task', name='echo', resources={'w2': 1})
          m = recv(timeout=60)
          send(h.id, 'ping ' + m.text)
          print(h.wait(timeout=60))
      - text: coordinated
  - match: "^Echo"
    replies:
      - code: |
          send('parent', 'hello from ' + SESSION_ID)
          m = recv(timeout=60)
          done('echo: ' + m.text)
""")
    ws = on_ray(ws, cluster, model="scripted/script.yaml")
    write_goal(ws, "Coordinate a child on the other node", name="boss", extra={"resources": {"w1": 1}})
    run_once(ws)
    s = by_name(ws)
    assert s["boss"].meta["node"].startswith(node_of(cluster, "w1"))
    assert s["echo"].meta["node"].startswith(node_of(cluster, "w2"))
    assert s["echo"].meta["resources"] == {"w2": 1}
    assert outputs(s["boss"]) == [f"echo: ping hello from {s['echo'].id}\n"]
    assert s["boss"].read_result() == "coordinated"


def test_a_worker_removed_mid_run_its_session_continues_on_the_other(ws, cluster):
    (ws.root / "script.yaml").write_text("""\
rules:
  - match: "^Remember"
    replies:
      - code: "x = 41\\nimport math"
      - text: stored
      - code: "import time\\nopen('started.txt', 'w').write('1')\\ntime.sleep(120)"
      - code: "print(x + 1, math.floor(2.5))"
      - text: finished
  - match: "^Bystander"
    replies:
      - code: "y = 1"
      - text: still here
""")
    ws = on_ray(ws, cluster, model="scripted/script.yaml")
    write_goal(ws, "Remember x", name="mem")
    with BackgroundRunner(ws):
        mem = wait_for(lambda: by_name(ws).get("mem"), what="the session")
        wait_for(lambda: mem.reload().get("status") == "idle", what="the first turn")
        first = mem.reload()["node"]
        deliver(mem.mail, sender="user", to=mem.id, kind="user", text="Continue")
        wait_for(lambda: (mem.dir / "work" / "started.txt").exists(), what="the long cell")
        doomed = next(w for w in cluster.workers.values() if first.startswith(w.node_id[:8]))
        cluster.remove_node(doomed, allow_graceful=False)  # a crash: no goodbye to the head
        wait_for(lambda: mem.reload().get("status") == "idle" and mem.read_result() == "finished", timeout=90,
                 what="the session to finish on the other node")
        write_goal(ws, "Bystander task", name="by")  # new work goes to the node that is left
        wait_for(lambda: (by_name(ws).get("by") and by_name(ws)["by"].read_result() == "still here"),
                 what="a new session")
    mem = by_name(ws)["mem"]
    kernels = mem.events("kernel")
    assert [k["event"] for k in kernels] == ["started", "restarted"]
    assert kernels[0]["node"] == first and kernels[1]["node"] != first
    assert "was lost" in kernels[1]["reason"] and first in kernels[1]["reason"]
    assert mem.meta["node"] == kernels[1]["node"]
    assert mem.events("restored")[0]["restored"] == ["x"] and mem.events("restored")[0]["modules"] == ["math"]
    cells = mem.events("cell")
    assert cells[1]["restarted"] and "restored from the snapshot" in cells[1]["shown"]
    assert "x, math (module)" in cells[1]["shown"]
    assert cells[2]["output"] == "42 2\n"
    assert by_name(ws)["by"].meta["node"] == kernels[1]["node"]
    # nothing in the workspace is lost: every session file committed, the history whole
    assert subprocess.run(["git", "-C", str(ws.root), "status", "--porcelain", "sessions"],
                          capture_output=True, text=True).stdout == ""
    assert [e["type"] for e in mem.events() if e["type"] in ("turn_start", "turn_end")] == \
           ["turn_start", "turn_end"] * 2
