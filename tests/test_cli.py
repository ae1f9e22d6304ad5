"""The command line as a user runs it: real processes, real files, real git."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import PRIMEFS, Output, cli


def assert_clean_error(r, *words):
    assert r.returncode != 0
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout
    line = r.stderr.strip()
    assert line.startswith("error:"), r.stderr
    for w in words:
        assert w in line, line


@pytest.fixture
def home(tmp_path):
    r = cli("init", "myws", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    root = tmp_path / "myws"
    (root / "script.yaml").write_text(
        "rules:\n"
        "  - match: largest\n"
        "    replies:\n"
        "      - code: \"import os\\nprint(len(os.listdir('/usr/share')) > 0)\"\n"
        "      - text: \"Three files: a, b, c.\"\n"
        "default:\n"
        "  - text: \"ok\"\n")
    return root


def test_init_layout_git_and_refusal(tmp_path):
    r = cli("init", "w", cwd=tmp_path)
    assert r.returncode == 0
    root = tmp_path / "w"
    for p in ("primefs.yaml", "AGENTS.md", ".gitignore", "goals", "sessions", "plugins",
              "harness/notes", "harness/memory", "harness/skills", "harness/agents"):
        assert (root / p).exists(), p
    log = subprocess.run(["git", "-C", str(root), "log", "--oneline"], capture_output=True, text=True).stdout
    assert len(log.splitlines()) == 1
    assert "mail/tmp" in (root / ".gitignore").read_text()
    again = cli("init", "w", cwd=tmp_path)
    assert_clean_error(again, "already a primefs workspace")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x.txt").write_text("mine")
    assert_clean_error(cli("init", "full", cwd=tmp_path), "not empty")


def test_goal_run_status_log_usage(home):
    r = cli("goal", "Find the three largest files under /usr/share and report their sizes",
            "--model", "scripted/script.yaml", cwd=home / "goals")  # found from a subfolder
    assert r.returncode == 0, r.stderr
    goal_rel = r.stdout.strip()
    assert goal_rel.startswith("goals/") and (home / goal_rel).is_file()
    r = cli("run", "--once", cwd=home)
    assert r.returncode == 0, r.stderr
    assert "turn 1 ended" in r.stderr
    r = cli("status", "--json", cwd=home)
    records = json.loads(r.stdout)
    assert len(records) == 1
    rec = records[0]
    for key in ("id", "name", "parent", "depth", "status", "goal", "result", "usage", "tree_usage", "stop_reason"):
        assert key in rec
    assert rec["goal"] == goal_rel and rec["result"] == "Three files: a, b, c."
    assert rec["parent"] is None and rec["depth"] == 0 and rec["status"] == "idle"
    assert rec["name"] == Path(goal_rel).stem  # named after the goal file
    assert rec["usage"] == rec["tree_usage"] and rec["usage"]["calls"] == 2
    table = cli("status", cwd=home).stdout
    assert rec["id"] in table and "idle" in table
    r = cli("log", rec["id"], "--json", cwd=home)
    events = [json.loads(line) for line in r.stdout.splitlines()]
    assert all("ts" in e and "type" in e for e in events)
    assert {"task", "model_call", "assistant", "cell", "result", "status"} <= {e["type"] for e in events}
    readable = cli("log", rec["name"], cwd=home).stdout
    assert "task" in readable and "Three files" in readable and " output" in readable  # a cell is shown as its output
    u = json.loads(cli("usage", rec["id"], "--json", cwd=home).stdout)
    assert u["session"] == rec["id"] and u["own"] == u["tree"] == rec["usage"]
    assert set(u["own"]) >= {"calls", "input_tokens", "output_tokens", "cost_usd", "wall_s"}
    assert "own" in cli("usage", rec["id"], cwd=home).stdout
    # picked up exactly once, also across runner restarts
    assert cli("run", "--once", cwd=home).returncode == 0
    assert len(json.loads(cli("status", "--json", cwd=home).stdout)) == 1


def test_hand_written_goal_and_name_precedence(home):
    (home / "goals" / "by-hand.md").write_text("---\nmodel: scripted/script.yaml\n---\nlargest files please\n")
    (home / "goals" / "named.md").write_text("---\nname: fancy\nmodel: scripted/script.yaml\n---\nhi\n")
    cli("goal", "hello", "--name", "flagged", "--model", "scripted/script.yaml", cwd=home)
    assert cli("run", "--once", cwd=home).returncode == 0
    names = sorted(r["name"] for r in json.loads(cli("status", "--json", cwd=home).stdout))
    assert names == ["by-hand", "fancy", "flagged"]


def test_model_precedence(home, tmp_path):
    # goal front matter > primefs goal --model > $PRIMEFS_MODEL > primefs.yaml model
    (home / "other.yaml").write_text("- text: from-other\n")
    env = {"PRIMEFS_MODEL": "scripted/other.yaml"}
    (home / "goals" / "fm.md").write_text("---\nmodel: scripted/script.yaml\n---\nx\n")
    cli("goal", "y", "--name", "flag", "--model", "scripted/script.yaml", cwd=home, env=env)
    cli("goal", "z", "--name", "envgoal", cwd=home, env=env)
    assert cli("run", "--once", cwd=home, env=env).returncode == 0
    models = {r["name"]: r["model"] for r in json.loads(cli("status", "--json", cwd=home).stdout)}
    assert models == {"fm": "scripted/script.yaml", "flag": "scripted/script.yaml", "envgoal": "scripted/other.yaml"}
    cfg = home / "primefs.yaml"
    cfg.write_text(cfg.read_text().replace("model: local\n", "model: scripted/other.yaml\n", 1))
    cli("goal", "w", "--name", "cfg", cwd=home)
    cli("run", "--once", cwd=home)
    models = {r["name"]: r["model"] for r in json.loads(cli("status", "--json", cwd=home).stdout)}
    assert models["cfg"] == "scripted/other.yaml"


def test_workspace_from_flag_and_env(home, tmp_path):
    assert cli("status", "-w", str(home), cwd=tmp_path).returncode == 0
    assert cli("status", cwd=tmp_path, env={"PRIMEFS_WORKSPACE": str(home)}).returncode == 0
    assert_clean_error(cli("status", cwd=tmp_path), "not inside a primefs workspace")
    assert_clean_error(cli("status", "-w", str(tmp_path / "nope"), cwd=tmp_path), "no primefs workspace")


def test_bad_inputs_are_one_clear_line(home):
    assert_clean_error(cli("goal", "x", "--model", "no-such-alias", cwd=home), "unknown model", "no-such-alias")
    assert_clean_error(cli("goal", "x", "--context", "missing.txt", cwd=home), "context file not found")
    assert_clean_error(cli("goal", "x", "--name", "../escape", cwd=home), "invalid goal name")
    assert_clean_error(cli("goal", "  ", cwd=home), "empty")
    assert_clean_error(cli("log", "nobody", cwd=home), "no session")
    assert_clean_error(cli("usage", "nobody", cwd=home), "no session")


def test_output_the_machine_refuses_is_one_clear_line(home):
    """A full disk (/dev/full) under `status`, `status --json`, `models`: said in one line, exit 1; a closed pipe
    (`| head`) stays silent."""
    assert cli("goal", "Hello", "--name", "h", cwd=home).returncode == 0
    for args in (["status"], ["status", "--json"], ["models"]):
        with open("/dev/full", "w") as full:
            r = subprocess.run([*PRIMEFS, "-w", str(home), *args], stdout=full, stderr=subprocess.PIPE, text=True,
                               timeout=60)
        assert_clean_error(subprocess.CompletedProcess(args, r.returncode, "", r.stderr), "No space left on device")
    head = subprocess.Popen([*PRIMEFS, "-w", str(home), "status", "--json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    head.stdout.close()  # the reader is gone before anything is written
    assert head.wait(60) == 1 and head.stderr.read() == b""


def test_broken_goals_are_reported_and_others_still_run(home):
    goals = home / "goals"
    (goals / "broken.md").write_text("---\nmodel: [unclosed\nname: x\n---\ntask\n")
    (goals / "latin1.md").write_bytes("---\nname: l\n---\ncaf\xe9 \xff\n".encode("latin-1"))
    (goals / "alias.md").write_text("---\nmodel: nonexistent-alias\n---\ntask\n")
    (goals / "ctx.md").write_text("---\ncontext: [nowhere.txt]\nmodel: scripted/script.yaml\n---\ntask\n")
    (goals / "good.md").write_text("---\nmodel: scripted/script.yaml\n---\nlargest files\n")
    r = cli("run", "--once", cwd=home)
    assert r.returncode == 3 and "Traceback" not in r.stderr  # the good goal ran; the others were rejected
    for f in ("broken.md", "latin1.md", "alias.md", "ctx.md"):
        assert f"error: goal file rejected: goals/{f}" in r.stderr
    assert "goals/broken.md:3" in r.stderr  # file and line
    assert "goals/latin1.md" in r.stderr and "UTF-8" in r.stderr
    assert "nonexistent-alias" in r.stderr and "nowhere.txt" in r.stderr
    records = json.loads(cli("status", "--json", cwd=home).stdout)
    assert [x["name"] for x in records] == ["good"] and records[0]["result"] == "Three files: a, b, c."
    for f in ("broken.md", "latin1.md", "alias.md", "ctx.md"):
        assert (goals / f).exists()  # left where it is
    st = cli("status", cwd=home)
    assert "goals/broken.md:3" in st.stderr and "Traceback" not in st.stderr
    # fixing the file makes it run
    (goals / "broken.md").write_text("---\nmodel: scripted/script.yaml\nname: fixed\n---\ntask\n")
    cli("run", "--once", cwd=home)
    assert "fixed" in [x["name"] for x in json.loads(cli("status", "--json", cwd=home).stdout)]


def test_help_explains(home):
    r = cli("--help")
    assert r.returncode == 0 and "goal" in r.stdout and "run" in r.stdout
    for sub in ("init", "goal", "run", "status", "log", "usage"):
        assert cli(sub, "--help").returncode == 0


def test_second_runner_is_refused(home):
    import fcntl

    (home / ".primefs").mkdir(exist_ok=True)
    with open(home / ".primefs" / "runner.lock", "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert_clean_error(cli("run", "--once", cwd=home), "already running")


def test_goal_limit_overrides(home):
    r = cli("goal", "largest files", "--name", "lim", "--limit", "max_steps_per_turn=1", "--model",
            "scripted/script.yaml", cwd=home)
    assert r.returncode == 0, r.stderr
    assert "max_steps_per_turn: 1" in (home / "goals" / "lim.md").read_text()
    cli("run", "--once", cwd=home)
    rec = json.loads(cli("status", "--json", cwd=home).stdout)[0]
    assert rec["stop_reason"] == "max_steps" and rec["result"] is None
    assert_clean_error(cli("goal", "x", "--limit", "bogus=1", cwd=home), "bad --limit")
    assert_clean_error(cli("goal", "x", "--limit", "max_steps_per_turn=lots", cwd=home), "not a number")


def test_example_workspace_is_ready(tmp_path):
    from primefs.store.goals import goal_files, parse_goal
    from primefs.harness.entries import Harness
    from primefs.store.workspace import Workspace

    example = Path(__file__).resolve().parent.parent / "example_workspace"
    r = cli("init", "--from", str(example), "ex", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    ws = Workspace(tmp_path / "ex")
    entries = Harness(ws).list()
    assert sorted((e.kind, e.name) for e in entries) == sorted(
        [("note", "answer-style"), ("memory", "python-arithmetic"), ("skill", "word-stats"), ("agent", "checker")])
    assert not [e for e in entries if e.problem]
    goal = parse_goal(ws, goal_files(ws)[0])
    assert goal.name == "demo" and goal.limits == {"max_steps_per_turn": 4} and goal.model == "local-demo"
    demo = ws.resolve_model("local-demo")  # the embedded model, its first reply held to a grammar
    assert demo["model"] == "local/smollm2" and demo["tool_mode"] == "fenced" and "root ::=" in demo["first_reply_grammar"]
    clean = subprocess.run(["git", "-C", str(ws.root), "status", "--porcelain"], capture_output=True, text=True)
    assert clean.stdout == ""


def test_log_follow_streams_appended_events(home):
    import signal
    import time

    cli("goal", "largest", "--name", "f", "--model", "scripted/script.yaml", cwd=home)
    cli("run", "--once", cwd=home)
    sid = json.loads(cli("status", "--json", cwd=home).stdout)[0]["id"]
    for args in ((), ("--json",)):
        proc = subprocess.Popen([*PRIMEFS, "log", "f", "-f", *args], cwd=home, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        shown, said = Output(proc.stdout), Output(proc.stderr)
        shown.wait("Three files")  # what was there is shown; then it follows
        with open(home / "sessions" / sid / "history.jsonl", "a") as f:
            f.write(json.dumps({"ts": time.time(), "type": "notice", "n": 999, "text": f"late news {len(args)}"}) + "\n")
        shown.wait(f"late news {len(args)}")
        proc.send_signal(signal.SIGINT)
        proc.wait(10)
        said.thread.join(10)
        assert "Traceback" not in said.text


def test_an_unreachable_ray_cluster_is_a_clear_error_at_once(tmp_path):
    pytest.importorskip("ray")
    assert subprocess.run([*PRIMEFS, "init", str(tmp_path / "ws")], capture_output=True).returncode == 0
    for address, why in (("nosuchhost.invalid:6379", "it does not resolve"), ("127.0.0.1:1", "Connection refused"),
                         ("no-port", "is not HOST:PORT")):
        r = subprocess.run([*PRIMEFS, "-w", str(tmp_path / "ws"), "run", "--once", "--ray", address],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 1 and why in r.stderr and "Traceback" not in r.stderr, r.stderr
