"""cgroups: limits over a kernel's whole process tree (memory, processes) and its CPU time, where the
machine lets the runner make one (v1 as root; a delegated cgroup2 subtree). Made by the runner, joined
by the kernel as it enters its sandbox (sandbox.py)."""
from __future__ import annotations

import errno
import os
import signal
import time

from primefs.kernels.sandbox import write_control


def _cgroup_mounts() -> dict[str, str]:
    """controller -> mount point (cgroup v1), and "v2" -> the cgroup2 mount."""
    out: dict[str, str] = {}
    try:
        lines = open("/proc/self/mountinfo").read().splitlines()
    except OSError:
        return out
    for line in lines:
        fields = line.split(" - ")
        if len(fields) != 2:
            continue
        mount_point, (fstype, _src, opts) = fields[0].split()[4], fields[1].split()[:3]
        if fstype == "cgroup2":
            out.setdefault("v2", mount_point)
        elif fstype == "cgroup":
            for c in ("memory", "pids", "cpuacct"):
                if c in opts.split(","):
                    out.setdefault(c, mount_point)
    return out


def _own_cgroup(controller: str) -> str:
    try:
        for line in open("/proc/self/cgroup").read().splitlines():
            _id, names, path = line.split(":", 2)
            if (controller == "v2" and _id == "0") or controller in names.split(","):
                return path
    except (OSError, ValueError):
        pass
    return "/"


class Cgroup:
    """The cgroup(s) of one kernel tree, made by the runner: memory and processes of all its processes
    together; its CPU time is read by the runner (cpu_s counts the whole tree)."""

    def __init__(self, folders: list[str], version: int):
        self.folders, self.version = folders, version

    @classmethod
    def make(cls, group: str, name: str, memory_mb: int, processes: int) -> "Cgroup | None":
        """A cgroup for one kernel (`group`: its runner's, one per workspace), or None where none is
        writable (then only rlimits apply)."""
        mounts = _cgroup_mounts()
        parent = f"primefs-{os.getuid()}/{group}"
        if all(c in mounts for c in ("memory", "pids", "cpuacct")):  # v1 (a root runner)
            folders = [os.path.join(mounts[c], _own_cgroup(c).lstrip("/"), parent, name)
                       for c in ("memory", "pids", "cpuacct")]
            try:
                for f in folders:
                    os.makedirs(f, exist_ok=True)
                write_control(os.path.join(folders[0], "memory.limit_in_bytes"), str(memory_mb * 1024 * 1024))
                write_control(os.path.join(folders[1], "pids.max"), str(processes))
                return cls(folders, 1)
            except OSError:
                cls(folders, 1).remove()
        if "v2" in mounts:  # a delegated cgroup2 subtree: siblings of the runner's own cgroup
            base = os.path.dirname(os.path.join(mounts["v2"], _own_cgroup("v2").lstrip("/")))
            try:
                enabled = open(os.path.join(base, "cgroup.subtree_control")).read().split()
            except OSError:
                enabled = []
            if {"memory", "pids"} <= set(enabled) and os.access(base, os.W_OK):
                folder = os.path.join(base, f"{parent.replace('/', '-')}-{name}")
                try:
                    os.makedirs(folder, exist_ok=True)
                    write_control(os.path.join(folder, "memory.max"), str(memory_mb * 1024 * 1024))
                    write_control(os.path.join(folder, "memory.swap.max"), "0")
                    write_control(os.path.join(folder, "pids.max"), str(processes))
                    return cls([folder], 2)
                except OSError:
                    cls([folder], 2).remove()
        return None

    def cpu_seconds(self) -> float:
        try:
            if self.version == 1:
                return int(open(os.path.join(self.folders[2], "cpuacct.usage")).read()) / 1e9
            for line in open(os.path.join(self.folders[0], "cpu.stat")):
                if line.startswith("usage_usec"):
                    return int(line.split()[1]) / 1e6
        except (OSError, ValueError, IndexError):
            pass
        return 0.0

    def kill(self) -> None:
        """Every process in it, wherever it went (a double fork, a new session)."""
        if self.version == 2:
            try:
                write_control(os.path.join(self.folders[0], "cgroup.kill"), "1")
                return
            except OSError:
                pass
        for _ in range(5):
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass

    def pids(self) -> list[int]:
        try:
            return [int(x) for x in open(os.path.join(self.folders[0], "cgroup.procs")).read().split()]
        except (OSError, ValueError):
            return []

    def remove(self, wait_s: float = 2.0) -> None:
        """Its folders. A killed process leaves its cgroup only as it exits: an rmdir before that fails (busy),
        and the folder stayed for good: ~57,000 here after some days of tests, until no memory cgroup could be
        made on the machine (the kernel's limit is 65,535). So a busy one is tried again for up to `wait_s`."""
        deadline = time.monotonic() + wait_s
        for f in self.folders:
            while True:
                try:
                    os.rmdir(f)
                except OSError as exc:
                    if exc.errno == errno.EBUSY and time.monotonic() < deadline:
                        time.sleep(0.01)
                        continue
                break


def _group_folders(group: str) -> list[str]:
    mounts = _cgroup_mounts()
    parent = f"primefs-{os.getuid()}/{group}"
    return [os.path.join(mounts[c], _own_cgroup(c).lstrip("/"), parent)
            for c in ("memory", "pids", "cpuacct") if c in mounts]


def remove_stale_cgroups(group: str) -> None:
    """Empty cgroups of kernels of an earlier runner of this group (a killed runner leaves them). Only
    its own group: another workspace's runner may be making a kernel's (still empty) cgroup right now."""
    for base in _group_folders(group):
        for name in os.listdir(base) if os.path.isdir(base) else []:
            try:
                os.rmdir(os.path.join(base, name))
            except OSError:
                pass


def remove_group(group: str) -> None:
    """The folders of this runner's group, once its kernels are gone (each workspace's runner has one: a
    machine that runs many workspaces would keep them all)."""
    for base in _group_folders(group):
        try:
            os.rmdir(base)
        except OSError:  # not empty (a kernel's still there), or none
            pass
