"""Runs inside kernels: the `tools` namespace, built from the tool specs the runner sends at start.

Kernel tools are imported here; runner tools become stubs with the real signature that call the
runner over the kernel socket (arguments and results as JSON). See primefs/tools.py.
"""
from __future__ import annotations

import importlib
import importlib.util
import json
import sys
import types
from pathlib import Path

from primefs.kernels.inside.rpc import RpcError, call

_link = None  # the kernel's link to the runner, once make_tools has run


class ToolError(RuntimeError):
    """A runner tool raised an exception that is not a Python built-in one; the message names it."""


class _Shown:
    """Shows a given text as its repr: annotations and defaults of a stub's signature."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


class Tools(types.SimpleNamespace):
    """The tools of this session (`primefs tools`): `tools.NAME(...)`; `help(tools.NAME)` for one."""

    def __repr__(self) -> str:
        return f"<tools: {', '.join(sorted(vars(self))) or 'none'}>"

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        if _link is not None:  # a tool the runner has got since this kernel started (its MCP server came up)?
            try:
                specs = call(_link.sock, _link.token, "tools", {})
            except (RpcError, OSError):
                specs = []
            for spec in specs:
                if spec["name"] not in vars(self):
                    setattr(self, spec["name"], _runner_tool(_link, spec) if spec["runs"] == "runner"
                            else _kernel_tool(spec))
            if name in vars(self):
                return vars(self)[name]
        raise AttributeError(f"no tool {name!r} for this session (it has: {', '.join(sorted(vars(self))) or 'none'}; "
                             "`primefs tools` lists every tool and its problems)")


def _signature(spec: dict):
    import inspect

    params = []
    for p in spec.get("params") or []:
        kind = getattr(inspect.Parameter, p.get("kind", "POSITIONAL_OR_KEYWORD"))
        default = _Shown(p["default"]) if "default" in p else inspect.Parameter.empty
        ann = _Shown(p["annotation"]) if p.get("annotation") else inspect.Parameter.empty
        params.append(inspect.Parameter(p["name"], kind, default=default, annotation=ann))
    ret = _Shown(spec["returns"]) if spec.get("returns") else inspect.Signature.empty
    return inspect.Signature(params, return_annotation=ret)


def _runner_tool(link, spec: dict):
    name = spec["name"]

    def stub(*args, **kwargs):
        try:
            json.dumps([args, kwargs], allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"tools.{name}: arguments must be JSON values (str, numbers, lists, dicts, "
                            f"True/False/None): {exc}") from None
        try:
            reply = call(link.sock, link.token, "tool", {"name": name, "args": list(args), "kwargs": kwargs})
        except RpcError as exc:  # the tool's exception, as its own built-in type where it has one
            import builtins

            cls = getattr(builtins, "ValueError" if exc.kind == "PrimefsError" else exc.kind, None)
            if isinstance(cls, type) and issubclass(cls, Exception):
                raise cls(str(exc)) from None
            raise ToolError(f"{exc.kind or 'error'}: {exc}") from None
        if "file" in reply:  # a large result travels as a file
            path = Path(reply["file"])
            value = json.loads(path.read_text(encoding="utf-8"))
            path.unlink(missing_ok=True)
            return value
        return reply["value"]

    stub.__name__ = stub.__qualname__ = name
    stub.__module__ = "tools"  # help() says "function lookup in module tools"
    stub.__doc__ = spec.get("doc") or ""
    stub.__signature__ = _signature(spec)
    return stub


def _kernel_tool(spec: dict):
    """Import a kernel tool ("module:attr" or "/path/file.py:attr"); a failure becomes a stub that says why."""
    target = spec.get("target") or ""
    module, _, attr = target.rpartition(":")
    try:
        if module.endswith(".py"):
            mspec = importlib.util.spec_from_file_location(f"primefs_tool_{spec['name']}", module)
            obj = importlib.util.module_from_spec(mspec)
            mspec.loader.exec_module(obj)
        else:
            obj = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
        return obj
    except Exception as exc:  # noqa: BLE001 - the kernel starts anyway; calling the tool says why
        why = f"tools.{spec['name']} could not be imported from {target}: {type(exc).__name__}: {exc}"

        def broken(*args, **kwargs):
            raise ImportError(why)
        broken.__name__, broken.__doc__ = spec["name"], why
        return broken


def make_tools(link, specs: list[dict], plugins_dir: str | None) -> Tools:
    global _link
    _link = link
    if plugins_dir and plugins_dir not in sys.path:
        sys.path.append(plugins_dir)  # kernel tools of workspace plugins live there
    box = Tools()
    for spec in specs:
        fn = _runner_tool(link, spec) if spec["runs"] == "runner" else _kernel_tool(spec)
        setattr(box, spec["name"], fn)
    return box
