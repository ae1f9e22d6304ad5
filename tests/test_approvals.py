"""Approvals (docs/long-running.md, "Approvals"): a session waits for a person's yes before a cell matching
`approve.cells`, a tool of `approve.tools`, a child past `approve.children` or a cost mark, with its slot
free; the person answers from the CLI (here), attach or the web view (test_web_browser.py); the answer is
recorded, committed, and a denial is the model's error. Real: a runner, kernels, git, the CLI."""
from __future__ import annotations

import getpass
import json
import shutil
from pathlib import Path

import git
import pytest
from conftest import BackgroundRunner, cli, configure, wait_for

from primefs.store import approvals, trust
from primefs.store.frontmatter import dump_yaml, load_yaml
from primefs.store.goals import write_goal
from primefs.store.session import list_sessions

HERE = Path(__file__).parent
SHELL = "import subprocess\nprint(subprocess.run(['echo', 'from the shell'], capture_output=True, text=True).stdout)"


def script(*steps, **more) -> str:
    """The replies of a session whose task is none of `more`'s words; more: word=[its replies]."""
    return json.dumps({"rules": [{"match": word, "replies": replies} for word, replies in more.items()],
                       "default": list(steps)})


def session(ws, name):
    return wait_for(lambda: next((s for s in list_sessions(ws.sessions) if s.name == name), None), 30, name)


def waiting(s, n=1):
    return wait_for(lambda: s.reload().get("approval") == n, 30, f"{s.name} waiting for approval {n}")


def answered(s, n=1):
    return wait_for(lambda: next((e for e in s.events("approval") if e["approval"] == n), None), 30,
                    f"approval {n} of {s.name} answered")


@pytest.fixture
def gated(ws, scripted, monkeypatch):
    """A workspace whose policy gates cells that use subprocess, the tool api_lookup, a second child."""
    def setup(*steps, tools=None, kid=None, hello=None, **policy):
        ws2 = scripted(script(*steps, **{k: v for k, v in (("kid", kid), ("hello", hello)) if v}))
        monkeypatch.setenv("PRIMEFS_LOAD_PLUGINS", "1")
        shutil.copy(HERE / "tool_plugin.py", ws2.plugins / "mytools.py")
        trust.trust(ws2, ["plugins/mytools.py"])
        return configure(ws2, approve={"cells": ["subprocess"], **({"tools": tools} if tools else {}), **policy})
    return setup


def test_a_cell_waits_for_a_yes_from_the_cli_with_its_slot_free(gated):
    ws = configure(gated({"code": SHELL}, {"text": "ran it"}, hello=[{"text": "hello"}]),
                   limits={"max_concurrent_sessions": 1})
    write_goal(ws, "Use the shell", name="shell")
    with BackgroundRunner(ws):
        s = session(ws, "shell")
        waiting(s)
        write_goal(ws, "Say hello", name="other")  # one slot, and it is free while the shell waits
        wait_for(lambda: session(ws, "other").read_result() == "hello", 30, "the other session's answer")
        [row] = [r for r in json.loads(cli(ws, "status", "--json").stdout) if r["name"] == "shell"]
        assert (row["status"], row["approval"]) == ("running", 1)
        assert "waiting: approval 1" in cli(ws, "status").stdout
        [req] = json.loads(cli(ws, "approvals", "--json").stdout)
        assert (req["session"], req["n"], req["kind"], req["status"]) == (s.id, 1, "cell", "waiting")
        assert "subprocess.run" in (s.dir / "approvals" / "1.md").read_text()
        assert s.events("cell") == []  # nothing ran
        wait_for(lambda: s.id in json.loads((ws.state / "runner.json").read_text())["waiting_sessions"], 30,
                 "runner.json saying it waits")
        r = cli(ws, "approve", "shell", "1", "--reason", "fine")
        assert r.returncode == 0 and "approval 1 of shell" in r.stdout and "approved" in r.stdout, r.stderr
        wait_for(lambda: s.read_result() == "ran it", 30, "the turn's answer")
    [cell] = s.events("cell")
    assert cell["output"].strip() == "from the shell" and cell["error"] is None
    [event] = s.events("approval")
    assert (event["verdict"], event["by"], event["via"], event["reason"]) == ("approved", getpass.getuser(), "cli",
                                                                               "fine")
    meta, body = approvals.read(s.dir, 1)
    assert (meta["status"], meta["by"], meta["via"]) == ("approved", getpass.getuser(), "cli") and "## Answer" in body
    log = git.Repo(ws.root).git.log("--format=%B", "-n", "30")
    assert f"approval 1 approved by {getpass.getuser()}" in log
    assert s.reload().get("approval") is None


