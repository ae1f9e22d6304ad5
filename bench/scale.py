"""A workspace that grows for months: N sessions copied from a real run (bigworkspace.py), ~100 events
each, one tree of 1,000 sessions (of all N if N is smaller); every command timed as a user runs it (a
fresh process, warm page cache, median of REPEAT runs after one that may bring summaries and the
index up to date). Needs primefs importable (`pip install -e .`, or PYTHONPATH=. from a clone); a
scripted model, no network. Disk: ~80 MB of workspace per 1,000 sessions, removed after each N.

    python bench/scale.py                 # N = 1000 10000 50000, then the table
    python bench/scale.py 200             # a quick look
    python bench/scale.py 10000 --keep    # keep the workspace (printed) instead of deleting it
    python bench/scale.py 10000 --before /tmp/primefs-main   # also the same commands with another
                                          # source tree on PYTHONPATH (e.g. `git archive main`), for "before"
    python bench/scale.py 10000 --lock /tmp/bench.lock    # measure holding flock(LOCK) (building does not):
                                          # other benchmarks that take the same lock do not disturb the timings
    python bench/scale.py --ws DIR BIG_ROOT   # a workspace built before (bigworkspace.py), as it is

Measured per N: the first `status --json` on histories without summaries or index (what the first
command after an upgrade pays), `reindex`, `status --json`, `status`, `usage` of the 1,000-session
tree, three `logs` queries, `git status`, one turn commit (gitops.commit_paths of one changed session),
and a runner's start to the first turn of a new goal (`run --once`, from process start to `turn_start`).
Then `status`, `status --json`, `logs -n 20` and `usage` again while a runner runs (`primefs up`), once its
change journal is trusted (median of 5).
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bigworkspace import build, seed

from primefs.store.gitops import commit_paths
from primefs.store.summary import FILE as SUMMARY

REPEAT = 3
# Commands run as installed: their bytecode cached (__pycache__), even where PYTHONDONTWRITEBYTECODE is set
# (compiling primefs's modules from source costs 0.1 s or more of every command).
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
PROBE = '  - match: "^Scale probe"\n    replies:\n      - text: "probed"\n'


def folders(ws: Path) -> list[Path]:
    return sorted(p for p in (ws / "sessions").iterdir() if p.is_dir())


def timed(ws: Path, *args: str, env: dict | None = None, timeout: float = 1800) -> float:
    env = env or ENV
    started = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "primefs", "-w", str(ws), *args], capture_output=True, text=True,
                       env=env, timeout=timeout)
    took = time.monotonic() - started
    if r.returncode != 0:
        raise SystemExit(f"primefs {' '.join(args)} failed: {r.stderr[-2000:]}")
    return took


def median(fn, repeat: int = REPEAT) -> float:
    fn()  # brings summaries and the index up to date, warms the page cache
    return round(statistics.median(fn() for _ in range(repeat)), 3)


def first_turn(ws: Path, env: dict | None = None) -> float:
    """`run --once` with one new goal: process start to that goal's first `turn_start`."""
    name = f"probe{time.time_ns()}"
    (ws / "goals" / f"{name}.md").write_text(f"---\nname: {name}\n---\nScale probe\n")
    started = time.time()
    subprocess.run([sys.executable, "-m", "primefs", "-w", str(ws), "run", "--once", "-q"], check=True,
                   env=env or ENV, timeout=600)
    for folder in reversed(folders(ws)):
        if f"name: {name}\n" in (folder / "session.yaml").read_text():
            for line in open(folder / "history.jsonl"):
                e = json.loads(line)
                if e["type"] == "turn_start":
                    return e["ts"] - started
    raise SystemExit("the probe goal never started a turn")


