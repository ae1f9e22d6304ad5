"""The Python API and the OpenAI-compatible endpoint against `primefs ask`, with a resident runner.

One workspace, one runner (`primefs run`), an instant scripted model (one cell, then the answer). Each
round runs the same goal four ways, interleaved so that drift hits all alike:

- direct: a goal file written, until its result.md exists (the runner's own time);
- cli: `primefs ask "..."` as a process (its start-up included, as a user pays it);
- api: `ws.ask("...")` in this process;
- endpoint: one chat completion through the `openai` client against `primefs serve --openai`.

Each way's overhead: its wall time minus the runner's part of it (the goal file's mtime to the session's
`turn_end`), so the noise of the runner's own time (the goal settling, the turn) drops out.

Then 20 concurrent endpoint requests: all answered, each its own session, each with its tree's exact usage.

    python bench/api.py [ROUNDS]
"""
from __future__ import annotations

import concurrent.futures
import json
import re
import statistics
import subprocess
import sys
import time

from common import configure_model, scripted_workspace

import primefs
from primefs.api.sessions import ended
from primefs.index.accounting import UsageIndex
from primefs.store.session import list_sessions

SCRIPT = """\
default:
  - code: "y = 6 * 7"
  - text: "42"
"""
PRIMEFS = [sys.executable, "-m", "primefs"]


def median_ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1000, 1)


def main(rounds: int = 10) -> dict:
    import openai

    store = scripted_workspace(SCRIPT)
    configure_model(store, {"model": "scripted/script.yaml"})  # the alias `bench`, the default model too
    runner = subprocess.Popen([*PRIMEFS, "-w", str(store.root), "run", "--quiet"])
    serve = subprocess.Popen([*PRIMEFS, "-w", str(store.root), "serve", "--openai", "--port", "0"],
                             stdout=subprocess.PIPE, text=True)
    try:
        line = ""
        while "api_key" not in line:
            line += serve.stdout.readline()
        base, token = re.search(r"base_url (\S+), api_key (\S+)", line).groups()
        client = openai.OpenAI(base_url=base, api_key=token, max_retries=0, timeout=300)
        ws = primefs.Workspace(store.root)
        times: dict[str, list[float]] = {"direct": [], "cli": [], "api": [], "endpoint": []}
        overheads: dict[str, list[float]] = {k: [] for k in times}

        def direct(i):
            (store.goals / f"d{i}.md").write_text("Quick question\n")
            while True:
                done = [s for s in list_sessions(store.sessions) if s.meta.get("goal") == f"goals/d{i}.md"
                        and ended(s)]
                if done:
                    return done[0].id
                time.sleep(0.002)

        def cli(i):
            r = subprocess.run([*PRIMEFS, "-w", str(store.root), "ask", "Quick question", "--json"],
                               capture_output=True, text=True)
            out = json.loads(r.stdout)
            assert out["result"] == "42", r.stderr
            return out["session"]

        def api(i):
            r = ws.ask("Quick question")
            assert r.answer == "42"
            return r.session_id

        def endpoint(i):
            r = client.chat.completions.create(model="primefs/bench",
                                               messages=[{"role": "user", "content": "Quick question"}])
            assert r.choices[0].message.content == "42"
            return r.model_extra["primefs"]["session"]

        def runner_time(sid: str) -> float:
            """From its goal file's mtime to its turn_end: the part that is the runner's, the same each way."""
            s = next(s for s in list_sessions(store.sessions) if s.id == sid)
            end = [e["ts"] for e in s.events("turn_end")][-1]
            return end - (store.root / s.meta["goal"]).stat().st_mtime

        ways = {"direct": direct, "cli": cli, "api": api, "endpoint": endpoint}
        for name, way in ways.items():  # warm: kernels, imports, the index
            way(-1 - len(name))
        for i in range(rounds):
            for name, way in ways.items():
                started = time.time()
                sid = way(i)
                took = time.time() - started
                times[name].append(took)
                overheads[name].append(took - runner_time(sid))
        started = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(20) as pool:
            replies = list(pool.map(lambda i: client.chat.completions.create(
                model="primefs/bench", messages=[{"role": "user", "content": f"Quick question {i}"}]), range(20)))
        concurrent_s = time.monotonic() - started
        index = UsageIndex(store.sessions)
        sids = {r.model_extra["primefs"]["session"] for r in replies}
        exact = all((r.usage.prompt_tokens, r.usage.completion_tokens) ==
                    (index.tree(r.model_extra["primefs"]["session"])["input_tokens"],
                     index.tree(r.model_extra["primefs"]["session"])["output_tokens"]) for r in replies)
        med = {k: median_ms(v) for k, v in times.items()}
        over = {k: median_ms(v) for k, v in overheads.items()}
        return {"rounds": rounds, "median_ms": med, "overhead_median_ms": over,
                "api_over_cli_ms": round(over["api"] - over["cli"], 1),
                "endpoint_over_api_ms": round(over["endpoint"] - over["api"], 1),
                "concurrent_20": {"answered": sum(r.choices[0].message.content == "42" for r in replies),
                                  "sessions": len(sids), "usage_exact": exact, "wall_s": round(concurrent_s, 2)}}
    finally:
        serve.terminate()
        runner.terminate()
        serve.wait(30)
        runner.wait(30)


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]) if len(sys.argv) > 1 else 10)))
