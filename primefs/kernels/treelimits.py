"""Limits over a sandboxed kernel's whole tree that no rlimit can hold (sandbox.cpu_s, sandbox.disk_mb),
kept by the runner: the watch local.py starts with its first sandboxed kernel.
"""
from __future__ import annotations

import time

from primefs.store.fsutil import MAX_DEPTH, TooDeep, walk_tree

WATCH_S = 1.0


def watch(kernels, closed) -> None:
    """CPU seconds of a sandboxed kernel's whole tree (its cgroup) and what it wrote (its room, its
    kernel/ folder, its socket folder), against `cpu_s` and `disk_mb`: past either, the kernel and all
    it started are ended. Rooms are measured every second while a cell runs, else every 10 s (a
    thread may go on writing after its cell). `kernels()`: the live sandboxed kernels now; runs until
    `closed()`."""
    rounds = 0
    while not closed():
        rounds += 1
        for k in kernels():
            try:  # one kernel's room must not end the watch of all (as a recursion did, at 1,000 folders deep)
                check(k, rounds)
            except Exception:  # noqa: BLE001 - a room changing under the look: looked at again next round
                pass
        time.sleep(WATCH_S)


def check(k, rounds: int) -> None:
    box = k.spec.sandbox
    if k.cgroup is not None and k.cgroup.cpu_seconds() > float(box["cpu_s"]):
        k.kill(f"its processes used more than sandbox.cpu_s ({box['cpu_s']} CPU seconds)")
    elif k.client.busy or rounds % 10 == 0:
        try:
            over = room_bytes([*k.spec.rooms, k.base]) > int(box["disk_mb"]) * 1024 * 1024
        except TooDeep:
            k.kill(f"it nested folders deeper than {MAX_DEPTH} in sessions/{k.session_id}/work/ or kernel/, "
                   "where sandbox.disk_mb cannot be kept")
            return
        if over:
            k.kill(f"what it wrote (sessions/{k.session_id}/work/ and kernel/) grew past sandbox.disk_mb "
                   f"({box['disk_mb']} MB)")


def room_bytes(rooms: list) -> int:
    """Bytes of the files in these folders (links not followed). Folders nested past fsutil.MAX_DEPTH
    raise TooDeep: what is down there would go uncounted."""
    total = 0
    for room in rooms:
        for _rel, kind, st, _value in walk_tree(room, deep="raise"):
            if kind != "dir":
                total += st.st_blocks * 512
    return total