def test_a_denial_is_the_cells_error_and_a_late_answer_is_refused(gated, tmp_path):
    mark = tmp_path / "made"
    ws = gated({"code": f"import subprocess\nsubprocess.run(['touch', {str(mark)!r}])"}, {"text": "could not"})
    write_goal(ws, "Use the shell", name="shell")
    with BackgroundRunner(ws):
        s = session(ws, "shell")
        waiting(s)
        r = cli(ws, "deny", "shell", "--reason", "no shell today", "--json")  # N left out: the one waiting
        assert r.returncode == 0 and json.loads(r.stdout)["verdict"] == "denied", r.stderr
        wait_for(lambda: s.read_result() == "could not", 30, "the turn's answer")
        again = cli(ws, "approve", "shell", "1")
        assert again.returncode == 1 and "no longer waits: it was denied by" in again.stderr
        unknown = cli(ws, "approve", "shell", "7")
        assert unknown.returncode == 1 and "has no approval 7 (its approvals: 1)" in unknown.stderr
    [cell] = s.events("cell")
    assert "denied by" in cell["error"] and "no shell today" in cell["error"] and not mark.exists()
    assert "no shell today" in cell["shown"]  # what the model sees


def test_no_answer_within_the_timeout_is_the_default_verdict_and_the_hook_was_told(gated, tmp_path):
    asked = tmp_path / "asked.json"
    ws = configure(gated({"code": SHELL}, {"text": "done"}, timeout_s=0.5, default="deny"),
                   hooks={"approval_needed": f"cat > {asked}"})
    write_goal(ws, "Use the shell", name="shell")
    with BackgroundRunner(ws):
        s = session(ws, "shell")
        wait_for(lambda: s.read_result() == "done", 30, "the turn's answer")
        hook = wait_for(lambda: asked.exists() and asked.read_text() and json.loads(asked.read_text()), 30, "the hook")
    assert (hook["hook"], hook["session"], hook["event"]["type"]) == ("approval_needed", s.id, "approval_request")
    assert hook["event"]["what"] == "run a cell matching 'subprocess'" and hook["event"]["timeout_s"] == 0.5
    [event] = s.events("approval")
    assert (event["verdict"], event["by"], event["via"]) == ("denied", "timeout", "timeout")
    assert "no answer within 0.5 s (approve.default: deny)" in s.events("cell")[0]["error"]


def test_a_tool_and_a_child_past_the_limit_wait_too(gated):
    ws = gated({"code": "print(tools.api_lookup('k'))"},
               {"code": "h = rlm('kid one'); h2 = rlm('kid two'); print(h2.wait())"},
               {"text": "both"}, kid=[{"text": "kid"}], tools=["api_lookup"], children=1)
    write_goal(ws, "Look it up", name="top")
    with BackgroundRunner(ws):
        s = session(ws, "top")
        waiting(s, 1)
        assert approvals.read(s.dir, 1)[0]["kind"] == "tool"
        assert cli(ws, "approve", s.id).returncode == 0
        waiting(s, 2)
        assert approvals.read(s.dir, 2)[0]["kind"] == "children"
        assert len(json.loads(cli(ws, "status", "--json", "--all").stdout)) == 2  # the first child only
        assert cli(ws, "approve", s.id, "2").returncode == 0
        wait_for(lambda: s.read_result() == "both", 60, "the turn's answer")
    assert [e["verdict"] for e in s.events("approval")] == ["approved", "approved"]


def test_spending_past_a_cost_mark_asks_once_and_a_denial_stops_the_session(ws, scripted):
    ws = configure(scripted(script({"code": "print(1)", "cost_usd": 0.6}, {"code": "print(2)", "cost_usd": 0.6},
                                   {"code": "print(3)", "cost_usd": 0.6}, {"text": "never"})),
                   approve={"cost_usd": [0.5, 1.0]})
    write_goal(ws, "Spend", name="spender")
    with BackgroundRunner(ws):
        s = session(ws, "spender")
        waiting(s, 1)  # spent 0.6 past 0.5
        assert cli(ws, "approve", "spender").returncode == 0
        waiting(s, 2)  # spent 1.2 past 1.0
        assert cli(ws, "deny", "spender", "--reason", "too dear").returncode == 0
        wait_for(lambda: s.reload().get("status") == "stopped", 30, "stopped")
    assert s.meta["stop_reason"] == "approval" and "too dear" in s.meta["error"]
    assert [e["output"].strip() for e in s.events("cell")] == ["1", "2"]