def turn_commit(ws: Path) -> float:
    found = folders(ws)
    folder = found[len(found) // 2]
    with open(folder / "result.md", "a") as f:
        f.write(".")
    started = time.monotonic()
    assert commit_paths(ws, [f"sessions/{folder.name}"], f"bench: {folder.name}")
    return time.monotonic() - started


def git_status(ws: Path) -> float:
    started = time.monotonic()
    subprocess.run(["git", "-C", str(ws), "status", "--porcelain"], check=True, capture_output=True)
    return time.monotonic() - started


def measure(ws: Path, big_root: str, env: dict | None = None, first: bool = True) -> dict:
    out = {}
    if first:  # as after an upgrade: no summary, no index
        for folder in folders(ws):
            (folder / SUMMARY).unlink(missing_ok=True)
        shutil.rmtree(ws / ".primefs", ignore_errors=True)
        out["first status --json (builds summaries)"] = round(timed(ws, "status", "--json", env=env), 2)
        out["reindex"] = round(timed(ws, "reindex", env=env), 2)
    out["primefs --version (process start, imports)"] = median(lambda: timed(ws, "--version", env=env))
    out["status --json"] = median(lambda: timed(ws, "status", "--json", env=env))
    out["status"] = median(lambda: timed(ws, "status", env=env))
    out["usage (1,000-session tree)"] = median(lambda: timed(ws, "usage", big_root, "--json", env=env))
    if first:
        out["logs -n 20"] = median(lambda: timed(ws, "logs", "-n", "20", env=env))
        out["logs -q 'row 17' --since 20d -n 20"] = median(lambda: timed(ws, "logs", "-q", "row 17", "--since", "20d",
                                                                          env=env))
        out["logs -m ... -t model_call --counts"] = median(lambda: timed(ws, "logs", "-m", "scripted/*", "-t",
                                                                         "model_call", "--counts", env=env))
        out["git status"] = median(lambda: git_status(ws))
        out["turn commit"] = median(lambda: turn_commit(ws))
    out["run --once: start to first turn"] = median(lambda: first_turn(ws, env))
    if first:
        out.update(with_runner(ws, big_root, env))
    return out


def with_runner(ws: Path, big_root: str, env: dict | None = None) -> dict:
    """The same commands while a runner runs (`primefs up`), once its change journal is trusted: commands
    look at the sessions it names, not at every session (docs/workspace.md, `.primefs/changed/`)."""
    from primefs.index.db import Index

    subprocess.run([sys.executable, "-m", "primefs", "-w", str(ws), "up"], check=True, env=env or ENV,
                   capture_output=True, timeout=600)
    try:
        started = time.monotonic()
        while True:
            with Index(ws) as index:
                if index.trusted():
                    break
            if time.monotonic() - started > 600:
                raise SystemExit("the runner's journal was never trusted")
            time.sleep(0.2)
        out = {"runner up: journal trusted after start": round(time.monotonic() - started, 2)}
        for label, args in (("status --json", ("status", "--json")), ("status", ("status",)),
                            ("logs -n 20", ("logs", "-n", "20")),
                            ("usage (1,000-session tree)", ("usage", big_root, "--json"))):
            out[f"runner up: {label}"] = median(lambda: timed(ws, *args, env=env), repeat=5)
        return out
    finally:
        subprocess.run([sys.executable, "-m", "primefs", "-w", str(ws), "down"], env=env or ENV, capture_output=True,
                       timeout=600)


class Locked:
    """flock(path) held while measuring (nothing when path is None); the load averages at both ends."""

    def __init__(self, path: str | None, out: dict):
        self.path, self.out, self.f = path, out, None

    def __enter__(self):
        if self.path:
            self.f = open(self.path, "a")
            fcntl.flock(self.f, fcntl.LOCK_EX)
        self.out["load at start"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
        return self

    def __exit__(self, *exc):
        self.out["load at end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
        if self.f is not None:
            self.f.close()


def main(sizes: list[int], keep: bool, before: str | None, lock: str | None) -> None:
    seeded = seed()
    with open(seeded / "script.yaml", "a") as f:
        f.write(PROBE)  # (rules are tried in order: the probe's own rule, added last, matches only it)
    results = {}
    for n in sizes:
        root = Path(tempfile.mkdtemp(prefix=f"primefs-scale-{n}-")) / "ws"
        info = build(n, root, big=min(1000, n), seed_root=seeded)  # (a smaller N: a tree of all N)
        print(json.dumps({"n": n, **info}), flush=True)
        load: dict = {}
        with Locked(lock, load):
            results[n] = {"after": measure(root, info["big_root"])}
        results[n]["load"] = load
        print(json.dumps({"n": n, "load": load}), flush=True)
        print(json.dumps({"n": n, "after": results[n]["after"]}), flush=True)
        if before:
            env = {**ENV, "PYTHONPATH": before}
            with Locked(lock, {}):
                results[n]["before"] = measure(root, info["big_root"], env=env, first=False)
            print(json.dumps({"n": n, "before": results[n]["before"]}), flush=True)
        if keep:
            print(f"kept: {root}", flush=True)
        else:
            shutil.rmtree(root.parent)
    shutil.rmtree(seeded.parent, ignore_errors=True)
    rows = list(next(iter(results.values()))["after"])
    print("\n| measure | " + " | ".join(f"{n:,} sessions" for n in sizes) + " |")
    print("|---|" + "---:|" * len(sizes))
    for row in rows:
        cells = []
        for n in sizes:
            after, was = results[n]["after"].get(row), results[n].get("before", {}).get(row)
            cells.append(f"{after} s" + (f" (before: {was} s)" if was is not None else ""))
        print(f"| {row} | " + " | ".join(cells) + " |")
    print("| load (1, 5, 15 min) while measuring | " + " | ".join(
        f"{results[n]['load']['load at start']} .. {results[n]['load']['load at end']}" for n in sizes) + " |")


def existing(ws: Path, big_root: str, lock: str | None) -> None:
    """Measure a workspace built before (bigworkspace.py): summaries and index as they are (no first look)."""
    out: dict = {}
    with Locked(lock, out):
        out.update(measure(ws, big_root, first=False))
        out.update(with_runner(ws, big_root))
    for k, v in out.items():
        print(f"| {k} | {v} |")


if __name__ == "__main__":
    args = sys.argv[1:]
    if "--ws" in args:  # python bench/scale.py --ws DIR BIG_ROOT: an existing workspace
        at = args.index("--ws")
        existing(Path(args[at + 1]), args[at + 2], args[args.index("--lock") + 1] if "--lock" in args else None)
        raise SystemExit(0)
    before = args[args.index("--before") + 1] if "--before" in args else None
    lock = args[args.index("--lock") + 1] if "--lock" in args else None
    sizes = [int(a) for a in args if a.isdigit()] or [1000, 10000, 50000]
    main(sizes, "--keep" in args, before, lock)
