"""Big workspaces for bench/scale.py: N sessions copied from one real run.

The seed is a real `primefs run --once` (scripted instant model): a root that fans out to 20
children, each running 30 cells with some output, ~100 history events per session. Copies of its
21 session folders get new ids (creation times spread back over weeks, so ids and `ts` stay in
order), their parents, children, mail senders and timestamps rewritten to match. One copy of the
tree is made big on request: `big` sessions under one root (copies of the seed tree hung below it),
for `usage` of a 1,000-session tree.

    python bench/bigworkspace.py N DIR [--big 1000]     # build DIR (a new folder) with N sessions
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from common import scripted_workspace

from primefs.store.workspace import git_env, init_workspace

CHILDREN, CELLS = 20, 30
SEED_SCRIPT = f"""\
rules:
  - match: "^Fan out"
    replies:
      - code: |
          hs = [rlm(f'child {{i}}: count the words of line {{i}}') for i in range({CHILDREN})]
          res = wait_all(hs)
          print(len(res), res[0])
      - text: "all children answered"
  - match: "^child"
    replies:
""" + "".join(f"""      - text: "Step {i}: look at the data once more."
        code: "print('row {i}:', ', '.join(str(x * {i}) for x in range(60)))"
""" for i in range(CELLS)) + """      - text: "the line has 12 words"
"""

ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"
ID_RE = re.compile(r"\b\d{6}-\d{9}-[0-9a-z]{3}\b")
TS_RE = re.compile(r'"ts": (\d+\.\d+)')
ISO_RE = re.compile(r"'(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00)'")
DEPTH_RE = re.compile(r"^depth: (\d+)$", re.M)
PARENT_RE = re.compile(r"^parent: null$", re.M)


def seed() -> Path:
    """One real fan-out run; returns its workspace root."""
    ws = scripted_workspace(SEED_SCRIPT, {"max_steps_per_turn": CELLS + 5})
    (ws.goals / "fan.md").write_text("Fan out to children\n")
    r = subprocess.run([sys.executable, "-m", "primefs", "-w", str(ws.root), "run", "--once", "-q"],
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"seed run failed: {r.stderr}")
    return ws.root


def _id_at(t: float, tail: str) -> str:
    d = datetime.fromtimestamp(t, timezone.utc)
    return f"{d:%y%m%d-%H%M%S}{d.microsecond // 1000:03d}-{tail}"


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="milliseconds")


def _id_time(sid: str) -> float:
    d = datetime.strptime(sid[:13], "%y%m%d-%H%M%S").replace(tzinfo=timezone.utc)
    return d.timestamp() + int(sid[13:16]) / 1000


class Copier:
    """Copies of the seed's session folders with new ids, shifted in time."""

    def __init__(self, seed_root: Path):
        self.seed = seed_root / "sessions"
        self.ids = sorted(p.name for p in self.seed.iterdir() if (p / "session.yaml").is_file())
        self.t0 = _id_time(self.ids[0])
        self.files: dict[str, list[tuple[str, bytes]]] = {}
        for sid in self.ids:
            out = []
            for path in sorted((self.seed / sid).rglob("*")):
                rel = path.relative_to(self.seed / sid).as_posix()
                if path.is_file() and not rel.startswith(("kernel/", "harness/")):
                    out.append((rel, path.read_bytes()))
            self.files[sid] = out
        self.root_id = self.ids[0]

    def copy(self, dest: Path, start: float, n: int, tag: int, parent: str | None = None) -> list[str]:
        """The first n sessions of the seed tree (root first) as new sessions starting at `start`."""
        shift = start - self.t0
        tail = "".join(ALPHABET[tag // 36 ** i % 36] for i in (2, 1, 0))
        new = {old: _id_at(_id_time(old) + shift, tail) for old in self.ids[:n]}
        for old in self.ids[n:]:
            new[old] = new[self.root_id]  # dropped children: their mentions point at the root (harmless)

        def ids(text: str) -> str:
            return ID_RE.sub(lambda m: new.get(m.group(0), m.group(0)), text)

        for old in self.ids[:n]:
            folder = dest / new[old]
            for rel, data in self.files[old]:
                path = folder / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                text = ids(data.decode("utf-8"))
                if rel == "history.jsonl":
                    text = TS_RE.sub(lambda m: f'"ts": {float(m.group(1)) + shift:.6f}', text)
                elif rel == "session.yaml":
                    text = ISO_RE.sub(lambda m: repr(_iso(datetime.fromisoformat(m.group(1)).timestamp() + shift)),
                                      text)
                    if parent is not None and old == self.root_id:
                        text = PARENT_RE.sub(f"parent: {parent}", text)
                    if parent is not None:
                        text = DEPTH_RE.sub(lambda m: f"depth: {int(m.group(1)) + 1}", text)
                path.write_text(text, encoding="utf-8")
            for sub in ("mail/new", "mail/tmp", "mail/cur"):
                (folder / sub).mkdir(parents=True, exist_ok=True)
        return [new[old] for old in self.ids[:n]]


def build(n: int, dest: Path, big: int = 0, seed_root: Path | None = None, commit: bool = True) -> dict:
    """A workspace of n sessions at `dest`; `big` of them (if > 0) in one tree."""
    t = time.monotonic()
    own_seed = seed_root is None
    seed_root = seed_root or seed()
    seeded = time.monotonic() - t
    ws = init_workspace(dest)
    shutil.copy(seed_root / "script.yaml", dest / "script.yaml")
    shutil.copy(seed_root / "primefs.yaml", dest / "primefs.yaml")
    (dest / "goals" / "fan.md").write_text("Fan out to children\n")
    copier = Copier(seed_root)
    per = len(copier.ids)
    start = time.time() - 86400 * 30  # a month of work, one tree every few minutes
    step = 86400 * 29 / max(1, n // per)
    made, tag, big_root = 0, 0, None
    if big:
        big_root = copier.copy(ws.sessions, start, 1, tag)[0]
        made, tag = 1, 1
        while made < big:
            k = min(per, big - made)
            made += len(copier.copy(ws.sessions, start + tag, k, tag, parent=big_root))
            tag += 1
    while made < n:
        k = min(per, n - made)
        made += len(copier.copy(ws.sessions, start + tag * step, k, tag))
        tag += 1
    built = time.monotonic() - t - seeded
    if own_seed:
        shutil.rmtree(seed_root.parent, ignore_errors=True)
    info = {"sessions": made, "seed_s": round(seeded, 1), "copy_s": round(built, 1), "big_root": big_root,
            "history_mb": round(sum(p.stat().st_size for p in ws.sessions.glob("*/history.jsonl")) / 1e6),
            "events": sum(sum(1 for _ in open(p, "rb")) for p in ws.sessions.glob("*/history.jsonl"))}
    if commit:
        t = time.monotonic()
        env = git_env()
        subprocess.run(["git", "-C", str(dest), "add", "-A"], check=True, env=env)
        subprocess.run(["git", "-C", str(dest), "commit", "-q", "-m", f"{made} sessions"], check=True, env=env)
        info["git_commit_s"] = round(time.monotonic() - t, 1)
    return info


if __name__ == "__main__":
    args = sys.argv[1:]
    big = int(args[args.index("--big") + 1]) if "--big" in args else 0
    print(build(int(args[0]), Path(args[1]), big=big), flush=True)
    sys.exit(0)
