"""Tools: functions that code in a kernel calls, added by plugins (`register_tools`) and MCP servers.

The model's one tool stays `python`; a primefs tool is a function in the kernel's `tools`
namespace, listed in the system prompt with its signature and one line. A tool runs either
- in the kernel (`runs="kernel"`): an importable function (`"module:attr"`, or a function object
  whose module can be imported, or a workspace plugin file), imported when the kernel starts; or
- in the runner (`runs="runner"`): the kernel gets a stub with the same signature that calls it
  over the kernel socket as the calling session, so the function may hold clients and credentials
  a kernel must never see. Arguments and results are JSON values.
"""
from __future__ import annotations

import fnmatch
import importlib
import inspect
import keyword
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from primefs.errors import PrimefsError

RUNS = ("kernel", "runner")
PROMPT_BUDGET_CHARS = 2000  # beyond this the prompt lists tool names only


@dataclass
class Tool:
    name: str
    runs: str
    plugin: str                     # where it came from: a plugin name, or `mcp:<server>`
    description: str = ""           # one line
    doc: str = ""                   # the whole docstring (help(tools.NAME))
    params: list[dict] = field(default_factory=list)  # [{name, kind, default?, annotation?}] (JSON)
    returns: str | None = None
    target: str | None = None       # kernel tools: "module:attr" or "/path/file.py:attr"
    fn: Callable | None = None      # runner tools
    problem: str | None = None      # why it cannot be used (listed by `primefs tools`, never offered)
    keeps_time: bool = False        # runner tools that keep limits.tool_timeout_s themselves (MCP: kill first)

    @property
    def signature(self) -> str:
        parts, star = [], False
        for p in self.params:
            kind = p["kind"]
            if kind == "KEYWORD_ONLY" and not star:
                parts.append("*")
                star = True
            prefix = {"VAR_POSITIONAL": "*", "VAR_KEYWORD": "**"}.get(kind, "")
            star = star or kind == "VAR_POSITIONAL"
            text = prefix + p["name"] + (f": {p['annotation']}" if p.get("annotation") else "")
            if "default" in p:
                text += f" = {p['default']}" if p.get("annotation") else f"={p['default']}"
            parts.append(text)
        return f"({', '.join(parts)})" + (f" -> {self.returns}" if self.returns else "")

    def spec(self) -> dict:
        """What the kernel needs to build `tools.NAME` (JSON)."""
        return {"name": self.name, "runs": self.runs, "doc": self.doc, "params": self.params,
                "returns": self.returns, "target": self.target}

    def record(self) -> dict:
        """`primefs tools --json`."""
        return {"name": self.name, "runs": self.runs, "plugin": self.plugin, "signature": self.signature,
                "description": self.description, "problem": self.problem}


def describe(fn: Callable) -> tuple[list[dict], str | None, str, str]:
    """(params, returns, one line, whole doc) of a function, as plain data."""
    sig = inspect.signature(fn)
    params = []
    for p in sig.parameters.values():
        d = {"name": p.name, "kind": p.kind.name}
        if p.default is not p.empty:
            d["default"] = repr(p.default)
        if p.annotation is not p.empty:
            d["annotation"] = inspect.formatannotation(p.annotation)
        params.append(d)
    returns = None if sig.return_annotation is sig.empty else inspect.formatannotation(sig.return_annotation)
    doc = inspect.getdoc(fn) or ""
    return params, returns, (doc.strip().splitlines() or [""])[0], doc


def check_tool_name(name) -> str:
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name) or len(name) > 64 \
            or name.startswith("_"):
        raise PrimefsError(f"invalid tool name {name!r}: use a Python identifier (letters, digits, '_'; "
                           "not starting with '_' or a digit; max 64)")
    return name


def kernel_target(fn_or_path, plugins_dir: Path | None) -> tuple[str, Callable]:
    """A kernel tool's importable form ("module:attr" or "/file.py:attr") and the function itself."""
    if isinstance(fn_or_path, str):
        module, sep, attr = fn_or_path.partition(":")
        if not sep or not module or not attr:
            raise PrimefsError(f"a kernel tool is 'module:attr', not {fn_or_path!r}")
        return fn_or_path, _import(module, attr, plugins_dir)
    fn = fn_or_path
    module = getattr(fn, "__module__", "") or ""
    if module.startswith("primefs_workspace_plugin_"):  # a plugins/*.py file: not importable by name
        return f"{inspect.getsourcefile(fn)}:{fn.__qualname__}", fn
    return f"{module}:{fn.__qualname__}", fn


