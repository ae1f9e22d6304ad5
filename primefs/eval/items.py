"""Where eval items come from: a benchmark plugin, or a user's own `file:items.jsonl`.

A `file:` benchmark has one item per line, `{"id", "task", "context" | "context_file", "expected"}`,
and is scored by a scorer chosen by name: a built-in one (exact, contains, number, f1-set) or a
benchmark plugin's `score`. Bad input is one error naming the file and the line.
"""
from __future__ import annotations

import hashlib
import inspect
import json
import math
import re
from pathlib import Path

from primefs.errors import PrimefsError
from primefs.plugins import chosen_plugins

FILE_PREFIX = "file:"
ITEM_KEYS = ("id", "task", "expected")


# -- scorers ----------------------------------------------------------------------------------------
def _norm(x) -> str:
    text = re.sub(r"\s+", " ", str(x if x is not None else "").strip().casefold())
    return text.strip(" .!?\"'`*")


def _alternatives(expected) -> list:
    """A list `expected` holds accepted answers, any of which scores 1."""
    return list(expected) if isinstance(expected, list) else [expected]


def score_exact(answer, expected) -> float:
    return 1.0 if _norm(answer) in {_norm(e) for e in _alternatives(expected)} else 0.0


def score_contains(answer, expected) -> float:
    text = _norm(answer)
    return 1.0 if any(_norm(e) and _norm(e) in text for e in _alternatives(expected)) else 0.0


_NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def parse_number(text) -> float | None:
    """The last number in the text ("... so the answer is 1,234." -> 1234.0)."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return float(text)
    found = _NUMBER.findall(str(text or ""))
    return float(found[-1].replace(",", "")) if found else None


def score_number(answer, expected) -> float:
    got = parse_number(answer)
    if got is None:
        return 0.0
    for e in _alternatives(expected):
        want = parse_number(e)
        if want is not None and math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-9):
            return 1.0
    return 0.0


def _set_of(value) -> set[str]:
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                return _set_of(json.loads(text))
            except ValueError:
                pass
        parts = text.splitlines() if "\n" in text else re.split(r"[,;]", text)
        return {p for p in (_norm(re.sub(r"^\s*(?:[-*•]|\d+[.)])\s+", "", x)) for x in parts) if p}
    if isinstance(value, (list, tuple, set)):
        return {_norm(", ".join(map(str, x)) if isinstance(x, (list, tuple)) else x) for x in value} - {""}
    return {_norm(value)} - {""}


def score_f1_set(answer, expected) -> float:
    got, want = _set_of(answer), _set_of(expected)
    if not got and not want:
        return 1.0
    hit = len(got & want)
    if not hit:
        return 0.0
    precision, recall = hit / len(got), hit / len(want)
    return 2 * precision * recall / (precision + recall)


SCORERS = {"exact": score_exact, "contains": score_contains, "number": score_number, "f1-set": score_f1_set}


def scorer_for(name: str, plugin_benchmarks: dict):
    """A built-in scorer, else the `score` of the benchmark plugin of that name."""
    if name in SCORERS:
        return SCORERS[name]
    if name in plugin_benchmarks:
        return plugin_benchmarks[name].score
    raise PrimefsError(f"unknown scorer {name!r} (known: {', '.join(SCORERS)}; or a benchmark's: "
                       f"{', '.join(sorted(plugin_benchmarks)) or 'none installed'})")


# -- file: benchmarks -------------------------------------------------------------------------------
class FileBenchmark:
    """Items from a JSONL file; `context_file` paths are relative to the file's folder."""

    def __init__(self, spec: str, scorer: str, plugin_benchmarks: dict):
        self.name = spec
        self.shown = spec[len(FILE_PREFIX):]
        self.path = Path(self.shown).expanduser().resolve()
        if not self.path.is_file():
            raise PrimefsError(f"items file not found: {self.shown} (give file:PATH to a JSONL file)")
        self.scorer_name = scorer
        self._score = scorer_for(scorer, plugin_benchmarks)
        self.description = f"items of {self.shown}, scored by {scorer}"
        self.lines = self._read()

    def _fail(self, lineno: int, what: str):
        raise PrimefsError(f"{self.shown}:{lineno}: {what}")

    def _read(self) -> list[tuple[int, dict]]:
        out, seen = [], {}
        try:
            text = self.path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise PrimefsError(f"{self.shown}: cannot read it: {exc}") from None
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError as exc:
                self._fail(lineno, f"not valid JSON ({exc.msg} at column {exc.colno})")
            if not isinstance(obj, dict):
                self._fail(lineno, "an item is a JSON object with id, task, context or context_file, expected")
            missing = [k for k in ITEM_KEYS if k not in obj]
            if missing:
                self._fail(lineno, f"missing {', '.join(missing)} (an item has id, task, context or "
                                   "context_file, expected)")
            if not isinstance(obj["id"], (str, int)) or isinstance(obj["id"], bool) or not str(obj["id"]).strip():
                self._fail(lineno, f"id must be a non-empty string or a number, not {obj['id']!r}")
            iid = str(obj["id"])
            if iid in seen:
                self._fail(lineno, f"id {iid!r} already used on line {seen[iid]}")
            seen[iid] = lineno
            if not isinstance(obj["task"], str) or not obj["task"].strip():
                self._fail(lineno, "task must be a non-empty string")
            if "context" in obj and "context_file" in obj:
                self._fail(lineno, "give context or context_file, not both")
            if "context_file" in obj:
                if not isinstance(obj["context_file"], str):
                    self._fail(lineno, "context_file must be a path (a string)")
                if not self._context_path(obj["context_file"]).is_file():
                    self._fail(lineno, f"context_file {obj['context_file']!r} not found "
                                       f"(looked at {self._context_path(obj['context_file'])})")
            out.append((lineno, obj))
        if not out:
            raise PrimefsError(f"{self.shown}: no items (one JSON object per line)")
        return out

    def _context_path(self, name: str) -> Path:
        return (self.path.parent / Path(name).expanduser()).resolve()

    def items(self, n: int | None = None, seed: int = 0):
        """The first n items in file order (all when n is None): the seed does not change them."""
        for lineno, obj in self.lines[:n]:
            context = obj.get("context")
            if "context_file" in obj:
                try:
                    context = self._context_path(obj["context_file"]).read_text(encoding="utf-8")
                except (OSError, UnicodeDecodeError) as exc:
                    self._fail(lineno, f"context_file {obj['context_file']!r}: cannot read it ({exc})")
            yield {"id": str(obj["id"]), "task": obj["task"], "context": context, "expected": obj["expected"]}

    def score(self, answer, expected) -> float:
        return float(self._score(answer, expected))

    def oracle(self, item: dict):
        """The expected answer itself (checks the file and the scorer, no model)."""
        e = item["expected"]
        if self.scorer_name == "f1-set" and isinstance(e, list):
            return "\n".join(", ".join(map(str, x)) if isinstance(x, (list, tuple)) else str(x) for x in e)
        if self.scorer_name in SCORERS and isinstance(e, list):  # accepted answers: the first one
            return str(e[0]) if e else ""
        return e

    def source(self) -> dict:
        return {"file": str(self.path), "sha256": hashlib.sha256(self.path.read_bytes()).hexdigest()}


