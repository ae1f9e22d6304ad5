"""Leaks over time: one runner under the load of long use (mail to a few sessions every 1-3 s, a
heartbeat every 10 s), its open files by kind and its memory sampled as it goes. For work that runs for
months these must stay flat after the warm-up. Memory is split by where it lives (the brk heap, other
anonymous maps such as malloc arenas and Python's, files), and by allocator, as the runner itself sees it
(bench/allocators.py: what Python's allocator and malloc hold, and what of that is live: RSS that grows while
the live memory stays flat is kept by the allocators, not leaked); `kernels_mib` is what the sessions'
kernels take (PSS of the kernel template and its kernels); `messages` is how many were sent.

    python bench/leaks.py              # 10 minutes, a sample a minute
    python bench/leaks.py 3 20         # 3 minutes, a sample every 20 s
    python bench/leaks.py 60 300 0.4   # an hour, messages 5 times as often (every 0.2-0.6 s): hours of turns

Prints one line per sample (seconds, fds: total, epoll, sockets, pipes; memory in MiB; messages so far), then
JSON with the growth from the first sample after the warm-up to the last, and per minute (over the run,
and over its second half: whether it levels off).
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from common import children_map, scripted_workspace, templates, tree_pss_mib

from primefs.store import mail
from primefs.store.session import list_sessions

# Every call gets the next of these (a rule would not match a compacted conversation, whose first
# message is its summary): a cell, then an answer.
SCRIPT = "default:\n" + "".join(f"  - code: \"n = {i}\\nprint(n)\"\n  - text: reply {i}\n" for i in range(3000))
# As with a real model, conversations are compacted once long (a scripted model has no window of its
# own): without it a session's conversation, and the runner's memory, would grow with every message.
COMPACT_AT_TOKENS = 2500
# Compared between samples: open files; RSS by where it lives; what the allocators hold, and what of it is live
COMPARED = ("fds", "rss_mib", "heap", "anon", "py_mib", "py_live_mib", "malloc_mib", "malloc_live_mib", "kernels_mib")


def fd_kinds(pid: int) -> Counter:
    kinds: Counter = Counter()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        kinds["epoll" if "eventpoll" in target else target.split(":")[0] if ":" in target else "file"] += 1
    return kinds


def memory(pid: int) -> dict:
    """RSS in MiB split by where it lives: the brk heap, other anonymous maps (malloc arenas of
    threads, thread stacks, mmap'd blocks) and files (code, shared libraries)."""
    kib = Counter()
    kind = "file"
    for line in open(f"/proc/{pid}/smaps"):
        head = line.split()
        if not line[0].isupper() or not head[0].endswith(":"):  # a mapping's first line
            path = head[5] if len(head) > 5 else "["
            kind = "heap" if path == "[heap]" else "anon" if path.startswith("[") else "file"
        elif head[0] == "Rss:":
            kib[kind] += int(head[1])
    return {k: round(kib[k] / 1024, 1) for k in ("heap", "anon", "file")}


def kernels_mib(pid: int) -> float:
    """PSS of the runner's kernel template and the kernels forked from it, in MiB (shared pages counted once)."""
    children = children_map()
    return round(sum(tree_pss_mib(t, children) for t in templates(pid, children)), 1)


def sample(pid: int) -> dict:
    kinds = fd_kinds(pid)
    status = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status"))
    return {"fds": sum(kinds.values()), "epoll": kinds["epoll"], "sockets": kinds["socket"], "pipes": kinds["pipe"],
            "threads": int(status["Threads"]), "rss_mib": round(int(status["VmRSS"].split()[0]) / 1024, 1),
            **memory(pid), "kernels_mib": kernels_mib(pid)}


def read_allocators(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):  # not written yet
        return {}


def main(minutes: float = 10.0, every_s: float = 60.0, gap_s: float = 2.0, warm_s: float = 30.0, seed: int = 0) -> dict:
    rnd = random.Random(seed)
    ws = scripted_workspace(SCRIPT, {"max_concurrent_sessions": 4, "compact_at_tokens": COMPACT_AT_TOKENS})
    names = [f"talk{i}" for i in range(3)]
    for name in names:
        (ws.goals / f"{name}.md").write_text(f"---\nname: {name}\n---\nTalk {name}\n")
    (ws.goals / "beat.md").write_text("---\nname: beat\nheartbeat: every 10s\n---\nTalk beat\n")
    allocators = ws.root.parent / "allocators.json"  # what the runner's allocators hold, live and kept
    proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("allocators.py")), str(allocators),
                             "-w", str(ws.root), "run", "-q"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    sessions: dict = {}
    while len(sessions) < len(names):
        sessions = {s.name: s for s in list_sessions(ws.sessions) if s.name in names}
        time.sleep(0.2)
    started = time.monotonic()
    samples, sent, next_sample = [], 0, started + warm_s
    end = started + warm_s + minutes * 60
    try:
        while time.monotonic() < end:
            s = sessions[rnd.choice(names)]
            mail.deliver(s.mail, sender="user", to=s.id, kind="user", text=f"message {sent}")
            sent += 1
            if time.monotonic() >= next_sample:
                row = {"s": round(time.monotonic() - started), **sample(proc.pid), **read_allocators(allocators),
                   "messages": sent}
                samples.append(row)
                print(" ".join(f"{k}={v}" for k, v in row.items()), file=sys.stderr, flush=True)
                next_sample += every_s
            time.sleep(rnd.uniform(gap_s / 2, gap_s * 1.5))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    first, middle, last = samples[0], samples[len(samples) // 2], samples[-1]

    def slope(a: dict, b: dict) -> dict:  # per minute, from sample a to sample b
        minutes = max(1e-9, (b["s"] - a["s"]) / 60)
        return {k: round((b[k] - a[k]) / minutes, 3) for k in COMPARED if k in a and k in b}

    return {"minutes": minutes, "messages": sent, "first": first, "last": last,
            "growth": {k: round(last[k] - first[k], 1) for k in (*COMPARED, "epoll", "sockets", "pipes", "threads",
                                                                   "objects") if k in first and k in last},
            "per_minute": slope(first, last),
            "per_minute_second_half": slope(middle, last),  # whether it levels off
            "workspace": str(ws.root)}


if __name__ == "__main__":
    args = [float(a) for a in sys.argv[1:4]]
    print(json.dumps(main(*args), indent=1))
