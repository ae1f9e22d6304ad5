"""Tools: a workspace plugin's kernel and runner tools, an MCP server's tools, selection, errors."""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from conftest import cli, configure, run_once, use_server

from primefs.store import trust
from primefs.index.accounting import UsageIndex
from primefs.store.goals import write_goal
from primefs.store.session import list_sessions
from primefs.tools.registry import make_tool, render_for_prompt

HERE = Path(__file__).parent


@pytest.fixture
def tool_ws(ws, monkeypatch):
    """A workspace with the test plugin and the test MCP server (plus one that cannot start)."""
    monkeypatch.setenv("PRIMEFS_LOAD_PLUGINS", "1")
    monkeypatch.setenv("TEST_TOOL_SECRET", "s3cret")
    monkeypatch.setenv("TEST_MCP_SECRET", "mcp-xyz")
    shutil.copy(HERE / "tool_plugin.py", ws.plugins / "mytools.py")
    trust.trust(ws, ["plugins/mytools.py"])
    return configure(ws, mcp_servers={
        "calc": {"command": sys.executable, "args": [str(HERE / "mcp_server.py")], "env": {"SECRET": "${TEST_MCP_SECRET}"}},
        "broken": {"command": "/nonexistent/mcp-server"}}, limits={"tool_timeout_s": 5})


def script(ws, text: str):
    (ws.root / "s.yaml").write_text(text)
    return configure(ws, model="scripted/s.yaml")


def cells(ws, name):
    s = next(x for x in list_sessions(ws.sessions) if x.name == name)
    return s, [c["output"] + (c.get("error") or "") for c in s.events("cell")]


def test_kernel_and_runner_tools_from_a_workspace_plugin(tool_ws):
    ws = script(tool_ws, """\
- code: |
    import os
    print(tools.word_count("a b c"), word_count("x y"))
    r = tools.api_lookup("k", times=2)
    print(r["secret"], r["times"], os.environ.get("TEST_TOOL_SECRET"))
    help(tools.api_lookup)
    print(len(tools.big()))
- text: done
""")
    write_goal(ws, "Use the tools", name="t")
    run_once(ws)
    s, out = cells(ws, "t")
    assert out[0].startswith("3 2\ns3cret 2 None\n")  # the kernel never sees the runner's variable
    assert "api_lookup(key: str, times: int = 1) -> dict" in out[0]
    assert 'Returns {"key", "secret", "times"}.' in out[0] and out[0].rstrip().endswith("500000")
    calls = s.events("tool_call")
    assert [c["name"] for c in calls] == ["api_lookup", "big"] and all(c["error"] is None for c in calls)
    tools = UsageIndex(ws.sessions).own[s.id]["tools"]
    assert tools["api_lookup"]["calls"] == 1 and tools["big"]["calls"] == 1
    assert "tool calls (tree):\n  api_lookup: 1 call(s), 0 failed" in cli(ws, "usage", "t").stdout


def test_the_prompt_lists_the_tools(tool_ws, server):
    server.set_script([{"text": "ok"}])
    ws = use_server(tool_ws, server)
    (ws.goals / "few.md").write_text("---\ntools: [word_count, calc_add]\n---\nHello\n")
    run_once(ws)
    system = server.requests[0]["messages"][0]["content"]
    assert "## Tools" in system and "- `word_count(text: str) -> int`: Count the words of a text." in system
    assert "- `calc_add(*, a: int, b: int = 1)`: Add two whole numbers." in system
    assert "api_lookup" not in system


def test_beyond_the_budget_the_prompt_lists_names_only():
    many = [make_tool(lambda text: text, runs="runner", plugin="p", name=f"tool_{i}",
                      description="x" * 100) for i in range(40)]
    text = render_for_prompt(many)
    assert "`tool_0`, `tool_1`" in text and "help(tools.NAME)" in text and "x" * 100 not in text


def test_tool_errors_are_one_line_in_the_cell(tool_ws):
    ws = script(tool_ws, """\
- code: |
    for f in (lambda: tools.boom(), lambda: tools.hang(), lambda: tools.not_json(),
              lambda: tools.api_lookup(1, 2, 3), lambda: tools.api_lookup({1}), lambda: tools.ghost(),
              lambda: tools.calc_add(2, 3)):
        try:
            f()
        except Exception as e:
            print(type(e).__name__, '|', e)
    print(tools.word_count("still fine"))
- text: done
""")
    write_goal(ws, "Break the tools", name="e")
    run_once(ws)
    s, out = cells(ws, "e")
    lines = out[0].splitlines()
    assert lines[0].startswith("KeyError | ") and "no such thing" in lines[0]
    assert lines[1].startswith("TimeoutError | tool hang did not return within 5 s")
    assert lines[2].startswith("TypeError | tool not_json returned a set, not a JSON value")
    assert lines[3].startswith("TypeError | tools.api_lookup(key: str, times: int = 1) -> dict: too many")
    assert lines[4].startswith("TypeError | tools.api_lookup: arguments must be JSON values")
    assert lines[5].startswith("AttributeError | no tool 'ghost' for this session")  # broken: offered to none
    assert lines[6].startswith("TypeError | tools.calc_add(*, a: int, b: int = 1)")
    assert lines[7] == "2" and s.read_result() == "done"
    errors = {c["name"]: c["error"] for c in s.events("tool_call")}
    assert errors["boom"].startswith("KeyError") and errors["hang"].startswith("TimeoutError")