# -- finding a benchmark ----------------------------------------------------------------------------
def find_benchmark(name: str, pm, ws, how: str, *, scorer: str | None = None):
    """The benchmark named `name` (or a file: one). `ws`/`how`: the workspace whose plugins/*.py
    were loaded and how it was found, for an error that says where it looked."""
    from primefs.plugins import benchmarks

    found = benchmarks(pm)
    if name.startswith(FILE_PREFIX):
        return FileBenchmark(name, scorer or "exact", found)
    if scorer is not None:
        raise PrimefsError("a scorer is chosen only for file: benchmarks (a plugin's benchmark scores itself)")
    if name not in found:
        raise PrimefsError(f"unknown benchmark {name!r} (installed: {', '.join(sorted(found)) or 'none'}; "
                           f"looked in {where_looked(ws, how)}; see `primefs eval --list`)")
    return found[name]


def where_looked(ws, how: str) -> str:
    chosen = chosen_plugins()
    if chosen == set():
        return "the built-ins only: PRIMEFS_LOAD_PLUGINS=0 turns plugins off"
    if chosen:
        return f"only the plugins PRIMEFS_LOAD_PLUGINS names ({', '.join(sorted(chosen))})"
    places = "installed packages (entry points of group `primefs`)"
    if ws is None:
        return f"{places}; no workspace plugins: {how}"
    return f"{places} and {ws.root / 'plugins'}/*.py (the workspace {how})"


def bench_items(bench, n: int | None, seed: int, params: dict) -> list[dict]:
    """The benchmark's items; `params` go to items() as keywords, checked against its signature."""
    if params:
        try:
            sig = inspect.signature(bench.items)
        except (TypeError, ValueError):
            sig = None
        takes = [p.name for p in sig.parameters.values() if p.kind is p.KEYWORD_ONLY] if sig else []
        var_kw = sig is not None and any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
        unknown = [k for k in params if k not in takes and not var_kw]
        if unknown:
            raise PrimefsError(f"benchmark {bench.name} takes no parameter {', '.join(map(repr, unknown))} "
                               f"(it takes: {', '.join(takes) or 'none'})")
    try:
        return list(bench.items(n, seed, **params))
    except (ValueError, TypeError) as exc:  # a plugin refusing a parameter's value
        raise PrimefsError(f"benchmark {bench.name}: {exc}") from None


def item_sha(item: dict) -> str:
    """Identifies an item's content: a rerun can tell whether it was given the same items."""
    h = hashlib.sha256()
    ctx = item.get("context")
    for part in (item["task"], ctx if isinstance(ctx, str) else json.dumps(ctx, sort_keys=True, default=str),
                 json.dumps(item["expected"], sort_keys=True, default=str)):
        h.update(part.encode("utf-8", "replace") + b"\0")
    return h.hexdigest()[:16]


def context_chars(item: dict) -> int:
    ctx = item.get("context")
    if ctx is None:
        return 0
    return len(ctx) if isinstance(ctx, str) else len(json.dumps(ctx, ensure_ascii=False))


def plugin_source(pm, bench) -> dict:
    """Which plugin registered the benchmark, and its distribution's version (or a workspace file's hash)."""
    if isinstance(bench, FileBenchmark):
        return bench.source()
    from importlib import metadata

    for impl in pm.hook.register_benchmarks.get_hookimpls():
        got: list = []
        try:
            impl.function(*[got.append for _ in impl.argnames])
        except Exception:
            continue
        if not any(b is bench or getattr(b, "name", None) == bench.name for b in got):
            continue
        module = getattr(impl.plugin, "__name__", type(impl.plugin).__module__)
        out = {"plugin": impl.plugin_name, "module": module}
        path = getattr(impl.plugin, "__file__", None)
        if impl.plugin_name.startswith("workspace:") and path:
            out["sha256"] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
            return out
        dists = metadata.packages_distributions().get(module.split(".")[0], [])
        if dists:
            out["distribution"] = dists[0]
            out["version"] = metadata.version(dists[0])
        return out
    return {"plugin": None}
