"""Fan-out: a root session spawns N children that each run one trivial cell (scripted instant model).

Reports, per N: wall time of `primefs run --once` (process start to exit), time to the first child
cell, peak memory (PSS of the runner and all its kernels), CPU per child (the runner's own, its
kernels' with their template's, and git's), the most kernels alive at once, harness overhead per step;
and it checks that every child answered.
With --resident: a runner (`primefs run`) is already running; the time from the goal file to the
root's answer. With --ray: the same fan-outs with the kernels on a local 3-node Ray cluster (a head
and two workers, started here), each size also run on the local host beside it; memory is then that
of everything (this process, the cluster's processes, the runner and all kernels). Ray must keep to
loopback, so run it in a network namespace that has only loopback (docs/scale-out.md):

    python bench/fanout.py            # N = 10 50 200
    python bench/fanout.py 20 50      # chosen sizes
    python bench/fanout.py --resident 20
    python bench/fanout.py --no-sandbox 20     # kernels without the sandbox (the default has one)
    python bench/fanout.py --litellm 20        # the model through litellm, over HTTP to a scripted server
    unshare -n sh -c 'ip link set lo up && exec python bench/fanout.py --ray 50 200'   # as root; else unshare -rn
"""
from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import configure_model, run_cli, scripted_workspace, step_overheads

from primefs.store.session import list_sessions

SCRIPT = """\
rules:
  - match: "^Fan out"
    replies:
      - code: |
          n = int(open('../../../n.txt').read())  # the workspace's, from the session's room
          hs = [rlm(f'child {i}') for i in range(n)]
          res = wait_all(hs)
          print(len(res), res[0])
      - text: "all children answered"
  - match: "^child"
    replies:
      - code: "x = 1 + 1"
      - text: "ok"
"""


def run(n: int, cap: int | None = None, ray: str | None = None, sandbox: bool = True, litellm: bool = False) -> dict:
    if litellm:  # the same script, served over HTTP (tests/openai_server.py) and called through litellm
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        from openai_server import ScriptServer

        from primefs.store.frontmatter import loads_yaml

        with ScriptServer(loads_yaml(SCRIPT, "the script", safe=True)) as server:
            return _run(n, cap, ray, sandbox, {"model": "openai/test-model", "api_base": server.url, "api_key": "k",
                                               "tool_mode": "native"})
    return _run(n, cap, ray, sandbox, None)


def _run(n: int, cap: int | None, ray: str | None, sandbox: bool, model: dict | None) -> dict:
    limits = {"max_concurrent_sessions": cap} if cap else {}
    if n > 1000:  # the root's one cell spawns and waits for all of them: longer than the default 120 s
        limits["cell_timeout_s"] = 4 * 3600
    ws = scripted_workspace(SCRIPT, limits, sandbox=sandbox)
    if model:
        configure_model(ws, model)
    (ws.root / "n.txt").write_text(str(n))
    (ws.goals / "fan.md").write_text("Fan out to children\n")
    stats: dict = {}
    if ray:
        wall, peak, r = run_cli(ws, "run", "--once", "--quiet", "--ray", ray, memory_of=os.getpid())
    else:
        wall, peak, r = run_cli(ws, "run", "--once", "--quiet", stats=stats)
    if r.returncode != 0:
        raise SystemExit(r.stderr)
    sessions = list_sessions(ws.sessions)
    root = next(s for s in sessions if not s.meta.get("parent"))
    assert root.read_result() == "all children answered", root.read_result()
    children = [s for s in sessions if s.meta.get("parent")]
    assert len(children) == n and all(c.read_result() == "ok" for c in children)
    t_spawn = root.events("spawn")[0]["ts"]
    first_cell = min(c.events("cell")[0]["ts"] - c.events("cell")[0]["elapsed_s"] for c in children)
    overheads = [o for s in sessions for o in step_overheads(s.events())]
    nodes = {}
    for c in children:
        nodes[c.meta.get("node") or "local"] = nodes.get(c.meta.get("node") or "local", 0) + 1
    return {"n": n, "host": "ray" if ray else "local", "sandbox": sandbox, "litellm": bool(model),
            "children_per_node": nodes,
            "cap": cap or ws.limits().max_concurrent_sessions, "wall_s": round(wall, 2),
            "first_child_cell_after_spawn_s": round(first_cell - t_spawn, 3),
            "peak_pss_mib": round(peak), **_per_child(stats, n), "overhead_per_step_ms_median": round(statistics.median(overheads) * 1000, 1),
            "overhead_per_step_ms_p90": round(sorted(overheads)[int(len(overheads) * 0.9)] * 1000, 1),
            "workspace": str(ws.root)}


