"""MCP servers as tools. `mcp_servers:` in primefs.yaml is shaped like the `mcpServers` section that
MCP clients use:

    mcp_servers:
      files: {command: python, args: [srv.py], env: {TOKEN: "${FILES_TOKEN}"}}      # stdio
      search: {url: "http://127.0.0.1:9000/mcp", headers: {Authorization: "Bearer ${KEY}"}}  # HTTP

The runner starts each server with the official `mcp` SDK and keeps its client session, all on one
asyncio loop in a thread (mcpserver.py: starts, ends, retries, kills); each server tool becomes a
runner tool named `SERVER_TOOL`. A server that fails to start, dies or times out gives a clear error
(in the cell, in `primefs tools`) and is started again.
"""
from __future__ import annotations

import asyncio
import inspect
import os
import re
import threading
import time
from contextlib import asynccontextmanager
from typing import Any

from primefs.errors import PrimefsError
from primefs.tools.mcpserver import QUIT_GRACE_S, Process, Server, stdio_transport
from primefs.tools.registry import Tool

JSON_TYPES = {"string": "str", "integer": "int", "number": "float", "boolean": "bool", "array": "list",
              "object": "dict", "null": "None"}
VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def expand(value, where: str) -> str:
    """`${VAR}` -> the runner's environment variable (a missing one is an error naming the key)."""
    def sub(m):
        if m.group(1) not in os.environ:
            raise PrimefsError(f"{where}: environment variable {m.group(1)} is not set")
        return os.environ[m.group(1)]
    return VAR.sub(sub, str(value))


def check_servers(config) -> dict:
    """Shape of `mcp_servers:` (values are expanded only when a server starts)."""
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise PrimefsError("primefs.yaml: `mcp_servers:` must be a mapping of server name -> {command, args, env} "
                           "or {url, headers}")
    out = {}
    for name, spec in config.items():
        where = f"primefs.yaml: mcp_servers.{name}"
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", name):
            raise PrimefsError(f"primefs.yaml: bad MCP server name {name!r} (letters, digits, '_', '.', '-')")
        if not isinstance(spec, dict) or ("command" in spec) == ("url" in spec):
            raise PrimefsError(f"{where}: give `command:` (stdio) or `url:` (streamable HTTP), one of them")
        for key, kind in (("args", list), ("env", dict), ("headers", dict)):
            if spec.get(key) is not None and not isinstance(spec[key], kind):
                raise PrimefsError(f"{where}.{key} must be a {'list' if kind is list else 'mapping'}")
        out[name] = dict(spec)
    return out


def tool_name(server: str, tool: str) -> str:
    name = re.sub(r"\W", "_", f"{server}_{tool}")
    return name if name[0].isalpha() else f"mcp_{name}"


def signature_of(schema: dict) -> tuple[list[dict], str]:
    """Parameters and the Args section of a docstring from a tool's JSON input schema."""
    props = (schema or {}).get("properties") or {}
    required = set((schema or {}).get("required") or [])
    params, args_doc = [], []
    for key in sorted(props, key=lambda k: k not in required):  # required first, as Python wants
        p = props[key] if isinstance(props[key], dict) else {}
        kind = p.get("type")
        ann = " | ".join(JSON_TYPES.get(k, "Any") for k in kind) if isinstance(kind, list) else JSON_TYPES.get(kind)
        d = {"name": key if key.isidentifier() else re.sub(r"\W", "_", key), "kind": "KEYWORD_ONLY", "json": key}
        if ann:
            d["annotation"] = ann
        if key not in required:
            d["default"] = repr(p.get("default"))
        params.append(d)
        args_doc.append(f"    {d['name']}: {p.get('description') or ann or ''}".rstrip())
    return params, ("Args:\n" + "\n".join(args_doc)) if args_doc else ""


def to_python(result, wrapped: bool = False) -> Any:
    """A CallToolResult as Python values: its structured content where given, else its text.
    `wrapped`: the output schema is the SDK's wrapper of a plain value ({"result": value})."""
    texts = []
    for c in getattr(result, "content", None) or []:
        texts.append(c.text if getattr(c, "type", "") == "text" else f"[{getattr(c, 'type', 'content')}]")
    text = "\n".join(texts)
    if getattr(result, "is_error", False):
        raise RuntimeError(text or "the MCP tool reported an error")
    structured = getattr(result, "structured_content", None)
    if structured is None:
        return text
    return structured["result"] if wrapped and isinstance(structured, dict) and "result" in structured else structured


