"""The plugin manager: built-ins, installed plugins (entry-point group `primefs`), workspace plugins/*.py.

Set PRIMEFS_LOAD_PLUGINS=0 to load only the built-ins (tests, or to rule out a broken plugin), or to a
comma-separated list of names to load only those (`needle,mytools`: entry-point names, workspace files by stem).
A workspace plugin that fails to import is reported and skipped, never fatal; one that is not trusted
(trust.py: new, or changed since `primefs trust`) is reported and never imported.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import warnings
from pathlib import Path

import pluggy

from primefs import hookspecs

# The built-in plugins (plugin name, module): registered first, through the same hooks as any other.
DEFAULT_PLUGINS = (("primefs.builtin", "primefs.default_plugins.providers"),
                   ("primefs.builtin-end-conditions", "primefs.default_plugins.end_conditions"))


def chosen_plugins() -> set[str] | None:
    """What PRIMEFS_LOAD_PLUGINS asks for: None for every plugin (unset or `1`), an empty set for the
    built-ins only (`0` or empty), else the names in its comma-separated list (entry-point names,
    workspace plugin files by stem)."""
    value = os.environ.get("PRIMEFS_LOAD_PLUGINS", "1").strip()
    if value == "1":
        return None
    return {n.strip() for n in value.split(",") if n.strip() and n.strip() != "0"}


def plugin_manager(workspace_root: Path | None = None) -> pluggy.PluginManager:
    pm = pluggy.PluginManager("primefs")
    pm.add_hookspecs(hookspecs)
    pm.primefs_failed = []  # plugins that did not load: {name, source, kind, error} (`primefs plugins`)
    for name, module in DEFAULT_PLUGINS:
        pm.register(importlib.import_module(module), name=name)
    chosen = chosen_plugins()
    if chosen is None or chosen:
        _load_entry_points(pm, chosen)
        if workspace_root is not None:
            from primefs.store import trust
            from primefs.store.workspace import Workspace

            ws = Workspace(workspace_root)
            for path in sorted(ws.plugins.glob("*.py")):
                if chosen is not None and path.stem not in chosen:
                    continue
                rel = path.relative_to(ws.root).as_posix()
                if trust.trusted(ws, rel):
                    _load_file(pm, path)
                else:
                    pm.primefs_failed.append({"name": f"workspace:{path.name}", "source": str(path),
                                              "kind": "workspace file",
                                              "error": trust.untrusted_note(rel, "this plugin is")})
    if chosen:
        _say_unknown(pm, chosen)
    return pm


def _say_unknown(pm: pluggy.PluginManager, chosen: set[str]) -> None:
    """Names PRIMEFS_LOAD_PLUGINS gives that match no plugin: a typo must not look like a plugin with no hooks."""
    seen = {n.removeprefix("workspace:").removesuffix(".py") for n, _ in pm.list_name_plugin()}
    seen |= {f["name"].removeprefix("workspace:").removesuffix(".py") for f in pm.primefs_failed}
    for name in sorted(chosen - seen):
        pm.primefs_failed.append({"name": name, "source": "PRIMEFS_LOAD_PLUGINS", "kind": "chosen",
                                  "error": "no installed plugin (entry point) or workspace plugin file has this name"})


def _load_entry_points(pm: pluggy.PluginManager, chosen: set[str] | None) -> None:
    from importlib.metadata import entry_points

    for ep in entry_points(group="primefs"):
        if pm.get_plugin(ep.name) is not None or (chosen is not None and ep.name not in chosen):
            continue
        try:
            pm.register(ep.load(), name=ep.name)
        except Exception as exc:
            pm.primefs_failed.append({"name": ep.name, "source": ep.value, "kind": "entry point",
                                      "error": f"{type(exc).__name__}: {exc}"})
            warnings.warn(f"plugin {ep.name} ({ep.value}) not loaded: {type(exc).__name__}: {exc}", stacklevel=2)


def _load_file(pm: pluggy.PluginManager, path: Path) -> None:
    name = f"primefs_workspace_plugin_{path.stem}"
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        pm.register(module, name=f"workspace:{path.name}")
    except Exception as exc:
        pm.primefs_failed.append({"name": f"workspace:{path.name}", "source": str(path), "kind": "workspace file",
                                  "error": f"{type(exc).__name__}: {exc}"})
        warnings.warn(f"plugin {path} not loaded: {type(exc).__name__}: {exc}", stacklevel=2)


def plugin_report(pm: pluggy.PluginManager) -> list[dict]:
    """Every plugin: loaded ones with where they came from and the hooks they implement, then failures."""
    out = []
    for name, plugin in pm.list_name_plugin():
        kind = "built-in" if name.startswith("primefs.builtin") else \
            "workspace file" if name.startswith("workspace:") else "entry point"
        source = getattr(plugin, "__file__", None) or getattr(type(plugin), "__module__", "")
        hooks = sorted(h.name for h in pm.get_hookcallers(plugin) or [])
        out.append({"name": name, "kind": kind, "source": source, "loaded": True, "hooks": hooks, "error": None})
    out += [{**f, "loaded": False, "hooks": []} for f in getattr(pm, "primefs_failed", [])]
    return out


def providers(pm: pluggy.PluginManager) -> list:
    """Plugin providers first (pluggy calls later registrations first), built-ins last."""
    found: list = []
    pm.hook.register_providers(register=found.append)
    return found


def end_conditions(pm: pluggy.PluginManager) -> dict:
    """name -> check(arg, ctx) -> (passed, report), from every plugin."""
    found: dict = {}
    pm.hook.register_end_conditions(register=lambda name, check: found.setdefault(name, check))
    return found


def benchmarks(pm: pluggy.PluginManager) -> dict:
    """name -> benchmark object, from every plugin."""
    found: list = []
    pm.hook.register_benchmarks(register=found.append)
    return {b.name: b for b in found}


def provider_for(found: list, model_id: str, name: str | None = None):
    """The provider named `name` (an alias's `provider:`), else the first that matches the model id."""
    for p in found:
        if (p.name == name) if name else p.matches(model_id):
            return p
    raise LookupError(f"no provider {name!r}" if name else f"no provider for model {model_id!r}")
