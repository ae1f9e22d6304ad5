"""The kernel host seam: the only way the runner reaches kernels.

A host starts kernels, one per session (a session keeps its kernel for life and never shares it),
gives each kernel a token that is never reused, and serves the kernels' requests to the runner: it
checks who is calling and passes on only (session id, op, args) of a caller it verified. A handle
runs cells, interrupts, snapshots and restores the user namespace, shuts the kernel down and says
whether it lives. Local processes (localkernels.py) or the nodes of a Ray cluster (raykernels.py).
"""
from __future__ import annotations

import ast
import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from primefs.kernels.client import CellResult

# (session id, op, args) -> a JSON-able result; raising becomes an exception in the calling cell
Handler = Callable[[str, str, dict], object]
API = "__import__('primefs.kernels.inside.snapshot', fromlist=['api'])"


@dataclass
class KernelSpec:
    session_id: str
    workspace: Path  # what the kernel reads (sandboxed: read-only)
    cwd: Path | None = None  # its working folder: the session's room (sessions/<id>/work); default: workspace
    rooms: list = field(default_factory=list)  # what a sandboxed kernel may write: its room, its kernel/ folder
    setup: dict = field(default_factory=dict)  # kernel_api.setup(): context_paths, context_data, skill_dirs
    resources: dict = field(default_factory=dict)  # what a placement needs (num_cpus, memory, ...)
    sandbox: dict | None = None  # settings.SANDBOX keys; None: no sandbox
    hidden: list = field(default_factory=list)  # files a sandboxed kernel must not read (api_key_file keys)
    tree: str = ""  # the root of its session's tree: the kernels of a tree share what the runner reads at once

    def __post_init__(self):
        self.cwd = Path(self.cwd or self.workspace)

    @property
    def owner(self) -> str:
        return self.tree or self.session_id

    def to_dict(self) -> dict:
        """Plain data, for another process (a Ray node)."""
        return {"session_id": self.session_id, "workspace": str(self.workspace), "cwd": str(self.cwd),
                "rooms": [str(r) for r in self.rooms], "setup": dict(self.setup), "resources": dict(self.resources),
                "sandbox": self.sandbox, "hidden": [str(h) for h in self.hidden], "tree": self.tree}

    @classmethod
    def from_dict(cls, d: dict) -> "KernelSpec":
        return cls(d["session_id"], Path(d["workspace"]), Path(d["cwd"]), [Path(r) for r in d["rooms"]],
                   d["setup"], d["resources"], d["sandbox"], d.get("hidden") or [], d.get("tree") or "")


class KernelHandle(ABC):
    token: str
    pid: int
    node: str = "local"
    lost: str | None = None  # why the host knows the kernel is gone (e.g. its node was lost), if it does

    @abstractmethod
    def execute(self, code: str, timeout: float | None = None, on_timeout=None, stop=None) -> CellResult: ...

    @abstractmethod
    def evaluate(self, expr: str, timeout: float = 60.0) -> str: ...

    @abstractmethod
    def interrupt(self) -> None: ...

    @abstractmethod
    def alive(self) -> bool: ...

    @abstractmethod
    def shutdown(self) -> None: ...

    def connection(self) -> dict | None:
        """Its Jupyter connection info, for a client on this machine (`primefs kernel`); None if unreachable."""
        return None

    def snapshot(self, folder: Path, max_bytes: int, reason: str, timeout: float = 120.0) -> dict:
        """Save the user namespace to `folder` (see kernel_snapshot.snapshot); returns its manifest."""
        return self._call(f"{API}.snapshot({str(folder)!r}, {int(max_bytes)}, {reason!r})", timeout)

    def restore(self, folder: Path, timeout: float = 120.0) -> dict:
        """Load `folder`'s snapshot into the user namespace; returns what came back and what did not."""
        return self._call(f"{API}.restore({str(folder)!r})", timeout)

    def _call(self, expr: str, timeout: float) -> dict:
        return json.loads(ast.literal_eval(self.evaluate(expr, timeout)))

    def describe(self) -> dict:
        return {"pid": self.pid, "node": self.node}


class KernelHost(ABC):
    name = "host"

    @abstractmethod
    def start(self, spec: KernelSpec) -> KernelHandle:
        """A new kernel for `spec.session_id`, ready to run cells, with a new token."""

    @abstractmethod
    def close(self) -> None:
        """Shut every kernel down and stop serving requests."""

    def kernel_pids(self) -> list[int]:
        """Pids of the kernels on this machine (for memory figures)."""
        return []

    def state(self) -> dict:
        """What `primefs runner` shows of the host (written to .primefs/runner.json)."""
        pids = self.kernel_pids()
        return {"live_kernels": len(pids), "kernel_pids": pids}


def make_host(ws, ray: str | None, handle, log) -> KernelHost:
    """Local kernels, or kernels on a Ray cluster (`run --ray ADDRESS`, or `hosts:` of kind ray in
    primefs.yaml). `handle(session id, op, args)` answers the kernels' verified requests."""
    given = ws.ray_host()
    if ray or given:
        from primefs.kernels.ray import RayKernelHost

        address = ray or given["address"]
        log(f"kernels on the Ray cluster at {address}")
        return RayKernelHost(address, ws.root, handle, log, resources=(given or {}).get("resources"))
    from primefs.kernels.local import LocalKernelHost

    return LocalKernelHost(ws.runtime, ws.root, handle, log)