class MCPHub:
    """The runner's MCP servers: each kept by a Server on one asyncio loop in a thread of its own."""

    def __init__(self, config: dict, timeout: float, log=lambda m: None):
        self.servers = {name: Server(name, spec, timeout, log, self._transport(name, spec))
                        for name, spec in check_servers(config).items()}
        self.timeout = timeout
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="primefs-mcp", daemon=True)
        self._thread.start()
        self._tasks = self._run(self._start(), 10)

    async def _start(self) -> list[asyncio.Task]:
        for s in self.servers.values():
            s.open()
        return [asyncio.create_task(s.supervise()) for s in self.servers.values()]

    def _run(self, coro, timeout: float):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def wait_started(self, timeout: float | None = None) -> None:
        """Until every server's first start has ended, up or not (at most `timeout` s)."""
        deadline = time.monotonic() + (self.timeout + 5 if timeout is None else timeout)
        for s in self.servers.values():
            s.tried.wait(max(0.0, deadline - time.monotonic()))

    def tools(self) -> list[Tool]:
        """Each server's tools as last listed, and a `SERVER_*` entry saying why while it is not up."""
        out: list[Tool] = []
        for s in self.servers.values():
            if s.describe():
                out.append(Tool(name=f"{s.name}_*", runs="runner", plugin=f"mcp:{s.name}", problem=s.describe()))
            out.extend(self._tool(s, t) for t in s.tools)
        return out

    def _tool(self, server: Server, t) -> Tool:
        params, args_doc = signature_of(getattr(t, "input_schema", None) or getattr(t, "inputSchema", None) or {})
        description = " ".join((t.description or "").split())
        name = tool_name(server.name, t.name)
        out = getattr(t, "output_schema", None) or {}
        wrapped = list((out.get("properties") or {})) == ["result"]
        fn = self._caller(server.name, t.name, params, wrapped)
        fn.__name__, fn.__doc__ = name, "\n\n".join(x for x in (t.description or "", args_doc) if x)
        return Tool(name=name, runs="runner", plugin=f"mcp:{server.name}", description=description[:200],
                    doc=fn.__doc__, params=params, fn=fn, keeps_time=True)

    def _caller(self, server: str, tool: str, params: list[dict], wrapped: bool):
        names = {p["name"]: p["json"] for p in params}

        def call(**kwargs):
            return self.call(server, tool, {names.get(k, k): v for k, v in kwargs.items()}, wrapped)
        call.__signature__ = inspect.Signature([inspect.Parameter(p["name"], inspect.Parameter.KEYWORD_ONLY,
                                                                  default=None if "default" in p else inspect.Parameter.empty)
                                                for p in params])
        return call

    def call(self, server: str, tool: str, arguments: dict, wrapped: bool = False):
        """Within `timeout` (a server that is down is retried first; one that times out is restarted)."""
        result = self._run(self.servers[server].call(tool, arguments), self.timeout + QUIT_GRACE_S + 10)
        return to_python(result, wrapped)

    def _transport(self, name: str, spec: dict):
        where = f"mcp_servers.{name}"

        @asynccontextmanager
        async def http(conn):
            from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

            headers = {k: expand(v, f"{where}.headers.{k}") for k, v in (spec.get("headers") or {}).items()}
            # no limit on one SSE event (the SDK's is 1 MiB): a big result is one event
            async with create_mcp_http_client(headers=headers) as client, \
                    streamable_http_client(expand(spec["url"], f"{where}.url"), http_client=client,
                                           max_sse_event_size=None) as streams:
                yield streams

        def stdio(conn):
            from mcp.client.stdio import get_default_environment

            env = {k: expand(v, f"{where}.env.{k}") for k, v in (spec.get("env") or {}).items()}
            argv = [str(spec["command"]), *(str(a) for a in spec.get("args") or [])]
            conn.process = Process(conn.lost)
            return stdio_transport(argv, get_default_environment() | env, spec.get("cwd"), conn.process)
        return http if "url" in spec else stdio

    def close(self) -> None:
        async def stop_all():
            for s in self.servers.values():
                s.stop()
            await asyncio.wait(self._tasks, timeout=QUIT_GRACE_S + 6)
        try:
            self._run(stop_all(), QUIT_GRACE_S + 10)
        except Exception:  # noqa: BLE001 - closing: nothing more to be done
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
