"""Bad workspace files for fuzzing: hypothesis strategies, planting them in a workspace, and the check
that a runner fed with them neither crashes, nor shows a traceback, nor loops, and names every one.

Used by tests/test_fuzz.py (bounded) and bench/fuzz.py (long)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from hypothesis import strategies as st

from primefs.store.frontmatter import dump_yaml, load_yaml

GOAL_KEYS = ["model", "name", "context", "limits", "autonomous", "budget", "end_conditions", "heartbeat", "tools",
             "sandbox"]
LIMIT_KEYS = ["cell_timeout_s", "max_steps_per_turn", "max_concurrent_sessions", "snapshot", "output_chars"]
SESSION_KEYS = ["id", "name", "parent", "depth", "status", "model", "goal", "context", "limits", "budget",
                "tools", "started_ts"]
MAIL_KEYS = ["id", "from", "to", "kind", "created"]

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-10**12, max_value=10**15),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40), st.text(alphabet="\0\n\t/.:-_ab", max_size=20),
    st.sampled_from(["", "..", "../../etc/passwd", "/etc/passwd", "x" * 5000, "nl\n", "local", "scripted/s.yaml",
                     "running", "pending", "stopped", ".nan", "1e9"]))


def values(keys: list[str]):
    """YAML-able data shaped like front matter: known keys with wrong or odd values, and nesting."""
    leaf = st.one_of(scalars, st.lists(scalars, max_size=4))
    nested = st.recursive(leaf, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                        st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                          max_leaves=20)
    return st.dictionaries(st.sampled_from(keys + ["junk"]), nested, max_size=6)


def deep(n: int) -> str:
    return "a: " + "[" * n + "]" * n + "\n"


def _yaml(data) -> str:
    try:
        return dump_yaml(data)
    except Exception:  # noqa: BLE001 - what ruamel cannot write, json can (YAML is a superset)
        return json.dumps(data, default=str) + "\n"


def front_matter(keys: list[str]):
    special = st.sampled_from([deep(2000), "&a [*a]\n", "a: &x [1,2]\nb: [*x,*x,*x]\n", "- just\n- a list\n",
                               "key: [unclosed\n", "\x00\x01binary\n", "a: !!python/object:os.system x\n"])
    return st.one_of(values(keys).map(_yaml), special)


def file_contents(keys: list[str]):
    """Whole file texts: front matter + body, raw bytes, or nothing."""
    with_body = st.tuples(front_matter(keys), st.text(max_size=200)).map(lambda fb: f"---\n{fb[0]}---\n{fb[1]}")
    return st.one_of(with_body, with_body, st.binary(max_size=300).map(lambda b: b.decode("latin-1")),
                     st.just(""), st.just("---\nname: x\n"))


# A bad file: (kind, content, shape). shape: "file", "dir" (a folder where a file belongs), "link" (a link out).
bad_files = st.one_of(
    st.tuples(st.just("goal"), file_contents(GOAL_KEYS), st.sampled_from(["file", "file", "file", "dir", "link"])),
    st.tuples(st.just("mail"), file_contents(MAIL_KEYS), st.sampled_from(["file", "file", "dir", "link"])),
    st.tuples(st.just("session"), front_matter(SESSION_KEYS), st.just("file")),
    st.tuples(st.just("harness"), file_contents(["name", "description", "primefs", "tools", "model"]),
              st.sampled_from(["file", "file", "dir", "link"])),
    st.tuples(st.just("heartbeat"), front_matter(["id", "schedule", "prompt", "paused", "next_due"]),
              st.just("file")),
)


def plant(ws, files: list[tuple[str, str, str]], session) -> list[str]:
    """Write each bad file into the workspace; returns their workspace-relative paths."""
    out = []
    outside = Path(ws.root).parent / "outside.txt"
    outside.write_text("---\nname: outside\n---\nread me\n")
    for i, (kind, content, shape) in enumerate(files):
        if kind == "session":
            folder = ws.sessions / f"261201-000000{i:03d}-fz{i % 10}"
            (folder / "mail" / "new").mkdir(parents=True, exist_ok=True)
            path = folder / "session.yaml"
        elif kind == "goal":
            path = ws.goals / f"fuzz-{i}.md"
        elif kind == "mail":
            path = session.mail / "new" / f"fuzz-{i}.md"
        elif kind == "harness":
            path = ws.harness / "notes" / f"fuzz-{i}.md"
        else:
            (session.dir / "heartbeats").mkdir(exist_ok=True)
            path = session.dir / "heartbeats" / f"hb-fz{i:04d}.yaml"
        if shape == "dir":
            path.mkdir(parents=True, exist_ok=True)
            (path / "inner.md").write_text(content, encoding="utf-8", errors="replace")
        elif shape == "link":
            os.symlink(outside, path)
        else:
            path.write_text(content, encoding="utf-8", errors="replace")
        out.append(path.relative_to(ws.root).as_posix())
    return out


def run_and_check(ws, planted: list[str], timeout: float = 120) -> dict:
    """`primefs run --once` then `status` as processes: what went wrong, if anything."""
    started = time.monotonic()
    env = {**os.environ, "PRIMEFS_LOAD_PLUGINS": "0"}
    cmd = [sys.executable, "-m", "primefs", "-w", str(ws.root)]
    try:
        run = subprocess.run([*cmd, "run", "--once"], capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"crash": 0, "traceback": 0, "hot_loop": 1, "unreported": [], "seconds": timeout}
    status = subprocess.run([*cmd, "status"], capture_output=True, text=True, timeout=60, env=env)
    said = run.stdout + run.stderr + status.stdout + status.stderr
    events = sum(1 for p in ws.sessions.glob("*/history.jsonl") for _ in p.open("rb"))
    unreported = [p for p in planted if not reported(ws, p, said)]
    return {"crash": int(run.returncode not in (0, 1, 3) or status.returncode not in (0, 1)),
            "traceback": int("Traceback" in said), "hot_loop": int(events > 2000),
            "unreported": unreported, "seconds": round(time.monotonic() - started, 2)}


def reported(ws, rel: str, said: str) -> bool:
    """Every bad file is reported: a message is no longer in new/ (read, or moved to mail/bad/ with its
    reason); any other file is either usable or named in what the runner and `status` said."""
    path = Path(ws.root, rel)
    if "/mail/new/" in rel:
        return not os.path.lexists(path)
    return usable(ws, rel) or path.name in said or (rel.endswith("session.yaml") and rel.split("/")[1] in said)


def usable(ws, rel: str) -> bool:
    from primefs.store.frontmatter import load_yaml
    from primefs.store.goals import parse_goal
    from primefs.harness.entries import Harness
    from primefs.store.heartbeat import check
    from primefs.store.session import Session

    path = Path(ws.root, rel)
    try:
        if rel.startswith("goals/"):
            parse_goal(ws, path)
        elif "/heartbeats/" in rel:
            check(load_yaml(path, safe=True), path.name)
        elif rel.endswith("session.yaml"):
            Session(path.parent).read_meta()
        else:
            return not any(e.problem and e.path == rel for e in Harness(ws).list(all_sessions=True))
        return True
    except Exception:  # noqa: BLE001
        return False


def fuzz_workspace(prefix: str = "primefs-fuzz-"):
    """A new workspace whose model always answers "ok" (scripted), and the session that gets the bad mail."""
    import tempfile

    from primefs.store.session import create_session
    from primefs.store.workspace import Workspace, init_workspace

    ws = init_workspace(Path(tempfile.mkdtemp(prefix=prefix)) / "ws")
    (ws.root / "s.yaml").write_text("default:\n" + "  - text: ok\n" * 50)
    cfg = load_yaml(ws.root / "primefs.yaml")
    cfg["model"] = "scripted/s.yaml"
    (ws.root / "primefs.yaml").write_text(dump_yaml(cfg))
    ws = Workspace(ws.root)
    return ws, create_session(ws.sessions, task="a session that receives the bad mail", name="target",
                              model="scripted/s.yaml")
