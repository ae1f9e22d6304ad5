"""Kernel start: the fork server (what primefs uses), unsandboxed and in the sandbox (the default),
beside a fresh process per kernel (jupyter_client's KernelManager, what primefs did before).

For each kernel: wall time from the start request to ready (a kernel_info reply and a live iopub),
and CPU seconds spent on it: the CPU of the kernel's processes at ready (in a sandbox: its keeper and
the kernel), plus the CPU that the template process and this (runner) process spent meanwhile.

    python bench/kernels.py          # 40 forked kernels each way, 8 fresh processes
    python bench/kernels.py 100 10

Also: time to snapshot and restore a session's namespace of three sizes.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from primefs.kernels.forkserver import descendants
from primefs.kernels.host import KernelSpec
from primefs.kernels.local import LocalKernelHost
from primefs.store.settings import check_sandbox

TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def self_cpu() -> float:
    t = os.times()
    return t.user + t.system


def summary(walls: list[float], cpus: list[float]) -> dict:
    w = sorted(walls)
    return {"kernels": len(w), "ready_s_p50": round(statistics.median(w), 4), "ready_s_p90": round(w[int(len(w) * 0.9)], 4),
            "cpu_s_per_kernel": round(statistics.mean(cpus), 4)}


def spec(root: Path, sid: str, sandboxed: bool) -> KernelSpec:
    room = root / "sessions" / sid / "work"
    return KernelSpec(sid, root, room, rooms=[room, room.parent / "kernel"],
                      sandbox=check_sandbox(None, "bench") if sandboxed else None)


def forked(n: int, sandboxed: bool = False) -> dict:
    root = Path(tempfile.mkdtemp(prefix="primefs-bench-kernels-"))
    root.chmod(0o755)  # a root runner's sandboxed kernels are uid 65534: they must read the workspace
    host = LocalKernelHost(root / "rt", root, lambda *a: None)
    host._ready.wait(60)
    host.start(spec(root, "warm-up", sandboxed)).shutdown()
    server = host._server.pid
    walls, cpus, kernels = [], [], []
    for i in range(n):
        c_server, c_self = cpu_s(server), self_cpu()
        started = time.monotonic()
        k = host.start(spec(root, f"s{i}", sandboxed))
        walls.append(time.monotonic() - started)
        mine = sum(cpu_s(p) for p in [k.pid, *descendants(k.pid)])
        cpus.append(mine + (cpu_s(server) - c_server) + (self_cpu() - c_self))
        kernels.append(k)
    assert all(k.execute("print(1 + 1)", timeout=30).output == "2\n" for k in kernels)
    host.close()
    return summary(walls, cpus)


def fresh(n: int) -> dict:
    from jupyter_client import KernelManager

    root = Path(tempfile.mkdtemp(prefix="primefs-bench-kernels-"))
    walls, cpus = [], []
    for i in range(n):
        c_self = self_cpu()
        started = time.monotonic()
        km = KernelManager(transport="ipc", ip=str(root / f"k{i}"), connection_file=str(root / f"k{i}.json"))
        km.kernel_cmd = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}",
                         "--HistoryManager.enabled=False"]
        km.start_kernel()
        kc = km.blocking_client()
        kc.start_channels(hb=False)
        kc.wait_for_ready(60)
        walls.append(time.monotonic() - started)
        cpus.append(cpu_s(km.provisioner.process.pid) + (self_cpu() - c_self))
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    return summary(walls, cpus)


def snapshots() -> dict:
    """Time to save and to restore a namespace: small variables, then 10 MB and 100 MB of data."""
    root = Path(tempfile.mkdtemp(prefix="primefs-bench-kernels-"))
    host = LocalKernelHost(root / "rt", root, lambda *a: None)
    out = {}
    cases = {"10 small variables": "\n".join(f"v{i} = list(range({i * 100}))" for i in range(10)),
             "10 MB": "blob = 'x' * 10_000_000", "100 MB": "big = bytes(100_000_000)"}
    k = host.start(KernelSpec("s", root))
    for label, code in cases.items():
        k.execute(code, timeout=60)
        started = time.monotonic()
        m = k.snapshot(root / "snap", 512 * 1024 * 1024, "bench")
        saved = time.monotonic() - started
        k2 = host.start(KernelSpec("s", root))
        started = time.monotonic()
        k2.restore(root / "snap")
        restored = time.monotonic() - started
        k2.shutdown()
        out[label] = {"bytes": m["bytes"], "snapshot_s": round(saved, 4), "restore_s": round(restored, 4)}
    host.close()
    return out


if __name__ == "__main__":
    n_fork = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    n_fresh = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    print(json.dumps({"fork_server": forked(n_fork)}))
    print(json.dumps({"fork_server_sandboxed": forked(n_fork, sandboxed=True)}))
    print(json.dumps({"fresh_process": fresh(n_fresh)}))
    print(json.dumps({"snapshots": snapshots()}))
