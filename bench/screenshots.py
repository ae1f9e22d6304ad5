"""Screenshots of every page of the web view, for docs/web.md (`make screenshots` runs this in a
loopback-only network namespace, as the browser tests).

A demo workspace whose model is a scripted OpenAI-compatible server on loopback, reached through
litellm as `openai/gpt-4o-mini` (so litellm prices the calls from its local price list): a goal that fans out to three children, a session that
took a second turn for a message, harness changes (one reverted, one judged), two eval runs, and a
goal still running while the pictures are taken. Then `primefs serve` and Chromium.

    python bench/screenshots.py [OUT_DIR]      # default docs/img
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from common import configure_model, scripted_workspace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
os.environ.setdefault("PRIMEFS_TEST_PLUGINS", "1")  # the eval runs need the benchmark plugins
from browser import chromium, served  # noqa: E402
from conftest import BackgroundRunner, run_once, wait_for  # noqa: E402
from openai_server import ScriptServer  # noqa: E402
from ruamel.yaml import YAML  # noqa: E402

from primefs.eval.run import load_config, run_eval  # noqa: E402
from primefs.harness.entries import Harness  # noqa: E402
from primefs.store.goals import write_goal  # noqa: E402
from primefs.store.mail import deliver  # noqa: E402
from primefs.store.session import list_sessions  # noqa: E402

SCRIPT = """\
rules:
  - match: "^Sum chunk"
    replies:
      - code: "print(sum(context))"
      - text: "see above"
  - match: "^Add up"
    replies:
      - code: "hs = [rlm(f'Sum chunk {i}', context=list(range(i * 10, i * 10 + 10))) for i in range(3)]\\nparts = wait_all(hs)\\nprint(parts)"
      - code: "total = sum(int(p.split()[-1]) if p.split()[-1].isdigit() else 0 for p in parts)\\nprint(total)"
      - text: "The three chunks are summed by the children; see their results."
  - match: "^Watch"
    replies:
      - code: "import time\\nfor i in range(3):\\n    print('tick', i)\\ntime.sleep(120)"
      - text: "done watching"
  - match: "needle|lucky|secret"
    replies:
      - code: "print(context[:80])"
      - text: "I could not find it."
default:
  - code: "x = 17 * 23\\nprint(x)"
  - text: "17 * 23 = 391"
  - text: "Doubled: 782"
"""


def build(srv):
    ws = scripted_workspace(SCRIPT, {"cell_timeout_s": 300})
    alias = {"model": "openai/gpt-4o-mini", "api_base": srv.url, "api_key": "demo", "tool_mode": "native"}
    configure_model(ws, alias)
    write_goal(ws, "Add up 0..29 using three children", name="fan-out")
    write_goal(ws, "What is 17 * 23? Compute it with Python.", name="mult")
    run_once(ws)
    mult = next(s for s in list_sessions(ws.sessions) if s.name == "mult")
    deliver(mult.mail, sender="user", to=mult.id, kind="user", text="Now double it.")
    run_once(ws)
    h = Harness(ws)
    h.put("note", "answer-style", "End with one plain line: the answer.", source="user",
          description="how answers end")
    bad = h.put("memory", "chunk-sums", "Children sum their chunk with sum(context).", source="agent",
                session=None, evidence=[f"{mult.id}#6"], intent="fewer steps per child")
    h.record_outcome(bad, "good", "children answered in one cell")
    wrong = h.put("memory", "guess-first", "Guess before computing.", source="user")
    h.revert(wrong)
    runs = ws.root / "eval-runs"
    run_eval("needle", load_config(None, {"n": 4}), runs / "needle-oracle", oracle=True)
    for n in (2, 4):
        cfg = load_config(None, {"n": n, "model": "bench", "concurrency": 2})
        cfg["models"] = {"bench": alias}
        run_eval("needle", cfg, runs / f"needle-gpt-4o-mini-n{n}")
    return ws


def main(out: Path) -> None:
    started = time.monotonic()
    srv = ScriptServer(YAML(typ="safe").load(SCRIPT), delay=0.05).__enter__()
    ws = build(srv)
    out.mkdir(parents=True, exist_ok=True)
    fan = next(s for s in list_sessions(ws.sessions) if s.name == "fan-out")
    with served(ws.root) as url, chromium() as browser, BackgroundRunner(ws):
        write_goal(ws, "Watch the clock for a while", name="watcher")
        watcher = wait_for(lambda: next((s for s in list_sessions(ws.sessions) if s.name == "watcher"), None))
        wait_for(lambda: watcher.events("cell") or watcher.events("assistant"))
        base, token = url.split("/?token=")
        page = browser.new_context(viewport={"width": 1280, "height": 820}).new_page()
        page.goto(url)
        page.wait_for_selector("#live.on")
        page.wait_for_selector(".badge.running")
        page.wait_for_timeout(2500)  # the runner's state file (every 2 s) says what it is doing

        def shot(name: str, path: str | None = None, full: bool = True) -> None:
            if path is not None:
                page.goto(base + path)
            page.wait_for_timeout(400)
            page.screenshot(path=str(out / f"web-{name}.png"), full_page=full)
            print(f"{out / f'web-{name}.png'}")

        shot("tree")
        shot("session", f"/s/{fan.id}", full=False)
        shot("usage", f"/usage?session={fan.id}")
        shot("harness", "/harness")
        sha = page.locator("table#commits tbody tr", has_text="memory/chunk-sums").first.get_attribute("data-sha")
        shot("commit", f"/harness/c/{sha}")
        shot("evals", "/evals")
    srv.__exit__(None, None, None)
    print(f"{time.monotonic() - started:.1f} s")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/img"))
