"""The runner's tools: plugin tools and MCP servers' tools, which of them a session gets, and calls
of runner tools from kernels (as the calling session: timeouts, JSON checks, the `tool_call` record)."""
from __future__ import annotations

import inspect
import json
import threading
import time
from dataclasses import fields
from pathlib import Path

from primefs.store.fsutil import write_atomic
from primefs.tools import registry as T

BIG_RESULT_BYTES = 256 * 1024  # larger results travel as a file, not over the socket
START_WAIT_S = 10.0  # sessions wait no longer than this (from the runner's start) for MCP servers starting


class ToolBox:
    def __init__(self, ws, pm, log=lambda m: None):
        self.ws, self.log = ws, log
        self.timeout = ws.limits().tool_timeout_s
        self._plugin_tools = T.collect(pm, ws.plugins)
        for t in self._plugin_tools:
            if t.problem:
                log(f"warning: {t.problem}")
        self.hub = None
        self._wait_until = 0.0
        self._runners: list[dict] | None = None
        self._lock = threading.Lock()

    def start(self, background: bool = True) -> None:
        """Start the MCP servers. Sessions wait for those still starting until START_WAIT_S after this
        (in the background) or for each one's first start (`primefs tools`)."""
        from primefs.store import trust

        servers = self.ws.config.get("mcp_servers")
        if servers and not trust.trusted(self.ws, trust.CONFIG):
            self.log(f"warning: {trust.untrusted_note(trust.CONFIG, 'mcp_servers (commands the runner starts) are')}")
            servers = None
        if not servers:
            return
        from primefs.tools.mcp import MCPHub

        try:
            self.hub = MCPHub(servers, self.timeout, self.log)
        except Exception as exc:  # a bad mcp_servers section must not stop the runner
            self.log(f"warning: MCP servers not started: {exc}")
            return
        self._wait_until = time.monotonic() + (START_WAIT_S if background else self.timeout + 5)

    def use_runners(self, mcp_tools: list[dict]) -> None:
        """List the MCP tools as the running runner has them (its .primefs/runner.json), not start servers."""
        self._runners = mcp_tools

    def mcp_state(self) -> list[dict] | None:
        """The MCP tools and servers' problems, as JSON (for .primefs/runner.json: `primefs tools`)."""
        if self.hub is None:
            return None
        return [{f.name: getattr(t, f.name) for f in fields(t) if f.name != "fn"} for t in self.hub.tools()]

    def all(self) -> list[T.Tool]:
        """Every tool, usable or not (those with a problem say why)."""
        if self.hub is not None:
            self.hub.wait_started(self._wait_until - time.monotonic())
        with self._lock:
            mcp = [T.Tool(**t) for t in self._runners] if self._runners is not None else \
                (self.hub.tools() if self.hub else [])
            return T.dedupe([_copy(t) for t in self._plugin_tools + mcp])

    def for_session(self, selection) -> tuple[list[T.Tool], list[str]]:
        return T.select(self.all(), selection)

    # -- calls from kernels -----------------------------------------------------------------------
    def call(self, agent, name: str, args: list, kwargs: dict):
        """Run a runner tool for `agent`'s session; record the call in its history."""
        if not isinstance(name, str):
            raise ValueError("a tool name is a string")
        chosen, _ = self.for_session(agent.session.meta.get("tools"))
        tool = next((t for t in chosen if t.name == name), None)
        if tool is None or tool.runs != "runner":
            raise LookupError(f"no runner tool {name!r} for this session (see `primefs tools`)")
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            raise ValueError("tool arguments must be a list and a mapping")
        try:
            bound = inspect.signature(tool.fn).bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"tools.{name}{tool.signature}: {exc}") from None
        started = time.monotonic()
        error = None
        try:
            run = lambda: tool.fn(*bound.args, **bound.kwargs)  # noqa: E731
            result = run() if tool.keeps_time else _with_timeout(run, self.timeout, name)
            data = _json(result, name)
        except BaseException as exc:
            error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            agent.record("tool_call", name=name, plugin=tool.plugin, duration_s=round(time.monotonic() - started, 4),
                         error=error[:500] if error else None)
        if len(data) > BIG_RESULT_BYTES:
            return {"file": self._spill(agent.session.dir, name, data)}
        return {"value": result}

    def _spill(self, session_dir: Path, name: str, data: str) -> str:
        # kernel/ is the kernel's own folder (its uid's, in a sandbox): the kernel removes the file once read
        folder = session_dir / "kernel"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"tool-result-{time.time_ns()}-{name}.json"
        write_atomic(path, data, durable=False)
        return str(path)

    def close(self) -> None:
        if self.hub is not None:
            self.hub.close()


def _copy(t: T.Tool) -> T.Tool:
    from dataclasses import replace

    return replace(t)


def _json(value, name: str) -> str:
    try:
        return json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"tool {name} returned a {type(value).__name__}, not a JSON value ({exc})") from None


def _with_timeout(fn, timeout: float, name: str):
    """Run `fn` in a thread of its own; give up waiting after `timeout` s (the thread is left to end)."""
    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc

    t = threading.Thread(target=run, name=f"tool-{name}", daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise TimeoutError(f"tool {name} did not return within {timeout:g} s (limits.tool_timeout_s)")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def check_config(ws) -> None:
    """`mcp_servers:` is well formed (for the runner's start and `primefs tools`)."""
    from primefs.tools.mcp import check_servers

    check_servers(ws.config.get("mcp_servers"))

