"""The web view on a big workspace: N sessions (a tenth of them children), M events each, and one
session with a long history. Times the first look (every history read once), a look with nothing
changed, a look after one append, and the pages (through Starlette's test client: no network).

    python bench/web_scale.py [N] [M] [LONG]      # default 10000 20 200000
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from starlette.testclient import TestClient  # noqa: E402

from primefs.store.session import create_session  # noqa: E402
from primefs.store.workspace import init_workspace  # noqa: E402
from primefs.web.app import make_app  # noqa: E402
from primefs.web.index import WorkspaceIndex  # noqa: E402


def events(n: int, start: float) -> str:
    out = []
    for i in range(n):
        if i % 4 == 0:
            e = {"ts": start + i, "type": "model_call", "n": i, "model": "m", "purpose": "turn", "input_tokens": 700,
                 "output_tokens": 20, "cost_usd": 0.0001, "cost_known": True, "latency_s": 0.5}
        elif i % 4 == 1:
            e = {"ts": start + i, "type": "cell", "n": i, "code": "print(1)", "output": "1\n" * 20, "error": None,
                 "elapsed_s": 0.01, "shown": "1\n"}
        else:
            e = {"ts": start + i, "type": "notice", "n": i, "text": "x" * 200}
        out.append(json.dumps(e))
    return "\n".join(out) + "\n"


def timed(label: str, fn):
    t = time.perf_counter()
    value = fn()
    print(f"{label:48s} {time.perf_counter() - t:8.3f} s")
    return value


def main(n: int, m: int, long: int) -> None:
    ws = init_workspace(Path(tempfile.mkdtemp(prefix="primefs-webscale-")) / "ws")
    t = time.perf_counter()
    parents = []
    text = events(m, time.time() - 3600)
    for i in range(n):
        parent = parents[i % len(parents)].id if parents and i % 10 == 9 else None
        s = create_session(ws.sessions, task="t", name=f"s{i}", model="m", parent=parent)
        (s.dir / "history.jsonl").write_text(text)
        if parent is None:
            parents.append(s)
    big = create_session(ws.sessions, task="long", name="long", model="m")
    (big.dir / "history.jsonl").write_text(events(long, time.time() - 7200))
    size = sum(f.stat().st_size for f in ws.sessions.glob("*/history.jsonl"))
    print(f"{n + 1} sessions, {size / 1e6:.0f} MB of history, made in {time.perf_counter() - t:.1f} s")
    index = WorkspaceIndex(ws)
    timed("index: first look (reads every history once)", lambda: index.refresh(force=True))
    timed("index: look, nothing changed", lambda: index.refresh(force=True))
    with open(big.dir / "history.jsonl", "a") as f:
        f.write(events(1, time.time()))
    timed("index: look after one event appended", lambda: index.refresh(force=True))
    app = make_app(ws, "t", port=80, allowed_hosts={"testserver"}, eval_roots=[])
    c = TestClient(app)
    c.cookies.set("primefs_token_80", "t")
    timed("GET / (first: builds the server's index)", lambda: c.get("/"))
    for path in ("/", "/?page=2", "/?status=idle&name=s1*", f"/s/{big.id}", f"/s/{parents[0].id}", "/usage",
                 f"/usage?session={parents[0].id}"):
        r = timed(f"GET {path[:40]}", lambda: c.get(path))
        assert r.status_code == 200, (path, r.status_code)


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:]]
    main(*(args + [10000, 20, 200000][len(args):]))
