"""Reaching a Ray cluster (ray.py's kernel host is its driver): Ray imported only when asked for, the
address checked before Ray retries it for minutes, and one connection, made on purpose.
"""
from __future__ import annotations

import logging
import os

from primefs.errors import PrimefsError

CONNECT_TIMEOUT_S = 5.0


def import_ray():
    # A call after ray.shutdown() would connect again on its own, to whichever cluster started last, and
    # stay connected: the runner connects once, on purpose (read when ray is first imported).
    os.environ.setdefault("RAY_ENABLE_AUTO_CONNECT", "0")
    try:
        import ray
    except ImportError:
        raise PrimefsError("kernels on Ray need the ray package: pip install 'primefs[ray]'") from None
    return ray


def reachable(address: str) -> None:
    """A HOST:PORT address answers (resolves, and takes a TCP connection) within seconds, or a clear
    error. `auto` and `local` are Ray's own: not checked here."""
    import socket

    if address in ("auto", "local") or address.startswith("ray://"):
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise PrimefsError(f"the Ray address {address!r} is not HOST:PORT (or auto, local)")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        why = "it does not resolve" if isinstance(exc, socket.gaierror) else (exc.strerror or str(exc))
        raise PrimefsError(f"cannot reach the Ray cluster at {address}: {why} (is `ray start --head` running "
                           "there, and the address the one it printed?)") from None


def connect(ray, address: str) -> bool:
    """Connect this process to the cluster at `address` as its driver, unless it is connected already (a
    test or a script may have connected first). Returns whether it connected: then it owns the connection
    (and shuts it down when done)."""
    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    reachable(address)  # ray.init would retry an unreachable address for minutes
    kwargs = {"include_dashboard": False} if address == "local" else {"address": address}
    try:
        ray.init(namespace="primefs", log_to_driver=False, logging_level=logging.WARNING, **kwargs)
    except Exception as exc:  # noqa: BLE001 - a wrong address, no cluster there
        raise PrimefsError(f"cannot connect to the Ray cluster at {address!r}: {exc}") from None
    return True
