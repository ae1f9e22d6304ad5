"""primefs eval: direct and both modes, reports, reruns, file: benchmarks, plugins found from the workspace.

Real runs through the CLI (real workspaces, runner, kernels); only the model's replies are scripted.
"""
from __future__ import annotations

import json

import pytest
from test_eval import BENCH_PLUGIN, cli, rows

from primefs.eval.items import score_contains, score_exact, score_f1_set, score_number
from primefs.store.frontmatter import load_yaml
from primefs.store.history import iter_events

# The RLM sessions answer lucky-mirror's number (right for needle item 0 of seed 0); the direct
# prompt (it holds the context between <context> tags) gets a wrong number.
SCRIPT = """\
rules:
  - match: "<context>"
    replies:
      - text: "lucky-mirror: 1111111"
default:
  - code: "print(len(context))"
  - text: "lucky-mirror: 9616116"
"""


@pytest.fixture(scope="module")
def both_run(tmp_path_factory):
    """One `--mode both` run shared by the tests that only read it."""
    d = tmp_path_factory.mktemp("both")
    (d / "script.yaml").write_text(SCRIPT)
    (d / "eval.yaml").write_text(f"model: scripted/{d / 'script.yaml'}\nmode: both\nlimits: {{cell_timeout_s: 30}}\n")
    r = cli("eval", "needle", "--config", "eval.yaml", "-n", "2", "--out", "run", cwd=d)
    assert r.returncode == 0, r.stderr
    return d, r


def test_both_modes_run_the_same_items_and_account_direct_calls(both_run):
    d, r = both_run
    got = rows(d / "run")
    assert [(x["id"], x["mode"]) for x in got] == [("needle-0-0", "rlm"), ("needle-0-1", "rlm"),
                                                   ("needle-0-0", "direct"), ("needle-0-1", "direct")]
    assert got[0]["item_sha"] == got[2]["item_sha"] and got[1]["item_sha"] == got[3]["item_sha"]
    assert [x["score"] for x in got] == [1.0, 0.0, 0.0, 0.0]
    summary = json.loads((d / "run" / "summary.json").read_text())
    assert summary["items"] == 2 and summary["by_mode"]["rlm"]["mean_score"] == 0.5
    assert summary["by_mode"]["direct"]["total"]["calls"] == 2
    assert "rlm total" in r.stdout and "direct total" in r.stdout
    ws = d / "run" / "workspace"
    for x in got[2:]:
        assert x["calls"] == 1 and x["stop_reason"] == "answered" and x["answer"] == "lucky-mirror: 1111111"
        assert x["context_sent_chars"] == x["context_chars"] > 30000 and x["cut_chars"] == 0
        sdir = ws / "sessions" / x["session"]
        meta = load_yaml(sdir / "session.yaml")
        assert meta["eval_mode"] == "direct" and meta["name"] == f"{x['id']}.direct"
        calls = [e for e in iter_events(sdir / "history.jsonl") if e["type"] == "model_call"]
        assert len(calls) == 1 and calls[0]["input_tokens"] == x["input_tokens"]
        assert "<context>" in (sdir / "prompt.txt").read_text()
        assert not (sdir / "kernel").exists()  # no kernel for a direct item
    usage = cli("usage", "needle-0-0.direct", "--json", "-w", str(ws), cwd=d)
    assert usage.returncode == 0, usage.stderr
    assert json.loads(usage.stdout)["tree"]["input_tokens"] == got[2]["input_tokens"]


