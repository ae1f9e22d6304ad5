"""Shared bench helpers: a fresh workspace with a scripted instant model, and process-tree memory."""
from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from primefs.store.frontmatter import dump_yaml, load_yaml  # noqa: E402
from primefs.store.workspace import Workspace, init_workspace  # noqa: E402


def scripted_workspace(script: str, limits: dict | None = None, sandbox: bool = True) -> Workspace:
    """A new workspace on the scripted model; kernels sandboxed (the default) unless `sandbox` is False."""
    from primefs.store import trust

    root = Path(tempfile.mkdtemp(prefix="primefs-bench-")) / "ws"
    init_workspace(root)
    (root / "script.yaml").write_text(script)
    cfg = load_yaml(root / "primefs.yaml")
    cfg["model"] = "scripted/script.yaml"
    cfg["limits"].update(limits or {})
    if not sandbox:
        cfg["sandbox"] = "off"
    (root / "primefs.yaml").write_text(dump_yaml(cfg))
    ws = Workspace(root)
    trust.trust(ws, ["primefs.yaml"])
    return ws


def configure_model(ws: Workspace, alias: dict) -> None:
    """Point the workspace's default model at `alias` (e.g. litellm -> a local HTTP server)."""
    cfg = load_yaml(ws.root / "primefs.yaml")
    cfg["model"] = "bench"
    cfg["models"] = {"bench": alias}
    (ws.root / "primefs.yaml").write_text(dump_yaml(cfg))


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(d))
            except (OSError, IndexError, ValueError):
                pass
    return children


def _tree_pids(root_pid: int, children: dict[int, list[int]] | None = None) -> list[int]:
    children = _children_map() if children is None else children
    out, stack = [], [root_pid]
    while stack:
        p = stack.pop()
        out.append(p)
        stack.extend(children.get(p, []))
    return out


def kernels_alive(root_pid: int, children: dict[int, list[int]] | None = None) -> int:
    """Kernels under a runner: the children of its kernel template (each a kernel, or its sandbox's keeper)."""
    children = _children_map() if children is None else children
    count = 0
    for pid in children.get(root_pid, []):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"primefs.kernels.forkserver" in f.read():
                    count += len(children.get(pid, []))
        except OSError:
            pass
    return count


def cpu_seconds(pid: int) -> float:
    """The process's own CPU time (user + system), not its children's."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_pss_mib(root_pid: int, children: dict[int, list[int]] | None = None) -> float:
    """Proportional set size of a process and all its descendants (shared pages counted once)."""
    total = 0
    for pid in _tree_pids(root_pid, children):
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1])
                        break
        except OSError:
            pass
    return total / 1024


class PeakMemory:
    """Samples a process tree every 50 ms while a `with` block runs: its peak PSS, the most kernels alive
    at once (if it is a runner), and the process's own CPU time at the last sample."""

    def __init__(self, pid: int):
        self.pid, self.peak, self.kernels_peak, self.own_cpu_s = pid, 0.0, 0, 0.0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._loop, daemon=True)

    def _loop(self):
        while not self._stop.is_set():
            children = _children_map()
            self.peak = max(self.peak, tree_pss_mib(self.pid, children))
            self.kernels_peak = max(self.kernels_peak, kernels_alive(self.pid, children))
            try:
                self.own_cpu_s = cpu_seconds(self.pid)
            except (OSError, IndexError, ValueError):  # it ended
                pass
            self._stop.wait(0.05)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()


def run_cli(ws: Workspace, *args: str, memory_of: int | None = None,
            stats: dict | None = None) -> tuple[float, float, subprocess.CompletedProcess]:
    """Run `primefs ARGS` as a fresh process; returns (wall seconds, peak PSS MiB, result). The memory is
    that of the process and its descendants, or of `memory_of` and its descendants when given. `stats`, if
    given, gets `own_cpu_s` (the primefs process's own CPU, ~50 ms before its end), `tree_cpu_s` (its and
    every descendant's it reaped: kernels, the template, git) and `kernels_peak` (kernels alive at once)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "primefs", "-w", str(ws.root), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with PeakMemory(memory_of or proc.pid) as mem:
        out, err = proc.communicate()
    wall = time.monotonic() - started
    if stats is not None:
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        stats.update(own_cpu_s=round(mem.own_cpu_s, 2), kernels_peak=mem.kernels_peak,
                     tree_cpu_s=round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 2))
    return wall, mem.peak, subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def step_overheads(events: list[dict]) -> list[float]:
    """Harness time between a model reply and the next model request, minus the cell's own run time and minus
    the wait of a first cell for the session's kernel (started beside the first model call: the kernel's
    start, measured apart by bench/kernels.py)."""
    out, last_end, cell_time, waited = [], None, 0.0, 0.0
    for e in events:
        if e["type"] == "model_call" and e.get("purpose") == "turn":
            start = e["ts"] - e["latency_s"]
            if last_end is not None:
                out.append(start - last_end - cell_time - waited)
            last_end, cell_time, waited = e["ts"], 0.0, 0.0
        elif e["type"] == "cell":
            cell_time += e.get("elapsed_s") or 0.0
        elif e["type"] == "kernel" and last_end is not None:
            waited = max(0.0, e["ts"] - last_end)
        elif e["type"] == "turn_end":
            last_end = None
    return out
