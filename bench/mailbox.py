"""A session that has taken many messages: the runner's CPU and the wall time per new message.

A session's mail/cur/ keeps every message it ever took (Maildir's "seen" mail), so a session that has
talked for months holds hundreds of thousands of files there. The runner must not pay for them at each
turn. The bench plants N taken messages in one idle session's cur/, then sends it messages one at a
time, each answered by a scripted reply, and reports the runner's own CPU (git's not counted) and the
wall time from delivery to the answer, per message; then what one turn commit of that session costs (all
of its mail is in git: a commit that looked at every file of the session's folder grew with it).

    python bench/mailbox.py            # 100,000 taken messages, 30 new ones
    python bench/mailbox.py 0 30       # the same with an empty cur/, to compare
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
import tracemalloc

from common import cpu_seconds, scripted_workspace

from primefs.store import mail
from primefs.store.gitops import commit_paths
from primefs.store.session import list_sessions

SCRIPT = "default:\n" + "".join(f"  - text: reply {i}\n" for i in range(5000))


def main(taken: int = 100_000, messages: int = 30) -> dict:
    ws = scripted_workspace(SCRIPT)
    (ws.goals / "talk.md").write_text("---\nname: talk\n---\nTalk\n")
    proc = subprocess.Popen([sys.executable, "-m", "primefs", "-w", str(ws.root), "run", "-q"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        s = None
        while s is None or s.reload().get("status") != "idle":
            s = next((x for x in list_sessions(ws.sessions) if x.name == "talk"), None)
            time.sleep(0.1)
        cur = s.mail / "cur"
        for i in range(taken):
            (cur / f"1700000000.{i:07d}.old{mail.SEEN}").write_text("---\nfrom: user\n---\nold\n")
        time.sleep(3)  # the runner's look at the planted files (the folder changed) is not counted
        cpu, wall = cpu_seconds(proc.pid)[0], time.monotonic()
        for i in range(messages):
            answered = len(s.events("assistant"))
            mail.deliver(s.mail, sender="user", to=s.id, kind="user", text=f"message {i}")
            while len(s.events("assistant")) == answered:
                time.sleep(0.01)
        cpu, wall = cpu_seconds(proc.pid)[0] - cpu, time.monotonic() - wall
    finally:
        proc.terminate()
        proc.wait(60)
    return {"taken": taken, "messages": messages, "runner_cpu_ms_per_message": round(1000 * cpu / messages, 1),
            "wall_ms_per_message": round(1000 * wall / messages, 1), **turn_commit(ws.root, s)}


def turn_commit(root, s, runs: int = 3) -> dict:
    """A turn's commit of the session (one new message and history line), in this process as the runner's
    committer makes it: its wall time (git's processes in it), the Python CPU and peak memory it costs the runner."""
    walls, cpus, peaks = [], [], []
    folder = s.dir.relative_to(root).as_posix()
    for i in range(runs):
        (s.mail / "cur" / f"1800000000.{i:07d}.new{mail.SEEN}").write_text("---\nfrom: user\n---\nnew\n")
        with open(s.history.path, "a") as f:
            f.write(json.dumps({"ts": time.time(), "type": "note", "text": f"commit {i}"}) + "\n")
        tracemalloc.start()
        wall, cpu = time.monotonic(), time.process_time()
        assert commit_paths(root, [folder], f"bench: commit {i}")
        walls.append(time.monotonic() - wall)
        cpus.append(time.process_time() - cpu)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    return {"commit_wall_ms": round(1000 * statistics.median(walls)),
            "commit_python_cpu_ms": round(1000 * statistics.median(cpus), 1),
            "commit_peak_mb": round(max(peaks) / 1e6, 1)}


if __name__ == "__main__":
    print(json.dumps(main(*[int(a) for a in sys.argv[1:3]]), indent=1))
