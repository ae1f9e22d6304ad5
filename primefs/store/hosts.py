"""Where kernels run and what one kernel needs: `hosts:` in primefs.yaml, and `resources:` (of a host, a
goal, a session or an `rlm()` call), checked as settings.py checks the rest."""
from __future__ import annotations

import re

from primefs.errors import PrimefsError
from primefs.store.checks import check_text, number, short

HOST_KINDS = ("local", "ray")
HOST_KEYS = ("kind", "address", "resources")
RESOURCE_KEYS = ("num_cpus", "num_gpus", "memory")  # and custom resources: any other name
RESOURCE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:-]{0,63}$")
MEMORY = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)(i?B?)\s*$", re.IGNORECASE)


def check_hosts(value, where: str) -> list[dict]:
    """`hosts:` in primefs.yaml: a list of {kind: local|ray, address, resources}; at most one of kind ray.
    Returns the entries with checked values (resources normalized, see check_resources)."""
    entries = [value] if isinstance(value, dict) else value
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise PrimefsError(f"{where}: `hosts:` must be a list of mappings like "
                           "{kind: ray, address: auto, resources: {num_cpus: 1}}")
    out = []
    for i, entry in enumerate(entries):
        at = f"{where}: hosts[{i}]"
        unknown = [k for k in entry if k not in HOST_KEYS]
        if unknown:
            raise PrimefsError(f"{at}: unknown key {unknown[0]!r} (known: {', '.join(HOST_KEYS)}; what each kernel "
                               "needs goes under `resources:`)")
        if entry.get("kind") not in HOST_KINDS:
            raise PrimefsError(f"{at}.kind must be one of {', '.join(HOST_KINDS)}, not {short(entry.get('kind'))}")
        checked = {"kind": entry["kind"], "resources": check_resources(entry.get("resources") or {}, f"{at}.resources")}
        if entry["kind"] == "ray":
            checked["address"] = check_text(entry.get("address") or "auto", f"{at}.address", 512)
        elif entry.get("address") is not None:
            raise PrimefsError(f"{at}: a host of kind local takes no address")
        out.append(checked)
    if sum(e["kind"] == "ray" for e in out) > 1:
        raise PrimefsError(f"{where}: `hosts:` names more than one host of kind ray (one cluster per runner)")
    return out


def check_resources(value, where: str) -> dict:
    """What one kernel needs: num_cpus, num_gpus (numbers >= 0), memory (bytes, or text such as 512M, 4GiB)
    and custom resources of the cluster (name: amount >= 0). Returns {name: number} with memory in bytes."""
    if not isinstance(value, dict):
        raise PrimefsError(f"{where} must be a mapping of num_cpus, num_gpus, memory or custom resource names "
                           f"to amounts, not {short(value)}")
    out = {}
    for key, amount in value.items():
        if not isinstance(key, str) or not RESOURCE_NAME.fullmatch(key):
            raise PrimefsError(f"{where}: {short(key)} is not a resource name (num_cpus, num_gpus, memory, or a "
                               "custom resource: letters, digits, _ . : -)")
        if key in ("CPU", "GPU"):
            raise PrimefsError(f"{where}: write num_{key.lower()}s, not {key}")
        if key == "memory" and isinstance(amount, str):
            out[key] = memory_bytes(amount, f"{where}.memory")
            continue
        out[key] = number(amount, f"{where}.{key}", "num", 0, 1e15)
    return out


def memory_bytes(text: str, where: str) -> int:
    """'512M', '4G', '1.5GiB', '2048' -> bytes (K, M, G, T are powers of 1024)."""
    m = MEMORY.fullmatch(text)
    if not m:
        raise PrimefsError(f"{where} must be a number of bytes or text such as 512M, 4G or 1.5GiB, not {text!r}")
    scale = 1024 ** "_KMGT".index(m.group(2).upper() or "_")
    return int(float(m.group(1)) * scale)