def test_mcp_server_tools_restart_after_a_crash(tool_ws):
    ws = script(tool_ws, """\
- code: |
    print(tools.calc_add(a=2, b=3), calc_add(a=1), tools.calc_secret())
    try:
        tools.calc_crash()
    except Exception as e:
        print(type(e).__name__, '|', e)
    print(tools.calc_add(a=40, b=2))
    try:
        tools.calc_nap(seconds=30)
    except Exception as e:
        print(type(e).__name__, '|', e)
    print(tools.calc_add(a=1, b=1))
    print(sorted(n for n in vars(tools) if n.startswith('calc_')), hasattr(tools, 'broken_x'))
- text: done
""")
    write_goal(ws, "Use MCP", name="m")
    run_once(ws)
    s, out = cells(ws, "m")
    lines = out[0].splitlines()
    assert lines[0] == "5 2 mcp-xyz"
    assert lines[1].startswith("RuntimeError | MCP server calc is gone")
    assert lines[2] == "42"  # started again
    assert lines[3].startswith("TimeoutError | ")
    assert lines[4] == "2"
    assert lines[5] == "['calc_add', 'calc_big', 'calc_crash', 'calc_nap', 'calc_secret', 'calc_wedge'] False"


def test_primefs_tools_lists_everything_with_problems(tool_ws):
    r = cli(tool_ws, "tools", "--json")
    assert r.returncode == 0, r.stderr
    found = {t["name"]: t for t in json.loads(r.stdout)}
    assert found["word_count"]["runs"] == "kernel" and found["word_count"]["signature"] == "(text: str) -> int"
    assert found["word_count"]["plugin"] == "workspace:mytools.py"
    assert found["api_lookup"]["runs"] == "runner" and found["api_lookup"]["problem"] is None
    assert found["calc_add"]["plugin"] == "mcp:calc" and found["calc_add"]["signature"] == "(*, a: int, b: int = 1)"
    assert "invalid tool name 'bad name'" in found["bad name"]["problem"]
    assert "cannot import mytools:nothing_here" in found["ghost"]["problem"]
    assert "MCP server broken" in found["broken_*"]["problem"]
    text = cli(tool_ws, "tools")
    assert "calc_add(*, a: int, b: int = 1)" in text.stdout and "error: MCP server broken" in text.stdout


def test_tools_chosen_by_goal_and_by_subagent_spec(tool_ws):
    (tool_ws.harness / "agents" / "looker.md").write_text(
        "---\nname: looker\ndescription: looks keys up\ntools: api_lookup, calc_*\n---\nYou look things up.\n")
    ws = script(tool_ws, """\
rules:
  - match: "^Parent"
    replies:
      - code: |
          print(sorted(vars(tools)))
          print(rlm('Child plain').wait(), '/', rlm('Child spec', agent='looker').wait())
          from primefs.kernels.inside.rpc import call
      - text: parent done
  - match: "^Child plain"
    replies:
      - code: "done(str(sorted(vars(tools))))"
  - match: "^Child spec"
    replies:
      - code: "done(str(sorted(vars(tools))))"
""")
    (ws.goals / "p.md").write_text("---\nname: p\ntools: [word_count]\n---\nParent task\n")
    run_once(ws)
    s, out = cells(ws, "p")
    assert out[0].splitlines()[0] == "['word_count']"
    assert out[0].splitlines()[1] == "['word_count'] / ['api_lookup', 'calc_add', 'calc_big', 'calc_crash', 'calc_nap', 'calc_secret', 'calc_wedge']"
    assert s.meta["tools"] == ["word_count"]


def test_a_spec_a_kernel_wrote_gives_its_child_no_tool_its_parent_lacks(tool_ws):
    ws = script(tool_ws, """\
rules:
  - match: "^Parent"
    replies:
      - code: |
          harness.put("agent", "wide", "Do it.", description="wants every tool", tools="all")
          print(rlm('Child spec', agent='wide').wait())
      - text: parent done
  - match: "^Child spec"
    replies:
      - code: "done(str(sorted(vars(tools))))"
""")
    (ws.goals / "p.md").write_text("---\nname: p\ntools: [word_count, calc_add]\n---\nParent task\n")
    run_once(ws)
    s, out = cells(ws, "p")
    assert out[0].splitlines()[0] == "['calc_add', 'word_count']"


def test_goal_tools_option_and_bad_selections(tool_ws):
    r = cli(tool_ws, "goal", "x", "--name", "g", "--tools", "word_count, calc_*")
    assert r.returncode == 0, r.stderr
    assert "tools:\n- word_count\n- calc_*" in (tool_ws.goals / "g.md").read_text()
    (tool_ws.goals / "bad.md").write_text("---\ntools: 5\n---\nx\n")
    r = cli(tool_ws, "status")
    assert "goals/bad.md: `tools:` is a list of tool names" in r.stderr