def test_no_runner_or_no_request_is_a_clear_error(ws):
    write_goal(ws, "x", name="quiet")
    r = cli(ws, "approve", "nosuch")
    assert r.returncode == 1 and "no session" in r.stderr.lower() and "Traceback" not in r.stderr
    assert cli(ws, "approvals").stdout.strip() == "no session waits for an approval"


@pytest.mark.parametrize("policy, words", [
    ({"cell": ["x"]}, "approve: unknown key(s) cell"),
    ({"cells": ["("]}, "approve.cells[0]: '(' is not a regular expression"),
    ({"children": -1}, "approve.children must be a whole number"),
    ({"cost_usd": "lots"}, "approve.cost_usd must be a cost in USD"),
    ({"timeout_s": 0}, "approve.timeout_s must be a number of seconds above 0"),
    ({"default": "maybe"}, "approve.default (the verdict when timeout_s passes) is approve or deny"),
])
def test_bad_approve_settings_name_the_setting(ws, policy, words):
    cfg = ws.root / "primefs.yaml"
    cfg.write_text(dump_yaml({**load_yaml(cfg), "approve": policy}))
    r = cli(ws, "run", "--once")
    assert r.returncode == 1 and words in r.stderr and "Traceback" not in r.stderr, r.stderr
    (ws.root / "primefs.yaml").write_text("model: scripted/script.yaml\n")
    (ws.root / "goals" / "g.md").write_text("---\napprove: {children: x}\n---\nDo it.\n")
    r = cli(ws, "run", "--once")
    assert "goals/g.md: approve.children must be a whole number" in r.stderr, r.stderr


def test_attach_answers_with_a_typed_line(gated):
    import os

    from test_daemon_live import PRIMEFS, Pty

    ws = gated({"code": SHELL}, {"text": "as you wish"})
    write_goal(ws, "Use the shell", name="shell")
    env = {**os.environ, "COLUMNS": "120", "TERM": "xterm"}
    env.pop("PRIMEFS_WORKSPACE", None)
    with BackgroundRunner(ws):
        s = session(ws, "shell")
        waiting(s)
        term = Pty([*PRIMEFS, "attach", "shell", "-w", str(ws.root)], env)
        try:
            term.expect("it waits for your yes to approval 1")
            term.expect("/deny 1 REASON")  # the request event, with how to answer it
            term.send(b"/deny 1 not on this machine\n")
            term.expect("approval 1: denied")
            term.expect("as you wish")
            term.send(b"\x04")
            assert term.proc.wait(10) == 0
        finally:
            term.close()
    [event] = s.events("approval")
    assert (event["verdict"], event["via"], event["reason"]) == ("denied", "attach", "not on this machine")
    assert s.events("message") == []  # the answer was not mailed


def test_a_request_a_killed_runner_left_is_void_and_asked_again(gated):
    from conftest import sigkill_runner_when

    ws = gated({"code": SHELL}, {"code": SHELL}, {"text": "ran it"})  # told its cell was cut off, it tries again
    write_goal(ws, "Use the shell", name="shell")
    sigkill_runner_when(ws, lambda: any(s.meta.get("approval") == 1 for s in list_sessions(ws.sessions)),
                        "approval 1 waiting")
    [s] = list_sessions(ws.sessions)
    late = cli(ws, "approve", "shell")
    assert late.returncode == 1 and "no longer waits: the runner that asked it stopped" in late.stderr, late.stderr
    with BackgroundRunner(ws):
        waiting(s, 2)  # the cut-off turn goes on, and the same code asks again
        assert approvals.read(s.dir, 1)[0]["status"] == "void"
        assert cli(ws, "approve", "shell", "2").returncode == 0
        wait_for(lambda: s.read_result() == "ran it", 30, "the turn's answer")
    assert [(e["approval"], e["verdict"]) for e in s.events("approval")] == [(1, "void"), (2, "approved")]


def test_a_program_answers_through_its_handle(gated):
    import primefs

    ws = gated({"code": SHELL}, {"text": "ran it"})
    api = primefs.Workspace(ws.root)
    try:
        h = api.submit("Use the shell", name="shell")

        def asking() -> bool:
            try:
                h.wait(0.05)  # this process's runner does the work
            except primefs.Timeout:
                pass
            return h.approval == 1

        wait_for(asking, 30, "approval 1")
        assert h.approve(reason="ok from a program")["verdict"] == "approved"
        assert h.wait(30).answer == "ran it" and h.approval is None
    finally:
        api.close()
    [event] = h.session.events("approval")
    assert (event["via"], event["reason"]) == ("api", "ok from a program")
