"""`primefs acp`: an Agent Client Protocol agent over stdio (docs/acp.md), on Zed's Python SDK
(`agent-client-protocol`, imported as `acp`), its sessions run through the Python API.

An ACP session is a primefs session named after it (`acp-<time>-<random>`): its first prompt is the goal's
task, each later prompt mail to it (a new turn). The session's events become session/update notifications:
the model's working text (replies as they stream, replies with code) as thought chunks, each cell as a tool
call with its output, children as thoughts, the answer as the agent's message chunk. `session/cancel` stops
the session (`primefs stop`: final). `session/load` takes any primefs session by id or name and replays its
history. stdout carries only protocol lines: a line that is not JSON, or not a JSON-RPC object, gets a
JSON-RPC error reply (the SDK would drop it, or end on it).
"""
from __future__ import annotations

import asyncio
import json
import re
import secrets
import sys
from datetime import datetime
from pathlib import Path

import acp
from acp import helpers
from acp.schema import AgentCapabilities, Implementation, PromptCapabilities

from primefs import __version__
from primefs.api.sessions import SessionHandle
from primefs.api.workspace import Workspace
from primefs.errors import PrimefsError

ATTACHED = "acp"  # a later prompt's attached files go to <session room>/acp/ (its kernel's cwd is the room)
STOPS = {"answered": "end_turn", "done": "end_turn", "max_steps": "max_turn_requests", "stopped": "cancelled",
         "budget:tokens": "max_tokens"}


class PrimefsAgent(acp.Agent):
    def __init__(self, ws: Workspace):
        self.ws = ws
        self.conn = None
        self.handles: dict[str, SessionHandle | None] = {}  # ACP session id -> its primefs session (None: no prompt yet)
        self.cancelled: set[str] = set()

    def on_connect(self, conn) -> None:
        self.conn = conn

    async def initialize(self, protocol_version: int, client_capabilities=None, client_info=None, **kw):
        return acp.InitializeResponse(
            protocol_version=min(protocol_version, acp.PROTOCOL_VERSION),
            agent_capabilities=AgentCapabilities(load_session=True,
                                                 prompt_capabilities=PromptCapabilities(embedded_context=True)),
            agent_info=Implementation(name="primefs", title="primefs", version=__version__), auth_methods=[])

    async def new_session(self, cwd: str, mcp_servers=None, additional_directories=None, **kw):
        sid = f"acp-{datetime.now():%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"
        self.handles[sid] = None
        return acp.NewSessionResponse(session_id=sid)

    async def load_session(self, cwd: str, session_id: str, mcp_servers=None, additional_directories=None, **kw):
        try:
            handle = self.ws.session(session_id)
        except PrimefsError as exc:
            raise acp.RequestError.resource_not_found(session_id) from exc
        self.handles[session_id] = handle
        updates = Updates()
        for event in handle.events(from_start=True, timeout=None) if handle.ended else _written(handle):
            for update in updates.of(event, replay=True):
                await self.conn.session_update(session_id=session_id, update=update)
        return acp.LoadSessionResponse()

    async def prompt(self, prompt, session_id: str, **kw):
        if session_id not in self.handles:
            raise acp.RequestError.invalid_params({"sessionId": f"no session {session_id!r}: session/new or "
                                                                f"session/load first"})
        text, files = _read_prompt(prompt)
        if not text.strip() and not files:
            raise acp.RequestError.invalid_params({"prompt": "the prompt has no text and no resource"})
        handle = self.handles[session_id]
        self.cancelled.discard(session_id)
        try:
            if handle is None:
                handle = await self.ws.asubmit(_with_notes(text, files, "context['files']"),
                                               context={"files": files} if files else None, name=session_id)
                self.handles[session_id] = handle
                events = handle.aevents(from_start=True)
            else:
                if handle.status == "stopped":
                    raise acp.RequestError.invalid_params({"sessionId": f"{session_id} was stopped (cancelled): it "
                                                                        "takes no more prompts; start a new session"})
                events = handle.aevents(from_start=False)  # from now: this prompt's turn
                await asyncio.to_thread(handle.send, _with_notes(text, _attach(handle, files), f"{ATTACHED}/"))
        except PrimefsError as exc:
            raise acp.RequestError.invalid_params({"prompt": str(exc)}) from None
        updates = Updates()
        async for event in events:
            for update in updates.of(event):
                await self.conn.session_update(session_id=session_id, update=update)
        result = handle.result
        if session_id in self.cancelled or result.status == "stopped" and result.stop_reason == "stopped":
            return acp.PromptResponse(stop_reason="cancelled")
        if result.status == "failed":
            raise acp.RequestError.internal_error({"session": handle.id, "error": result.error or "failed"})
        reason = result.stop_reason or ""
        return acp.PromptResponse(stop_reason=STOPS.get(reason, "max_turn_requests" if reason.startswith("budget:")
                                                        else "end_turn"))

    async def cancel(self, session_id: str, **kw) -> None:
        handle = self.handles.get(session_id)
        if handle is not None and not handle.ended:
            self.cancelled.add(session_id)
            await asyncio.to_thread(handle.stop)


def _written(handle: SessionHandle):
    """A session still working, loaded: what its history holds so far (its work goes on; not waited for)."""
    from primefs.store.history import read_events

    return read_events(handle.path / "history.jsonl")


