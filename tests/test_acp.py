"""`primefs acp` (docs/acp.md) driven over stdio by the client side of the Agent Client Protocol's own
Python SDK (`acp.spawn_agent_process`, a `ClientSideConnection`), as an editor would; raw lines for
what no well-behaved client sends."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess

import acp
import pytest
from acp.schema import ClientCapabilities, Implementation
from conftest import PRIMEFS

from primefs.store.session import list_sessions

SCRIPT = ('rules:\n'
          '  - match: "multiply"\n'
          '    replies:\n'
          '      - code: "print(17 * 23)"\n'
          '      - text: "391"\n'
          '      - text: "still 391"\n'
          '  - match: "be slow"\n'
          '    replies:\n'
          '      - code: "import time; time.sleep(60)"\n'
          '      - text: "late"\n'
          '  - match: "files"\n'
          '    replies:\n'
          '      - code: "print(sorted(context[\'files\']))"\n'
          '      - text: "one file"\n')


class Client:
    """What an editor is, to the agent: it shows updates (kept here)."""

    def __init__(self):
        self.updates: list[tuple[str, object]] = []

    async def session_update(self, session_id, update, **kw):
        self.updates.append((session_id, update))

    def kinds(self, sid) -> list[str]:
        return [u.session_update for s, u in self.updates if s == sid]

    def text(self, sid, kind="agent_message_chunk") -> str:
        return "".join(u.content.text for s, u in self.updates if s == sid and u.session_update == kind)


def run(ws, body):
    """Run `body(conn, client)` against `primefs -w WS acp`, initialized."""
    async def main():
        client = Client()
        async with acp.spawn_agent_process(client, *PRIMEFS, "-w", str(ws.root), "acp", env=dict(os.environ),
                                           transport_kwargs={"stderr": None}) as (conn, proc):
            init = await conn.initialize(protocol_version=acp.PROTOCOL_VERSION, client_capabilities=ClientCapabilities(),
                                         client_info=Implementation(name="test", version="1"))
            assert init.agent_capabilities.load_session and init.agent_info.name == "primefs"
            return await body(conn, client)
    return asyncio.run(asyncio.wait_for(main(), 180))


def test_a_prompt_is_a_turn_with_cells_as_tool_calls_and_the_answer_streamed(ws, scripted):
    ws = scripted(SCRIPT)

    async def body(conn, client):
        sid = (await conn.new_session(cwd=str(ws.root), mcp_servers=[])).session_id
        first = await conn.prompt(session_id=sid, prompt=[acp.text_block("multiply 17 by 23")])
        second = await conn.prompt(session_id=sid, prompt=[acp.text_block("and once more?")])
        return sid, first, second, client

    sid, first, second, client = run(ws, body)
    assert first.stop_reason == "end_turn" == second.stop_reason
    kinds = client.kinds(sid)
    assert kinds.index("tool_call") < kinds.index("tool_call_update") < kinds.index("agent_message_chunk")
    [start] = [u for s, u in client.updates if u.session_update == "tool_call"]
    [done] = [u for s, u in client.updates if u.session_update == "tool_call_update"]
    assert start.kind == "execute" and "17 * 23" in json.dumps(start.raw_input)
    assert done.status == "completed" and "391" in done.content[0].content.text
    assert client.text(sid) == "391still 391"
    [s] = list_sessions(ws.sessions)  # one primefs session, named after the ACP one, two turns
    assert s.name == sid and [e["type"] for e in s.events()].count("turn_end") == 2


def test_cancel_stops_the_session(ws, scripted):
    ws = scripted(SCRIPT)

    async def body(conn, client):
        sid = (await conn.new_session(cwd=str(ws.root), mcp_servers=[])).session_id
        prompt = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=[acp.text_block("be slow")]))
        while "tool_call" not in client.kinds(sid):  # the cell is running
            await asyncio.sleep(0.05)
        await conn.cancel(session_id=sid)
        reply = await prompt
        with pytest.raises(acp.RequestError, match="Invalid params") as again:
            await conn.prompt(session_id=sid, prompt=[acp.text_block("more")])
        return reply, again.value

    reply, again = run(ws, body)
    assert reply.stop_reason == "cancelled" and "was stopped" in json.dumps(again.data)
    [s] = list_sessions(ws.sessions)
    assert s.reload()["status"] == "stopped"
    # the cancel came as the cell was asked for, before it ran: it is not run, or interrupted as it starts,
    # never waited out (the interrupt of a cell not yet begun was lost: a minute here)
    [cell] = s.events("cell")
    assert cell["error"] == "not run: the session was stopped" or (
        "KeyboardInterrupt" in cell["error"] and cell["elapsed_s"] < 30), cell


def test_load_replays_an_existing_session(ws, scripted):
    ws = scripted(SCRIPT)
    assert subprocess.run([*PRIMEFS, "-w", str(ws.root), "ask", "multiply them"], capture_output=True).returncode == 0
    [s] = list_sessions(ws.sessions)

    async def body(conn, client):
        await conn.load_session(cwd=str(ws.root), session_id=s.name, mcp_servers=[])
        replayed = list(client.updates)
        with pytest.raises(acp.RequestError) as missing:
            await conn.load_session(cwd=str(ws.root), session_id="nobody", mcp_servers=[])
        await conn.prompt(session_id=s.name, prompt=[acp.text_block("again")])
        return replayed, missing.value, client

    replayed, missing, client = run(ws, body)
    kinds = [u.session_update for _, u in replayed]
    assert kinds[0] == "user_message_chunk" and "tool_call" in kinds and kinds[-1] == "agent_message_chunk"
    assert replayed[0][1].content.text == "multiply them" and replayed[-1][1].content.text == "391"
    assert missing.code == -32002
    assert client.text(s.name).endswith("still 391")  # a loaded session takes prompts as its mail


def test_embedded_resources_are_context_files(ws, scripted):
    ws = scripted(SCRIPT)

    async def body(conn, client):
        sid = (await conn.new_session(cwd=str(ws.root), mcp_servers=[])).session_id
        resource = acp.resource_block(acp.embedded_text_resource("file:///home/me/notes.txt", "SECRET NOTES"))
        await conn.prompt(session_id=sid, prompt=[acp.text_block("count the files"), resource])
        return client.text(sid)

    assert run(ws, body) == "one file"
    [s] = list_sessions(ws.sessions)
    assert json.loads((s.dir / "context.json").read_text()) == {"files": {"notes.txt": "SECRET NOTES"}}


def test_messages_of_the_wrong_shape_get_errors_and_the_agent_goes_on(ws, scripted):
    ws = scripted(SCRIPT)
    lines = ["not json", "[1, 2, 3]", '"a string"', '{"jsonrpc": "2.0", "id": 7}',
             '{"jsonrpc": "2.0", "id": 8, "method": "session/new", "params": {"cwd": 5}}',
             '{"jsonrpc": "2.0", "id": 9, "method": "session/prompt", "params": {"sessionId": "nope", "prompt": []}}',
             '{"jsonrpc": "2.0", "id": 10, "method": "session/bogus", "params": {}}',
             '{"jsonrpc": "2.0", "id": 11, "method": "initialize", "params": {"protocolVersion": 1}}']
    proc = subprocess.run([*PRIMEFS, "-w", str(ws.root), "acp"], input="\n".join(lines) + "\n", capture_output=True,
                          text=True, timeout=120)
    replies = [json.loads(line) for line in proc.stdout.splitlines()]  # every stdout line is protocol JSON
    codes = {r.get("id"): r.get("error", {}).get("code") for r in replies}
    assert [r["error"]["code"] for r in replies if r.get("id") is None] == [-32700, -32600, -32600]
    assert codes[7] == -32600 and codes[8] == -32602 and codes[9] == -32602 and codes[10] == -32601
    assert replies[-1]["id"] == 11 and replies[-1]["result"]["agentInfo"]["name"] == "primefs"
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert list_sessions(ws.sessions) == []


def test_acp_without_a_workspace_is_one_line(tmp_path):
    proc = subprocess.run([*PRIMEFS, "acp"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if k != "PRIMEFS_WORKSPACE"})
    assert proc.returncode == 1 and proc.stderr.startswith("error: not inside a primefs workspace")
