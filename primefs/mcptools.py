"""MCP servers as tools. `mcp_servers:` in primefs.yaml is shaped like the `mcpServers` section that
MCP clients use:

    mcp_servers:
      files: {command: python, args: [srv.py], env: {TOKEN: "${FILES_TOKEN}"}}      # stdio
      search: {url: "http://127.0.0.1:9000/mcp", headers: {Authorization: "Bearer ${KEY}"}}  # HTTP

The runner starts each server once with the official `mcp` SDK and keeps its client session, all on
one asyncio loop in a thread; each server tool becomes a runner tool named `SERVER_TOOL`. A server
that fails to start, dies or times out gives a clear error (in the cell, in `primefs tools`); the
next call starts it again.
"""
from __future__ import annotations

import asyncio
import inspect
import os
import re
import threading
from typing import Any

from .errors import PrimefsError
from .tools import Tool

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


class _Server:
    """One server's client session, kept open by a task on the hub's loop."""

    def __init__(self, name: str, spec: dict):
        self.name, self.spec = name, spec
        self.session = None
        self.tools: list = []
        self.problem: str | None = None
        self.stop: asyncio.Event | None = None
        self.task: asyncio.Task | None = None

    async def start(self, timeout: float) -> None:
        ready = asyncio.get_running_loop().create_future()
        self.stop = asyncio.Event()
        self.task = asyncio.create_task(self._run(ready))
        try:
            await asyncio.wait_for(asyncio.shield(ready), timeout)
        except asyncio.TimeoutError:
            self.task.cancel()
            raise TimeoutError(f"MCP server {self.name} did not start within {timeout:g} s") from None

    async def _run(self, ready: asyncio.Future) -> None:
        from mcp import ClientSession

        try:
            async with self._transport() as streams:
                async with ClientSession(streams[0], streams[1]) as session:
                    await session.initialize()
                    self.tools = (await session.list_tools()).tools
                    self.session, self.problem = session, None
                    ready.set_result(True)
                    await self.stop.wait()
        except BaseException as exc:  # noqa: BLE001 - whatever ends the server is reported as its problem
            self.problem = f"MCP server {self.name}: {_why(exc)}"
            if not ready.done():
                ready.set_exception(RuntimeError(self.problem))
        finally:
            self.session = None

    async def alive(self) -> bool:
        """Does the server still answer? (a failed call may be the tool's, or the connection's)"""
        if self.session is None:
            return False
        try:
            await asyncio.wait_for(self.session.send_ping(), 2)
            return True
        except Exception:  # noqa: BLE001
            return False

    async def end(self) -> None:
        """Close the connection (its task ends); the next call starts the server again."""
        if self.stop is not None:
            self.stop.set()
        if self.task is not None:
            await asyncio.wait({self.task}, timeout=5)
        self.session = None

    def _transport(self):
        where = f"mcp_servers.{self.name}"
        if "url" in self.spec:
            from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

            headers = {k: expand(v, f"{where}.headers.{k}") for k, v in (self.spec.get("headers") or {}).items()}
            return streamable_http_client(expand(self.spec["url"], f"{where}.url"),
                                          http_client=create_mcp_http_client(headers=headers))
        from mcp.client.stdio import StdioServerParameters, stdio_client

        env = {k: expand(v, f"{where}.env.{k}") for k, v in (self.spec.get("env") or {}).items()}
        params = StdioServerParameters(command=str(self.spec["command"]), args=[str(a) for a in self.spec.get("args") or []],
                                       env=env or None, cwd=self.spec.get("cwd"))
        return stdio_client(params, errlog=open(os.devnull, "w"))


def _why(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class MCPHub:
    def __init__(self, config: dict, timeout: float, log=lambda m: None):
        self.servers = {name: _Server(name, spec) for name, spec in check_servers(config).items()}
        self.timeout = timeout
        self.log = log
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="primefs-mcp", daemon=True)
        self._thread.start()
        self._lock = threading.Lock()

    def _run(self, coro, timeout: float):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def start_all(self) -> None:
        async def all_():
            await asyncio.gather(*(self._ensure(s) for s in self.servers.values()), return_exceptions=True)
        self._run(all_(), self.timeout + 5)

    async def _ensure(self, s: _Server) -> None:
        if s.session is not None:
            return
        try:
            await s.start(self.timeout)
        except Exception as exc:
            s.problem = str(exc) if str(exc).startswith("MCP server") else f"MCP server {s.name}: {_why(exc)}"
            self.log(f"warning: {s.problem}")
            raise RuntimeError(s.problem) from None

    def tools(self) -> list[Tool]:
        out: list[Tool] = []
        for s in self.servers.values():
            if s.problem and not s.tools:
                out.append(Tool(name=f"{s.name}_*", runs="runner", plugin=f"mcp:{s.name}", problem=s.problem))
            for t in s.tools:
                out.append(self._tool(s, t))
        return out

    def _tool(self, server: _Server, t) -> Tool:
        params, args_doc = signature_of(getattr(t, "input_schema", None) or getattr(t, "inputSchema", None) or {})
        description = " ".join((t.description or "").split())
        name = tool_name(server.name, t.name)
        out = getattr(t, "output_schema", None) or {}
        wrapped = list((out.get("properties") or {})) == ["result"]
        fn = self._caller(server.name, t.name, params, wrapped)
        fn.__name__, fn.__doc__ = name, "\n\n".join(x for x in (t.description or "", args_doc) if x)
        return Tool(name=name, runs="runner", plugin=f"mcp:{server.name}", description=description[:200],
                    doc=fn.__doc__, params=params, fn=fn)

    def _caller(self, server: str, tool: str, params: list[dict], wrapped: bool):
        names = {p["name"]: p["json"] for p in params}

        def call(**kwargs):
            return self.call(server, tool, {names.get(k, k): v for k, v in kwargs.items()}, wrapped)
        call.__signature__ = inspect.Signature([inspect.Parameter(p["name"], inspect.Parameter.KEYWORD_ONLY,
                                                                  default=None if "default" in p else inspect.Parameter.empty)
                                                for p in params])
        return call

    def call(self, server: str, tool: str, arguments: dict, wrapped: bool = False):
        s = self.servers[server]

        async def go():
            await self._ensure(s)  # a crashed server starts again on the next call
            try:
                result = await asyncio.wait_for(s.session.call_tool(tool, arguments), self.timeout)
            except asyncio.TimeoutError:
                raise TimeoutError(f"MCP tool {tool} of server {server} did not answer within {self.timeout:g} s") \
                    from None
            except Exception as exc:
                if await s.alive():
                    raise
                await s.end()
                raise RuntimeError(f"MCP server {server} is gone ({_why(exc)}); "
                                   "the next call starts it again") from None
            return to_python(result, wrapped)
        return self._run(go(), 2 * self.timeout + 5)

    def close(self) -> None:
        async def stop_all():
            for s in self.servers.values():
                if s.stop is not None:
                    s.stop.set()
            tasks = [s.task for s in self.servers.values() if s.task is not None]
            if tasks:
                await asyncio.wait(tasks, timeout=5)
        try:
            self._run(stop_all(), 10)
        except Exception:
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
