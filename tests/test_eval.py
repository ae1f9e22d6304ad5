"""primefs eval: oracle runs, scripted runs with exact per-item tree usage, budgets, plugin discovery."""
from __future__ import annotations

import json
import subprocess
import textwrap

import pytest
from conftest import cli as primefs_cli

from primefs.store.history import iter_events

PLUGINS = {"PRIMEFS_LOAD_PLUGINS": "1"}  # the benchmarks come from plugins (the suite loads none by default)


def cli(*args, env=None, **kw):
    return primefs_cli(*args, env={**PLUGINS, **(env or {})}, **{"timeout": 300, **kw})


def rows(out):
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("bench", ["needle", "aggregate", "aggregate-inferred", "pairs", "pairs-inferred"])
def test_oracle_scores_one(tmp_path, bench):
    r = cli("eval", bench, "--oracle", "--n", "3", "--seed", "7", "--out", "o", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["mean_score"] == 1.0 and summary["items"] == 3
    assert all(x["score"] == 1.0 for x in rows(tmp_path / "o"))
    assert "mean score 1.000" in r.stdout


SCRIPT = """\
rules:
  - match: "^sub"
    replies:
      - text: "child answer"
default:
  - code: "h = rlm('sub task', context=context[:50])\\nprint(h.wait())"
  - text: "lucky-mirror: 9616116"
"""


def tree_usage(ws_root, sid):
    sessions = {p.name: p for p in (ws_root / "sessions").iterdir() if (p / "session.yaml").is_file()}
    from primefs.store.frontmatter import load_yaml

    parents = {k: load_yaml(p / "session.yaml").get("parent") for k, p in sessions.items()}
    tree, stack = [], [sid]
    while stack:
        x = stack.pop()
        tree.append(x)
        stack.extend(k for k, v in parents.items() if v == x)
    calls = [e for x in tree for e in iter_events(sessions[x] / "history.jsonl") if e["type"] == "model_call"]
    return len(calls), sum(e["input_tokens"] for e in calls), sum(e["output_tokens"] for e in calls), len(tree)


def test_scripted_run_records_exact_tree_usage_per_item(tmp_path):
    (tmp_path / "script.yaml").write_text(SCRIPT)
    (tmp_path / "eval.yaml").write_text(f"model: scripted/{tmp_path / 'script.yaml'}\nn: 2\nseed: 0\nconcurrency: 2\n"
                                        "limits: {cell_timeout_s: 30}\n")
    r = cli("eval", "needle", "--config", "eval.yaml", "--out", "run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "run"
    got = rows(out)
    assert [x["score"] for x in got] == [1.0, 0.0]  # item 0 asks for lucky-mirror (seed 0); item 1 does not
    for x in got:
        calls, tin, tout, n_sessions = tree_usage(out / "workspace", x["session"])
        assert n_sessions == 2 and (x["calls"], x["input_tokens"], x["output_tokens"]) == (calls, tin, tout) == \
            (3, x["input_tokens"], x["output_tokens"])
        assert x["stop_reason"] == "answered" and x["expected"] and x["answer"] == "lucky-mirror: 9616116"
    cfg = (out / "config.yaml").read_text()
    assert "primefs_version: 0.1.0" in cfg and "workspace_commit:" in cfg and "seed: 0" in cfg
    summary = json.loads((out / "summary.json").read_text())
    assert summary["mean_score"] == 0.5 and summary["total"]["calls"] == 6
    # the context went to a file for the kernel, never into the task text
    for x in got:
        sdir = out / "workspace" / "sessions" / x["session"]
        context = (sdir / "context.txt").read_text()
        assert len(context) > 30000 and "9616116" not in (sdir / "task.md").read_text()


def test_budget_stops_items_and_the_run_goes_on(tmp_path):
    (tmp_path / "script.yaml").write_text(SCRIPT)
    (tmp_path / "eval.yaml").write_text(f"model: scripted/{tmp_path / 'script.yaml'}\nn: 2\nbudget: {{tokens: 5}}\n")
    r = cli("eval", "needle", "--config", "eval.yaml", "--out", "b", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    got = rows(tmp_path / "b")
    assert all(x["score"] == 0.0 and x["stop_reason"] == "budget:tokens" for x in got)


def test_bad_eval_input(tmp_path):
    r = cli("eval", "nosuch", "--oracle", cwd=tmp_path)
    assert r.returncode == 1 and "unknown benchmark 'nosuch'" in r.stderr
    (tmp_path / "bad.yaml").write_text("n: -3\n")
    assert "positive integer" in cli("eval", "needle", "--config", "bad.yaml", cwd=tmp_path).stderr
    (tmp_path / "bad2.yaml").write_text("colour: blue\n")
    assert "unknown key(s) colour" in cli("eval", "needle", "--config", "bad2.yaml", cwd=tmp_path).stderr


BENCH_PLUGIN = '''
from primefs import hookimpl

class Tiny:
    name = "{name}"
    description = "a tiny test benchmark"
    def items(self, n, seed):
        for i in range(n):
            yield {{"id": f"tiny-{{seed}}-{{i}}", "task": "Say {{i}}", "context": str(i), "expected": str(i)}}
    def score(self, answer, expected):
        return 1.0 if (answer or "").strip() == expected else 0.0
    def oracle(self, item):
        return item["context"]

@hookimpl
def register_benchmarks(register):
    register(Tiny())
'''


def test_plugins_from_a_package_and_from_the_workspace_folder(tmp_path):
    # an installed distribution: a module plus dist-info metadata with an entry point in group primefs
    site = tmp_path / "site"
    (site / "tinybench-0.1.dist-info").mkdir(parents=True)
    (site / "tinybench.py").write_text(BENCH_PLUGIN.format(name="tiny-package"))
    (site / "tinybench-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: tinybench\nVersion: 0.1\n")
    (site / "tinybench-0.1.dist-info" / "entry_points.txt").write_text("[primefs]\ntinybench = tinybench\n")
    assert cli("init", "ws", cwd=tmp_path).returncode == 0
    (tmp_path / "ws" / "plugins" / "wsbench.py").write_text(BENCH_PLUGIN.format(name="tiny-workspace"))
    assert cli("trust", "plugins/wsbench.py", cwd=tmp_path / "ws").returncode == 0
    r = cli("eval", "--list", "-w", "ws", cwd=tmp_path, env={**PLUGINS, "PYTHONPATH": str(site)})
    assert "tiny-package: a tiny test benchmark" in r.stdout and "tiny-workspace: a tiny test benchmark" in r.stdout
    r = cli("eval", "tiny-workspace", "--oracle", "-w", "ws", "--n", "2", "--out", "t", cwd=tmp_path)
    assert r.returncode == 0 and json.loads((tmp_path / "t" / "summary.json").read_text())["mean_score"] == 1.0
    assert textwrap.dedent("x") == "x"


def test_refine_on_in_the_eval_config(tmp_path):
    script = SCRIPT.replace('rules:\n', 'rules:\n  - match: "^You refine"\n    replies:\n      - text: \'{"edits": '
                            '[{"op": "create", "kind": "note", "name": "tip", "body": "Read context first.", '
                            '"expected_effect": "fewer steps"}]}\'\n', 1)
    (tmp_path / "script.yaml").write_text(script)
    (tmp_path / "eval.yaml").write_text(f"model: scripted/{tmp_path / 'script.yaml'}\nn: 1\nrefine: true\n")
    r = cli("eval", "needle", "--config", "eval.yaml", "--out", "r", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    log = subprocess.run(["git", "-C", str(tmp_path / "r" / "workspace"), "log", "--format=%s%n%b"],
                         capture_output=True, text=True).stdout
    assert "harness(note/tip): add" in log and "Primefs-Source: refine" in log
