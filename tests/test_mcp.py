"""MCP servers as the runner keeps them: with the official reference servers (mcp-server-git,
mcp-server-time) and the SDK's own server (tests/mcp_server.py) over stdio and streamable HTTP.
Servers that are down at start, crash, wedge, never start; results bigger than the SDK's SSE limit."""
from __future__ import annotations

import gc
import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import BackgroundRunner, cli, configure, run_once, session_named, wait_for

from primefs.store import mail
from primefs.store.goals import write_goal
from primefs.tools.mcp import MCPHub

HERE = Path(__file__).parent
CALC = {"command": sys.executable, "args": [str(HERE / "mcp_server.py")], "env": {"SECRET": "${TEST_MCP_SECRET}"}}
TIME = {"command": sys.executable, "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"]}


def git_server(repo: Path) -> dict:
    return {"command": sys.executable, "args": ["-m", "mcp_server_git", "--repository", str(repo)]}


def scripted(ws, script: str, **config):
    (ws.root / "s.yaml").write_text(script)
    return configure(ws, model="scripted/s.yaml", **config)


def listed(ws) -> dict:
    r = cli(ws, "tools", "--json", timeout=120)
    assert r.returncode == 0, r.stderr
    return {t["name"]: t for t in json.loads(r.stdout)}


def outputs(ws, name: str) -> list[str]:
    return [c["output"] + (c.get("error") or "") for c in session_named(ws, name).events("cell")]


@pytest.fixture
def http_calc(tmp_path, monkeypatch):
    """tests/mcp_server.py over streamable HTTP: its URL."""
    monkeypatch.setenv("TEST_MCP_SECRET", "mcp-xyz")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = tmp_path / "http-server.log"
    with log.open("w") as err:
        proc = subprocess.Popen([sys.executable, str(HERE / "mcp_server.py"), "--http", str(port)],
                                stdout=subprocess.DEVNULL, stderr=err)
    try:
        wait_for(lambda: "Uvicorn running" in log.read_text() or proc.poll() is not None, what="the HTTP server")
        assert proc.poll() is None, log.read_text()
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_server_down_at_start_comes_up_later_and_primefs_tools_says_what_the_runner_sees(ws, tmp_path):
    repo = tmp_path / "repo"
    ws = scripted(ws, """\
- code: "m = recv(timeout=120)\\nprint(tools.git_git_status(repo_path=m.text).splitlines()[-1])"
- text: done
""", mcp_servers={"git": git_server(repo)}, limits={"tool_timeout_s": 20})
    write_goal(ws, "Use git once it is up", name="g")
    with BackgroundRunner(ws):
        s = wait_for(lambda: session_named(ws, "g"), what="the session")
        down = wait_for(lambda: "exited" in ((listed(ws).get("git_*") or {}).get("problem") or "")
                        and listed(ws)["git_*"]["problem"], what="the runner's git server down")
        assert "exited with code 1 while starting" in down and f"{repo} does not exist" in down, down
        assert "retrying" in down
        subprocess.run(["git", "init", "-q", str(repo)], check=True)
        wait_for(lambda: "git_git_status" in listed(ws), what="git's tools once the server is up")
        mail.deliver(s.dir / "mail", sender="user", to=s.id, kind="user", text=str(repo))
        wait_for(lambda: s.read_result() == "done", what="the session's answer")
        shutil.rmtree(repo)  # a server started now would fail; the runner's goes on
        r = cli(ws, "tools")
        assert "git_git_status(" in r.stdout and "git_*" not in r.stdout, r.stdout
        assert "as the runner" in r.stdout
    assert outputs(ws, "g")[0] == 'nothing to commit (create/copy files and use "git add" to track)\n'


def test_a_wedged_server_is_killed_and_a_timed_out_call_never_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("TEST_MCP_SECRET", "x")
    hub = MCPHub({"calc": CALC}, timeout=3)
    try:
        hub.wait_started()
        tools = {t.name: t.fn for t in hub.tools()}
        pidfile = tmp_path / "pid"
        with pytest.raises(TimeoutError) as caught:
            tools["calc_wedge"](path=str(pidfile))
        assert "did not answer within 3 s" in str(caught.value) and "restarted" in str(caught.value)
        pid = int(pidfile.read_text())
        assert not Path(f"/proc/{pid}").exists()  # gone (killed and reaped) before the timeout was said
        assert tools["calc_add"](a=1, b=1) == 2  # a new process
        assert not Path(f"{pidfile}.late").exists()
    finally:
        hub.close()


def test_a_big_result_over_streamable_http_travels_as_a_file(ws, http_calc):
    ws = scripted(ws, "- code: print(len(tools.web_big(n=3_000_000)))\n- text: ok\n",
                  mcp_servers={"web": {"url": http_calc}})
    write_goal(ws, "A big result over HTTP", name="big")
    run_once(ws)
    assert outputs(ws, "big")[0] == "3000000\n"


def test_a_crashing_server_says_its_exit_code_and_the_end_of_its_stderr(ws, tmp_path, monkeypatch):
    ws = configure(ws, mcp_servers={"git": git_server(tmp_path / "missing")}, limits={"tool_timeout_s": 20})
    problem = listed(ws)["git_*"]["problem"]
    assert "exited with code 1" in problem and "missing does not exist" in problem, problem
    monkeypatch.setenv("TEST_MCP_SECRET", "x")
    hub = MCPHub({"calc": CALC}, timeout=20)
    try:
        hub.wait_started()
        tools = {t.name: t.fn for t in hub.tools()}
        with pytest.raises(RuntimeError) as caught:
            tools["calc_crash"]()
        assert "exited with code 3" in str(caught.value) and "calc: crashing on purpose" in str(caught.value)
        assert tools["calc_add"](a=1, b=1) == 2  # started again
    finally:
        hub.close()


@pytest.mark.timeout(120)  # were the first turn to wait for the server that never starts: an hour
def test_a_server_that_never_starts_delays_no_session(ws):
    ws = scripted(ws, """\
- code: "print(tools.time_get_current_time(timezone='UTC')['timezone'])"
- text: done
""", mcp_servers={"time": TIME, "stuck": {"command": "sleep", "args": ["3600"]}},
                  limits={"tool_timeout_s": 3600})
    write_goal(ws, "What time is it", name="t")
    run_once(ws)
    assert outputs(ws, "t") == ["UTC\n"]


def test_a_start_that_times_out_says_so_and_nothing_else(capfd, caplog):
    hub = MCPHub({"stuck": {"command": "sleep", "args": ["3600"]}}, timeout=2)
    try:
        hub.wait_started()
        assert "MCP server stuck: did not start within 2 s" in hub.tools()[0].problem
    finally:
        hub.close()
    gc.collect()
    assert "never retrieved" not in capfd.readouterr().err + caplog.text


def test_mcp_over_streamable_http_with_headers_from_the_environment(ws, http_calc):
    ws = configure(ws, mcp_servers={"web": {"url": http_calc, "headers": {"Authorization": "Bearer ${TEST_MCP_SECRET}"}},
                                    "nokey": {"url": http_calc, "headers": {"X-Key": "${UNSET_VAR_XYZ}"}}})
    found = listed(ws)
    assert found["web_add"]["problem"] is None and found["web_add"]["plugin"] == "mcp:web"
    assert "environment variable UNSET_VAR_XYZ is not set" in found["nokey_*"]["problem"]
    ws = scripted(ws, "- code: print(tools.web_add(a=2, b=2))\n- text: ok\n")
    write_goal(ws, "Over HTTP", name="h")
    run_once(ws)
    assert outputs(ws, "h")[0] == "4\n"