def test_direct_mode_cuts_the_context_to_the_window(tmp_path):
    (tmp_path / "script.yaml").write_text(SCRIPT)
    (tmp_path / "eval.yaml").write_text(
        f"model: small\nmodels: {{small: {{model: scripted/{tmp_path / 'script.yaml'}, context_window: 2000, "
        "max_tokens: 200}}\nmode: direct\nn: 1\n")
    r = cli("eval", "needle", "--config", "eval.yaml", "--out", "run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    (x,) = rows(tmp_path / "run")
    assert x["mode"] == "direct" and x["window_tokens"] == 2000
    assert x["cut_chars"] == x["context_chars"] - x["context_sent_chars"] > 25000
    prompt = (tmp_path / "run" / "workspace" / "sessions" / x["session"] / "prompt.txt").read_text()
    assert "characters cut]" in prompt and len(prompt) < 2000 * 3
    assert x["input_tokens"] < 2000 - 200  # what the model was sent fits its window


def test_report_table_and_plots(both_run, tmp_path):
    d, _ = both_run
    r = cli("eval", "report", str(d / "run"), "--out", str(tmp_path / "rep"), cwd=d)
    assert r.returncode == 0, r.stderr
    assert "| needle | scripted/script.yaml | rlm | 2 | 0.500 (0.00-1.00) |" in r.stdout and "| 0 of 2 |" in r.stdout
    assert "| needle | scripted/script.yaml | direct | 2 | 0.000 (0.00-0.00) |" in r.stdout
    md = (tmp_path / "rep" / "report.md").read_text()
    for png in ("score_vs_tokens.png", "score_vs_cost.png", "score_vs_context.png"):
        assert (tmp_path / "rep" / png).read_bytes()[:4] == b"\x89PNG" and f"({png})" in md
    js = json.loads(cli("eval", "report", str(d / "run"), "--out", str(tmp_path / "rep2"), "--json", cwd=d).stdout)
    assert {(t["mode"], t["items"], t["mean_score"]) for t in js["table"]} == {("rlm", 2, 0.5), ("direct", 2, 0.0)}
    # RLM minus direct on the same two items: +1 and 0, mean +0.5; the paper-form table beside it.
    assert "| needle | scripted/script.yaml | 2 | +0.500 (-5.85 to +6.85) |" not in r.stdout  # clipped to -1..1
    assert "| needle | scripted/script.yaml | 2 | +0.500 (-1.00 to +1.00) | 1 | 0 |" in r.stdout
    assert js["paired"] == [{"benchmark": "needle", "model": "scripted/script.yaml", "pairs": 2,
                             "rlm_minus_direct": 0.5, "ci95": [-1.0, 1.0], "rlm_better": 1, "direct_better": 0}]
    assert "| model · mode | needle |" in r.stdout and "| scripted/script.yaml · rlm | 50.0 ($0.0000) |" in r.stdout
    assert "## RLM minus direct, on the same items" in md and "## Benchmark x mode" in md
    assert "not an eval run folder" in cli("eval", "report", str(tmp_path), cwd=d).stderr


def test_rerun_records_resolved_settings_without_secrets_and_says_what_differs(tmp_path):
    assert cli("init", "ws", cwd=tmp_path).returncode == 0
    script = tmp_path / "ws" / "script.yaml"  # script files must be inside the workspace
    script.write_text(SCRIPT)
    conf = (tmp_path / "ws" / "primefs.yaml").read_text().replace(
        "models:\n", f"models:\n  s:\n    model: scripted/{script}\n    temperature: 0.1\n"
                     "    api_key: sekr\n    extra_headers: {Authorization: Bearer sekrit-456}\n", 1)
    (tmp_path / "ws" / "primefs.yaml").write_text(conf)
    r = cli("eval", "needle", "-w", "ws", "-m", "s", "-n", "1", "--out", "run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    recorded = (tmp_path / "run" / "config.yaml").read_text()
    assert "sekr" not in recorded
    record = load_yaml(tmp_path / "run" / "config.yaml")
    assert record["model_settings"] == {"model": f"scripted/{script}", "temperature": 0.1,
                                        "extra_headers": {}, "tool_mode": "native"}
    assert "models.s.api_key" in record["removed_keys"] and record["resolved_models"]["local"]["model"] == "local"
    assert record["versions"]["primefs"] == "0.1.0" and record["versions"]["litellm"]
    assert record["benchmark_source"]["distribution"] == "primefs-needle" and record["benchmark_source"]["version"]
    same = cli("eval", "--rerun", "run", "--out", "again", cwd=tmp_path)
    assert same.returncode == 0, same.stderr
    for line in ("versions: same", "settings: same", "items: same", "scores: same"):
        assert line in same.stdout
    (tmp_path / "ws" / "primefs.yaml").write_text(conf.replace("temperature: 0.1", "temperature: 0.5"))
    script.write_text(SCRIPT.replace("9616116", "2222222"))
    changed = cli("eval", "--rerun", "run", "--out", "changed", "--json", cwd=tmp_path)
    diff = json.loads(changed.stdout)["differences"]
    assert diff["settings"] == ["model.temperature: 0.1 -> 0.5", "models.s.temperature: 0.1 -> 0.5"]
    assert diff["scores"][0] == "needle-0-0 (rlm): 1 -> 0" and diff["items"] == []
    assert "--rerun takes its settings" in cli("eval", "needle", "--rerun", "run", cwd=tmp_path).stderr


ITEMS = [
    {"id": "a", "task": "What colour?", "context": "The sky is blue.", "expected": "blue"},
    {"id": 2, "task": "How many?", "context_file": "ctx/two.txt", "expected": ["twelve", "12"]},
    {"id": "c", "task": "Which fruits?", "expected": ["apple", "pear"]},
]


def write_items(folder, items=ITEMS, extra_lines=()):
    (folder / "ctx").mkdir(exist_ok=True)
    (folder / "ctx" / "two.txt").write_text("a dozen: " + "x" * 5000)
    lines = [json.dumps(i) for i in items] + list(extra_lines)
    (folder / "items.jsonl").write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("scorer", ["exact", "contains", "f1-set"])
def test_file_benchmark_oracle(tmp_path, scorer):
    write_items(tmp_path)
    r = cli("eval", "file:items.jsonl", "--oracle", "--scorer", scorer, "--out", "o", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    got = rows(tmp_path / "o")
    assert [x["id"] for x in got] == ["a", "2", "c"] and all(x["score"] == 1.0 for x in got)
    assert got[1]["context_chars"] == 5009
    record = load_yaml(tmp_path / "o" / "config.yaml")
    assert record["scorer"] == scorer and len(record["benchmark_source"]["sha256"]) == 64


def test_file_benchmark_run_with_a_context_file(tmp_path):
    write_items(tmp_path)
    (tmp_path / "script.yaml").write_text("default:\n  - code: \"print(context[:8])\"\n  - text: \"It is 12, I think\"\n")
    r = cli("eval", "file:items.jsonl", "-m", f"scripted/{tmp_path / 'script.yaml'}", "--scorer", "number",
            "--items", "2", "--out", "run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    got = rows(tmp_path / "run")
    assert [(x["id"], x["score"]) for x in got] == [("a", 0.0), ("2", 1.0)]
    sdir = tmp_path / "run" / "workspace" / "sessions" / got[1]["session"]
    assert (sdir / "context.txt").read_text().startswith("a dozen: ")
    cells = [e for e in iter_events(sdir / "history.jsonl") if e["type"] == "cell"]
    assert cells[0]["output"].strip() == "a dozen:"


@pytest.mark.parametrize("lines, args, message", [
    (['{"id": "x", "task": "t", "expected": 1}', '{"id": "y", "task": "t",'], [],
     "items.jsonl:2: not valid JSON"),
    (['{"id": "x", "task": "t", "expected": 1, "context_file": "nope.txt"}'], [],
     "items.jsonl:1: context_file 'nope.txt' not found"),
    (['{"id": "x", "task": "t"}'], [], "items.jsonl:1: missing expected"),
    (['{"id": "x", "task": "t", "expected": 1}', '', '{"id": "x", "task": "u", "expected": 2}'], [],
     "items.jsonl:3: id 'x' already used on line 1"),
    (['{"id": "x", "task": "t", "expected": 1}'], ["--scorer", "zz"], "unknown scorer 'zz' (known: exact, contains"),
    (['{"id": "x", "task": "t", "expected": 1}'], ["--param", "chars=9"], "takes no parameter 'chars'"),
])
def test_file_benchmark_bad_input_is_one_line(tmp_path, lines, args, message):
    (tmp_path / "items.jsonl").write_text("\n".join(lines) + "\n")
    r = cli("eval", "file:items.jsonl", "--oracle", *args, cwd=tmp_path)
    assert r.returncode == 1 and message in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_plugins_of_the_current_workspace_and_where_an_unknown_benchmark_was_looked_for(tmp_path):
    assert cli("init", "ws", cwd=tmp_path).returncode == 0
    (tmp_path / "ws" / "plugins" / "wsbench.py").write_text(BENCH_PLUGIN.format(name="tiny-workspace"))
    assert cli("trust", "--all", cwd=tmp_path / "ws").returncode == 0
    (tmp_path / "ws" / "sub").mkdir()
    r = cli("eval", "tiny-workspace", "--oracle", "-n", "2", "--out", str(tmp_path / "o"), cwd=tmp_path / "ws" / "sub")
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "o" / "summary.json").read_text())["mean_score"] == 1.0
    r = cli("eval", "--list", "--json", cwd=tmp_path, env={"PRIMEFS_WORKSPACE": str(tmp_path / "ws")})
    assert "tiny-workspace" in {b["name"] for b in json.loads(r.stdout)}
    r = cli("eval", "nosuch", "--oracle", cwd=tmp_path / "ws")
    assert r.returncode == 1 and f"{tmp_path / 'ws' / 'plugins'}/*.py" in r.stderr and "found from" in r.stderr
    r = cli("eval", "nosuch", "--oracle", cwd=tmp_path)
    assert "no workspace found from" in r.stderr and "PRIMEFS_WORKSPACE is not set" in r.stderr


def test_needle_at_ten_million_characters_through_the_cli(tmp_path):
    r = cli("eval", "needle", "--oracle", "-n", "1", "--param", "chars=10000000", "--param", "keys=2", "--out", "o",
            cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    (x,) = rows(tmp_path / "o")
    assert x["score"] == 1.0 and abs(x["context_chars"] - 10_000_000) < 1000 and len(x["expected"]) == 2
    assert load_yaml(tmp_path / "o" / "config.yaml")["params"] == {"chars": 10000000, "keys": 2}


@pytest.mark.parametrize("fn, answer, expected, score", [
    (score_exact, " Blue. ", "blue", 1.0), (score_exact, "blue sky", "blue", 0.0), (score_exact, "12", ["twelve", "12"], 1.0),
    (score_contains, "I think it is BLUE", "blue", 1.0), (score_contains, "green", ["blue", "navy"], 0.0),
    (score_number, "about 1,234 of them", 1234, 1.0), (score_number, "3 then 4", "4", 1.0), (score_number, "4.5", 4, 0.0),
    (score_number, "none", 1, 0.0),
    (score_f1_set, "apple\npear", ["pear", "apple"], 1.0), (score_f1_set, "- apple\n- fig", ["apple", "pear"], 0.5),
    (score_f1_set, '["apple", "pear"]', ["apple", "pear"], 1.0), (score_f1_set, "", [], 1.0),
])
def test_scorers(fn, answer, expected, score):
    assert fn(answer, expected) == pytest.approx(score)


def test_eval_inside_a_workspace_sees_its_aliases_and_a_mistake_leaves_no_run_folder(tmp_path):
    assert cli("init", "ws", cwd=tmp_path).returncode == 0
    (tmp_path / "ws" / "script.yaml").write_text(SCRIPT)
    conf = (tmp_path / "ws" / "primefs.yaml").read_text().replace("models:\n", "models:\n  stub:\n"
                                                                     "    model: scripted/script.yaml\n", 1)
    (tmp_path / "ws" / "primefs.yaml").write_text(conf)
    r = cli("eval", "needle", "-m", "stub", "-n", "1", "--out", str(tmp_path / "run"), cwd=tmp_path / "ws")
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["mean_score"] == 1.0
    bad = cli("eval", "needle", "-m", "nosuch", "-n", "1", "--out", str(tmp_path / "bad"), cwd=tmp_path / "ws")
    assert bad.returncode == 1 and "unknown model 'nosuch'" in bad.stderr and "stub" in bad.stderr
    assert not (tmp_path / "bad").exists()