class Updates:
    """A session's events as ACP session updates. A cell's code is a tool call, started when the model
    asks for it (a native tool call) or when its cell is written (fenced code), ended with its output."""

    def __init__(self):
        self.started: set[str] = set()
        self.streamed = False  # this reply's text went out as it streamed
        self.n = 0

    def of(self, e: dict, replay: bool = False) -> list:
        t = e.get("type")
        if t in ("task", "message") and replay:
            return [helpers.update_user_message_text(str(e.get("text") or ""))]
        if t == "delta":
            self.streamed = True
            return [helpers.update_agent_thought_text(e["text"])]
        if t == "assistant":
            out = []
            if e.get("text") and not self.streamed:
                out.append(helpers.update_agent_thought_text(e["text"]))
            self.streamed = False
            for call in e.get("calls") or []:
                cid = str(call.get("id"))
                self.started.add(cid)
                out.append(helpers.start_tool_call(cid, "python", kind="execute", status="in_progress",
                                                   raw_input=_arguments(call)))
            return out
        if t == "cell":
            cid = e.get("call_id")
            out = []
            if not cid or cid not in self.started:
                self.n += 1
                cid = cid or f"cell-{self.n}"
                out.append(helpers.start_tool_call(cid, "python", kind="execute", status="in_progress",
                                                   raw_input={"code": e.get("code")}))
            failed = bool(e.get("error") or e.get("timed_out"))
            out.append(helpers.update_tool_call(cid, status="failed" if failed else "completed",
                                                content=[helpers.tool_content(helpers.text_block(e.get("shown") or ""))],
                                                raw_output={"output": e.get("output"), "error": e.get("error")}))
            return out
        if t == "spawn":
            return [helpers.update_agent_thought_text(f"[started child session {e.get('name')}: {e.get('task')}]\n")]
        if t == "result" and e.get("text"):
            return [helpers.update_agent_message_text(e["text"])]
        return []


def _arguments(call: dict):
    try:
        return json.loads(call.get("arguments") or "{}")
    except ValueError:
        return {"arguments": call.get("arguments")}


def _read_prompt(blocks) -> tuple[str, dict[str, str]]:
    """The text of a prompt's blocks, and its embedded text resources by file name (links: named only)."""
    texts, files = [], {}
    for b in blocks:
        kind = getattr(b, "type", None)
        if kind == "text":
            texts.append(b.text)
        elif kind == "resource" and hasattr(b.resource, "text"):
            files[_file_name(b.resource.uri, files)] = b.resource.text
        elif kind == "resource_link":
            texts.append(f"(see {b.uri})")
        else:
            raise acp.RequestError.invalid_params({"prompt": f"a {kind} block is not taken (text and text "
                                                             "resources are)"})
    return "\n".join(texts), files


def _file_name(uri: str, taken: dict) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", uri.rsplit("/", 1)[-1]).strip("._") or "file"
    base, i = name, 1
    while name in taken:
        i += 1
        name = f"{i}-{base}"
    return name


def _attach(handle: SessionHandle, files: dict[str, str]) -> dict[str, str]:
    """A later prompt's files, written to the session's room (its kernel's working folder)."""
    if files:
        folder = handle.path / "work" / ATTACHED
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (folder / name).write_text(text, encoding="utf-8")
    return files


def _with_notes(text: str, files: dict, where: str) -> str:
    if not files:
        return text
    return (text.strip() or "Answer about the attached files.") + f"\n\nAttached files ({', '.join(files)}) are in {where}."


# -- stdio: only JSON-RPC objects reach the SDK ------------------------------------------------------
async def _filtered(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, limit: int) -> asyncio.StreamReader:
    """A reader of the lines that are JSON-RPC objects; other lines are answered with an error here."""
    clean = asyncio.StreamReader(limit=limit)

    def refuse(code: int, message: str, mid=None) -> None:
        writer.write((json.dumps({"jsonrpc": "2.0", "id": mid, "error": {"code": code, "message": message}})
                      + "\n").encode())

    async def pump() -> None:
        try:
            while line := await reader.readline():
                if not line.strip():
                    continue
                try:
                    message = json.loads(line)
                except ValueError:
                    refuse(-32700, "Parse error: the line is not JSON")
                    continue
                if not isinstance(message, dict):
                    refuse(-32600, "Invalid Request: a message is a JSON object")
                    continue
                if not ({"method", "result", "error"} & message.keys()):
                    refuse(-32600, "Invalid Request: no method (nor result or error)", message.get("id"))
                    continue
                clean.feed_data(line if line.endswith(b"\n") else line + b"\n")
        finally:
            clean.feed_eof()

    asyncio.get_running_loop().create_task(pump())
    return clean


async def serve(ws: Workspace, protocol_out) -> None:
    from acp.stdio import stdio_streams

    limit = 50_000_000
    shown, sys.stdout = sys.stdout, protocol_out  # the SDK writes to sys.stdout: the protocol's own copy of it
    try:
        reader, writer = await stdio_streams(limit=limit)
    finally:
        sys.stdout = shown
    await acp.run_agent(PrimefsAgent(ws), input_stream=writer, output_stream=await _filtered(reader, writer, limit))


def main(root: Path) -> None:
    """Serve ACP on stdin/stdout until stdin ends. Whatever else writes to stdout (a print, a kernel, a
    library's notice) goes to stderr: file descriptor 1 is stderr's from here on."""
    import os

    ws = Workspace(root)
    protocol_out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        asyncio.run(serve(ws, protocol_out))
    except KeyboardInterrupt:
        pass
    finally:
        ws.close()
