"""Which node gets a new kernel: the least-loaded node that fits what the kernel needs.

Pure bookkeeping, no Ray: the Ray kernel host (raykernels.py) keeps one `Node` per cluster node with
its total resources (as Ray reports them) and what the kernels placed there hold. A kernel's needs
are `hosts:` resources of primefs.yaml with the session's own `resources:` over them, in the user's
words (num_cpus, num_gpus, memory, custom names); `ray_names` turns them into Ray's (CPU, GPU, ...).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from primefs.store.settings import check_resources

RAY_NAMES = {"num_cpus": "CPU", "num_gpus": "GPU", "memory": "memory"}
EPS = 1e-9


def ray_names(resources: dict) -> dict:
    """{num_cpus: 1, memory: 2**30, w1: 1} -> {CPU: 1, memory: 2**30, w1: 1} (zero amounts left out)."""
    return {RAY_NAMES.get(k, k): float(v) for k, v in resources.items() if float(v) > 0}


def kernel_needs(defaults: dict, session: dict | None) -> dict:
    """What one kernel of a session needs: the host's defaults, each key overridden by the session's
    (checked again: a session.yaml edited by hand may say `memory: 4G`)."""
    merged = {**check_resources(defaults or {}, "hosts: resources"), **check_resources(session or {}, "resources")}
    return ray_names(merged)


def describe(need: dict) -> str:
    if not need:
        return "nothing"
    return ", ".join(f"{k}={_amount(k, v)}" for k, v in sorted(need.items()))


def _amount(key: str, value: float) -> str:
    if key == "memory":
        return f"{value / 2**30:.3g}GiB"
    return f"{value:g}"


@dataclass
class Node:
    id: str
    name: str
    total: dict  # Ray's resource names -> amounts
    used: dict = field(default_factory=dict)  # held by the kernels placed here
    kernels: int = 0

    def fits(self, need: dict, *, empty: bool = False) -> bool:
        """The kernel fits next to what runs here now (or, with `empty`, on the node alone). A node without
        CPUs gets no kernel (`ray start --num-cpus=0` is how Ray keeps work off a head node)."""
        return self.total.get("CPU", 0.0) > 0 and all((0.0 if empty else self.used.get(k, 0.0)) + v <= self.total.get(k, 0.0) + EPS
                   for k, v in need.items())

    def load(self, need: dict) -> float:
        """The largest share of a resource this node would have in use with the kernel added (CPU and
        memory always count, so kernels that ask for nothing still spread by what others hold)."""
        keys = set(need) | {"CPU", "memory"}
        shares = [(self.used.get(k, 0.0) + need.get(k, 0.0)) / self.total[k] for k in keys if self.total.get(k)]
        return max(shares, default=0.0)

    def take(self, need: dict) -> None:
        for k, v in need.items():
            self.used[k] = self.used.get(k, 0.0) + v
        self.kernels += 1

    def give_back(self, need: dict) -> None:
        for k, v in need.items():
            self.used[k] = max(0.0, self.used.get(k, 0.0) - v)
        self.kernels = max(0, self.kernels - 1)


def choose(nodes: list[Node], need: dict) -> Node | None:
    """The least-loaded node that fits (ties: fewer kernels, then the name), or None."""
    fitting = [n for n in nodes if n.fits(need)]
    if not fitting:
        return None
    return min(fitting, key=lambda n: (round(n.load(need), 6), n.kernels, n.name))


def never_fits(nodes: list[Node], need: dict) -> str | None:
    """Why no node could ever hold the kernel (even empty), or None if one could."""
    if any(n.fits(need, empty=True) for n in nodes):
        return None
    have = "; ".join(f"{n.name}: {describe(n.total)}" for n in nodes) or "no usable node"
    return f"no node of the Ray cluster has {describe(need)} for one kernel and CPUs ({have})"
