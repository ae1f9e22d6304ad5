"""Soak: N cycles of a runner killed with SIGKILL at a random moment and started again, under mail
bursts, fan-outs and long cells; then a final `run --once` that drains everything, and a steady phase
with one runner under load.

Prints: messages lost and processed twice, stuck sessions, orphan kernels (processes left after a
kill), leftover locks, and the runner's open files and memory at the start and end of the steady phase.

    python bench/soak.py          # 100 cycles
    python bench/soak.py 20
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

from common import scripted_workspace

from primefs.store import mail
from primefs.store.history import iter_events
from primefs.store.session import list_sessions

SCRIPT = """\
rules:
  - match: "^Inbox"
    replies:
""" + "".join(f"      - text: reply {i}\n" for i in range(5000)) + """\
  - match: "^Fan"
    replies:
      - code: "hs = [rlm(f'child {i}') for i in range(4)]\\nprint(wait_all(hs))"
      - text: fanned out
  - match: "^child"
    replies:
      - code: "x = 6 * 7"
      - text: child ok
  - match: "^Long"
    replies:
""" + "".join(f"      - code: \"import time; time.sleep(1.5); n{i} = {i}\"\n      - text: long {i}\n"
              for i in range(2000))


def kernels_of(ws_root: Path) -> list[int]:
    """Processes whose working directory is the workspace: kernels (and their template)."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if os.readlink(f"/proc/{d}/cwd") == str(ws_root) and int(d) != os.getpid():
                    out.append(int(d))
            except OSError:
                pass
    return out


def proc_stats(pid: int) -> dict:
    try:
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        rss = next(int(line.split()[1]) for line in open(f"/proc/{pid}/status") if line.startswith("VmRSS:"))
        return {"fds": fds, "rss_mib": round(rss / 1024, 1)}
    except (OSError, StopIteration):
        return {}


def runner(ws) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "primefs", "-w", str(ws.root), "run", "-q"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def soak(cycles: int, seed: int = 0, steady_s: float = 60.0) -> dict:
    rnd = random.Random(seed)
    ws = scripted_workspace(SCRIPT, {"max_concurrent_sessions": 4})
    for name, task in (("inbox", "Inbox"), ("long", "Long job")):
        (ws.goals / f"{name}.md").write_text(f"---\nname: {name}\n---\n{task}\n")
    subprocess.run([sys.executable, "-m", "primefs", "-w", str(ws.root), "run", "--once", "-q"], check=True)
    by = {s.name: s for s in list_sessions(ws.sessions)}
    inbox, long_ = by["inbox"], by["long"]
    sent: list[str] = []
    orphans, fans = 0, 0
    started = time.monotonic()
    for cycle in range(cycles):
        proc = runner(ws)
        deadline = time.monotonic() + rnd.uniform(0.5, 2.5)
        while time.monotonic() < deadline:
            for _ in range(rnd.randint(1, 10)):
                sent.append(mail.deliver(inbox.mail, sender="user", to=inbox.id, kind="user",
                                         text=f"message {len(sent)}").id)
            if rnd.random() < 0.2:
                fans += 1
                (ws.goals / f"fan{fans}.md").write_text(f"---\nname: fan{fans}\n---\nFan out {fans}\n")
            if rnd.random() < 0.3:
                mail.deliver(long_.mail, sender="user", to=long_.id, kind="user", text="more")
            time.sleep(rnd.uniform(0.05, 0.3))
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        gone_by = time.monotonic() + 5
        while kernels_of(ws.root) and time.monotonic() < gone_by:
            time.sleep(0.05)
        left = kernels_of(ws.root)
        orphans += len(left)
        for pid in left:  # do not let one cycle's leftovers spoil the next
            os.kill(pid, signal.SIGKILL)
        if cycle % 10 == 9:
            print(f"cycle {cycle + 1}/{cycles}, {len(sent)} messages, {time.monotonic() - started:.0f} s",
                  file=sys.stderr, flush=True)
    final = subprocess.run([sys.executable, "-m", "primefs", "-w", str(ws.root), "run", "--once", "-q"],
                           capture_output=True, text=True, timeout=600)
    seen = Counter(e["id"] for e in iter_events(inbox.dir / "history.jsonl") if e.get("type") == "message")
    sessions = list_sessions(ws.sessions)
    stuck = [s.id for s in sessions if s.reload().get("status") in ("pending", "running")
             or mail.new_files(s.mail) or mail.unacked(s.mail)]
    locks = [str(p) for p in (ws.root / ".git" / "index.lock", ws.state / "runner.json") if p.exists()]
    return {"cycles": cycles, "messages": len(sent), "fan_goals": fans, "sessions": len(sessions),
            "lost": sum(1 for i in sent if i not in seen), "processed_twice": sum(1 for v in seen.values() if v > 1),
            "stuck_sessions": stuck, "orphan_kernels": orphans, "leftover_locks": locks,
            "final_run_exit": final.returncode, "traceback": "Traceback" in final.stderr,
            "seconds": round(time.monotonic() - started, 1), "steady": steady(ws, inbox, steady_s),
            "workspace": str(ws.root)}


def steady(ws, inbox, seconds: float, warm_s: float = 15.0) -> dict:
    """One runner under continuous mail: its open files and memory after `warm_s` of load (all its
    parts started), and again `seconds` later. Growth between the two is what a leak would show."""
    proc = runner(ws)
    n = 0

    def load(for_s: float) -> None:
        nonlocal n
        end = time.monotonic() + for_s
        while time.monotonic() < end:
            for _ in range(5):
                mail.deliver(inbox.mail, sender="user", to=inbox.id, kind="user", text=f"steady {n}")
                n += 1
            time.sleep(0.2)

    load(warm_s)
    first = proc_stats(proc.pid)
    load(seconds)
    time.sleep(3)
    last = proc_stats(proc.pid)
    proc.send_signal(signal.SIGTERM)
    proc.wait(60)
    return {"seconds": seconds, "messages": n, "after_warm_up": first, "at_end": last}


if __name__ == "__main__":
    print(json.dumps(soak(int(sys.argv[1]) if len(sys.argv) > 1 else 100), indent=1))