def _per_child(stats: dict, n: int) -> dict:
    """CPU per child: the runner's own, its kernels' (with their template's), and the rest the runner waited
    for (git); and the most kernels alive at once (local runs only: on Ray the kernels are the cluster's)."""
    if not stats:
        return {}
    cpu = stats["cpu"]
    return {"cpu_per_child_ms": {k: round(v / n * 1000, 1) for k, v in cpu.items()},
            "kernels_alive_peak": stats["kernels_peak"]}


def resident(n: int, repeats: int = 3) -> dict:
    ws = scripted_workspace(SCRIPT)
    (ws.root / "n.txt").write_text(str(n))
    proc = subprocess.Popen([sys.executable, "-m", "primefs", "-w", str(ws.root), "run", "--quiet"])
    times = []
    try:
        while not (ws.state / "runner.json").exists():
            time.sleep(0.05)
        time.sleep(2)  # the kernel template has imported what it needs
        for i in range(repeats):  # (no memory sampling here: reading /proc every 50 ms costs CPU)
            started = time.monotonic()
            (ws.goals / f"fan{i}.md").write_text("Fan out to children\n")
            while not any(
                    s.meta.get("goal") == f"goals/fan{i}.md" and s.read_result() == "all children answered"
                    for s in list_sessions(ws.sessions) if not s.meta.get("parent")):
                time.sleep(0.02)
            times.append(time.monotonic() - started)
    finally:
        proc.terminate()
        proc.wait(60)
    return {"n": n, "resident": True, "goal_to_answer_s": [round(t, 2) for t in times],
            "median_s": round(statistics.median(times), 2)}


def local_cluster():
    """A head (no CPUs: no kernel goes there) and two workers with 2 CPUs each, on this machine."""
    if [name for _, name in socket.if_nameindex()] != ["lo"]:
        raise SystemExit("--ray starts a Ray cluster here: run it in a loopback-only network namespace, e.g.\n"
                         "  unshare -n sh -c 'ip link set lo up && exec python bench/fanout.py --ray 50 200'")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, connect=False, head_node_args={"num_cpus": 0, "include_dashboard": False})
    for name in ("w1", "w2"):
        cluster.add_node(num_cpus=2, resources={name: 1000})
    cluster.wait_for_nodes()
    return cluster


def versus(sizes: list[int]) -> None:
    """Each size on the local host, then on the local 3-node Ray cluster."""
    cluster = local_cluster()
    try:
        for n in sizes:
            print(json.dumps(run(n)), flush=True)
            print(json.dumps(run(n, ray=cluster.address)), flush=True)
    finally:
        cluster.shutdown()


if __name__ == "__main__":
    args = sys.argv[1:]
    live = "--resident" in args
    on_ray = "--ray" in args
    sizes = [int(a) for a in args if not a.startswith("--")] or ([20] if live else [50, 200] if on_ray else [10, 50, 200])
    if on_ray:
        versus(sizes)
    for n in [] if on_ray else sizes:
        print(json.dumps(resident(n) if live else run(n, sandbox="--no-sandbox" not in args,
                                                        litellm="--litellm" in args)), flush=True)
