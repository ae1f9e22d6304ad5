"""Waking a session with a long life: a runner started for one new message to a session whose history
holds N events (turns of mail and answers, compacted every 40 events, as a session of months would).

A runner reads a session from its files when it wakes it (a new runner, or one that let the session go:
turns.KEEP_AGENTS). What it needs is at the history's end: the conversation since the last compaction,
the last turn's number, the last kernel event, the next event's number. This times `primefs run --once`
answering the message (a scripted reply, no kernel), and reports its wall time and the runner's peak RSS
(git's work on the grown history is in the time, as for any turn).

    python bench/wake.py               # 200,000 events, 3 runs
    python bench/wake.py 20000 5       # 20,000 events, 5 runs
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from common import scripted_workspace

from primefs.store import mail
from primefs.store.history import read_events
from primefs.store.session import list_sessions

SCRIPT = "default:\n" + "".join(f"  - text: reply {i}\n" for i in range(100))
COMPACT_EVERY = 40


def run_once(ws) -> tuple[float, float]:
    """(seconds, peak RSS MiB) of one `primefs run --once`."""
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "primefs", "-w", str(ws.root), "run", "--once", "-q"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"primefs run --once exited {proc.returncode}")
    return time.monotonic() - started, usage.ru_maxrss / 1024


def grow(path, turn: list[dict], events: int) -> None:
    """Append `events` events to a history: copies of one real turn, with a compaction every
    COMPACT_EVERY events that keeps the last turn."""
    last = read_events(path)[-1]
    n, ts, number = last["n"] + 1, last["ts"], last.get("turn", 1)
    with open(path, "a") as f:
        while events > 0:
            number += 1
            for e in turn:
                e = {**e, "n": n, "ts": ts}
                if e["type"] in ("turn_start", "turn_end"):
                    e["turn"] = number
                if e["type"] == "message":
                    e["id"] = f"old-{n}"
                f.write(json.dumps(e) + "\n")
                n, ts, events = n + 1, ts + 0.01, events - 1
            if n % COMPACT_EVERY < len(turn):
                f.write(json.dumps({"ts": ts, "type": "compaction", "n": n, "upto_n": n - len(turn) - 1,
                                    "replaced": COMPACT_EVERY, "kept_from_n": n - len(turn),
                                    "summary": "what came before, in short", "tokens_before": 3000}) + "\n")
                n, events = n + 1, events - 1


def main(events: int = 200_000, runs: int = 3) -> dict:
    ws = scripted_workspace(SCRIPT)
    (ws.goals / "talk.md").write_text("---\nname: talk\n---\nTalk\n")
    run_once(ws)
    s = next(x for x in list_sessions(ws.sessions) if x.name == "talk")
    first = read_events(s.history.path)
    mail.deliver(s.mail, sender="user", to=s.id, kind="user", text="hello")
    run_once(ws)  # a second turn: the shape of a turn that answers mail
    turn = read_events(s.history.path)[len(first):]
    grow(s.history.path, turn, events)
    subprocess.run(["git", "-C", str(ws.root), "add", "-A"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["git", "-C", str(ws.root), "commit", "-qm", "a long life"], check=True)
    size = s.history.path.stat().st_size
    rows = []
    for i in range(runs):
        mail.deliver(s.mail, sender="user", to=s.id, kind="user", text=f"and now {i}")
        seconds, peak = run_once(ws)
        rows.append({"seconds": round(seconds, 2), "peak_rss_mib": round(peak, 1)})
        print(f"run {i + 1}: {seconds:.2f} s, peak RSS {peak:.1f} MiB", file=sys.stderr, flush=True)
    answered = [e for e in read_events(s.history.path) if e["type"] == "assistant"]
    assert answered[-1].get("text", "").startswith("reply"), "the last message was not answered"
    return {"events": events, "history_mb": round(size / 1e6, 1), "runs": rows,
            "median_s": sorted(r["seconds"] for r in rows)[len(rows) // 2],
            "median_peak_mib": sorted(r["peak_rss_mib"] for r in rows)[len(rows) // 2]}


if __name__ == "__main__":
    print(json.dumps(main(*[int(a) for a in sys.argv[1:3]]), indent=1))
