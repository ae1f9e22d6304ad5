"""Shared bench helpers: a fresh workspace with a scripted instant model, and process-tree memory."""
from __future__ import annotations

import os
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


def children_map() -> dict[int, list[int]]:
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
    children = children_map() if children is None else children
    out, stack = [], [root_pid]
    while stack:
        p = stack.pop()
        out.append(p)
        stack.extend(children.get(p, []))
    return out


def templates(root_pid: int, children: dict[int, list[int]]) -> list[int]:
    """The kernel template(s) a runner forks its kernels from (its children running primefs.kernels.forkserver)."""
    out = []
    for pid in children.get(root_pid, []):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"primefs.kernels.forkserver" in f.read():
                    out.append(pid)
        except OSError:
            pass
    return out


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(the process's own CPU time, that of its children it has waited for), user + system each."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick, (int(fields[13]) + int(fields[14])) / tick


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


# PSS is read from the kernel's page tables (smaps_rollup): every 50 ms it took ~20% of a core in a fan-out (~10% of
# this 2-core machine, 3.2 of 18.8 s), slowing what was measured; memory moves slower than a kernel's life
PSS_EVERY_S = 0.25


class PeakMemory:
    """Samples a process tree while a `with` block runs: every 50 ms, if it is a runner,
    the most kernels alive at once and the CPU time of the runner itself, of what it waited for (git), and
    of its kernels with their template (each process's own, as last seen: a kernel's last ~50 ms are not
    counted; its keeper may be killed before it reaps the kernel, so a template's children's time is not
    to be trusted); every PSS_EVERY_S, the peak PSS of the tree."""

    def __init__(self, pid: int):
        self.pid, self.peak, self.kernels_peak = pid, 0.0, 0
        self.cpu = {"runner": 0.0, "runner_children": 0.0, "kernels": 0.0}
        self._kernels: dict[int, float] = {}  # pid -> its own CPU seconds when last seen
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._loop, daemon=True)

    def _loop(self):
        pss_at = 0.0
        while not self._stop.is_set():
            children = children_map()
            if time.monotonic() - pss_at >= PSS_EVERY_S:
                pss_at = time.monotonic()
                self.peak = max(self.peak, tree_pss_mib(self.pid, children))
            try:
                forks = templates(self.pid, children)
                self.kernels_peak = max(self.kernels_peak, sum(len(children.get(t, [])) for t in forks))
                for t in forks:
                    for pid in _tree_pids(t, children):
                        try:
                            self._kernels[pid] = cpu_seconds(pid)[0]
                        except (OSError, IndexError, ValueError):  # ended meanwhile
                            pass
                own, waited = cpu_seconds(self.pid)
                self.cpu = {"runner": own, "runner_children": waited, "kernels": sum(self._kernels.values())}
            except (OSError, IndexError, ValueError):  # it is ending
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
    given, gets PeakMemory's `cpu` (seconds, ~50 ms before the end) and `kernels_peak`."""
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "primefs", "-w", str(ws.root), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with PeakMemory(memory_of or proc.pid) as mem:
        out, err = proc.communicate()
    wall = time.monotonic() - started
    if stats is not None:
        stats.update(cpu=mem.cpu, kernels_peak=mem.kernels_peak)
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