def _import(module: str, attr: str, plugins_dir: Path | None) -> Callable:
    added = plugins_dir is not None and str(plugins_dir) not in sys.path
    if added:
        sys.path.append(str(plugins_dir))
    try:
        obj = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
        return obj
    except Exception as exc:
        raise PrimefsError(f"cannot import {module}:{attr}: {type(exc).__name__}: {exc}") from None
    finally:
        if added:
            sys.path.remove(str(plugins_dir))


def make_tool(fn_or_path, *, runs: str, plugin: str, name: str | None = None, description: str | None = None,
              plugins_dir: Path | None = None) -> Tool:
    """A Tool from one `register(...)` call. Problems (bad name, bad target) are kept on the Tool."""
    label = name or getattr(fn_or_path, "__name__", None) or str(fn_or_path).rpartition(":")[2] or "?"
    tool = Tool(name=str(label), runs=str(runs), plugin=plugin)
    try:
        if runs not in RUNS:
            raise PrimefsError(f"runs must be 'kernel' or 'runner', not {runs!r}")
        check_tool_name(tool.name)
        if runs == "kernel":
            tool.target, fn = kernel_target(fn_or_path, plugins_dir)
        else:
            fn = fn_or_path
            if not callable(fn):
                raise PrimefsError(f"a runner tool is a function, not {fn!r}")
            tool.fn = fn
        tool.params, tool.returns, tool.description, tool.doc = describe(fn)
    except PrimefsError as exc:
        tool.problem = f"tool {tool.name!r} from {plugin}: {exc}"
    except (TypeError, ValueError) as exc:  # no signature to be had
        tool.problem = f"tool {tool.name!r} from {plugin}: {exc}"
    if description:
        tool.description = " ".join(str(description).split())
    return tool


def collect(pm, plugins_dir: Path | None = None) -> list[Tool]:
    """Every tool the plugins register, in order; the first of a name wins, later ones are problems."""
    found: list[Tool] = []
    for impl in reversed(pm.hook.register_tools.get_hookimpls()):  # pluggy's call order: workspace plugins first
        plugin = impl.plugin_name

        def register(fn_or_path, runs: str = "kernel", name: str | None = None, description: str | None = None,
                     _plugin=plugin, **_ignored) -> None:
            found.append(make_tool(fn_or_path, runs=runs, plugin=_plugin, name=name, description=description,
                                   plugins_dir=plugins_dir))

        try:
            impl.function(register=register)
        except Exception as exc:  # a broken plugin is listed, never fatal
            found.append(Tool(name=f"({plugin})", runs="?", plugin=plugin,
                              problem=f"plugin {plugin}: register_tools raised {type(exc).__name__}: {exc}"))
    return dedupe(found)


def dedupe(tools: list[Tool]) -> list[Tool]:
    seen: dict[str, Tool] = {}
    for t in tools:
        if t.problem is None and t.name in seen:
            t.problem = f"tool {t.name!r} from {t.plugin}: the name is taken by {seen[t.name].plugin}"
        elif t.problem is None:
            seen[t.name] = t
    return tools


def check_selection(value, where: str) -> list[str] | None:
    """A goal's or subagent spec's `tools:`: a list of names or patterns, or "a, b" (Claude Code's
    form); `all` or absent: every tool; `[]` or `none`: no tool."""
    if value is None or value == "all":
        return None
    if value == "none":
        return []
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise PrimefsError(f"{where}: `tools:` is a list of tool names (or patterns such as 'github_*'), "
                           "'all' or 'none'")
    return [v.strip() for v in value]


def select(tools: list[Tool], wanted: list[str] | None) -> tuple[list[Tool], list[str]]:
    """The usable tools a selection names, and the names/patterns that matched none."""
    usable = [t for t in tools if t.problem is None]
    if wanted is None:
        return usable, []
    chosen = [t for t in usable if any(fnmatch.fnmatchcase(t.name, w) for w in wanted)]
    unknown = [w for w in wanted if not any(fnmatch.fnmatchcase(t.name, w) for t in usable)]
    return chosen, unknown


def render_for_prompt(tools: list[Tool], budget: int = PROMPT_BUDGET_CHARS) -> str:
    if not tools:
        return ""
    head = "## Tools\nCall them from code as `tools.NAME(...)` (also as `NAME(...)` where that shadows nothing)."
    lines = [f"- `{t.name}{t.signature}`: {t.description or '(no description)'}" for t in tools]
    if sum(len(x) + 1 for x in lines) <= budget:
        return head + "\n" + "\n".join(lines)
    return (head + f" {len(tools)} tools: " + ", ".join(f"`{t.name}`" for t in tools)
            + ".\n`help(tools.NAME)` shows a tool's signature and description.")
