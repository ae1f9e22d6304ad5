"""Eval runs for the web view: folders holding results.jsonl (and summary.json, config.yaml; eval.md).

A run's figures are computed from its results.jsonl, so a run is shown the same whatever version wrote
its summary; rows with a `mode` field (e.g. `rlm`, `direct`) are summed per mode. Unreadable lines and
files are skipped and counted, never fatal.
"""
from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from primefs.store.frontmatter import load_yaml

MAX_ROWS = 20000  # lines read from one results.jsonl
MAX_DEPTH = 3  # how deep under an eval folder runs are looked for


def find_runs(roots: list[Path]) -> list[tuple[int, str, Path]]:
    """(root index, path relative to it, folder) of every run under the roots, newest first."""
    found = []
    for i, root in enumerate(roots):
        if not root.is_dir():
            continue
        stack = [(root, 0)]
        while stack:
            folder, depth = stack.pop()
            if (folder / "results.jsonl").is_file():
                found.append((i, folder.relative_to(root).as_posix() or ".", folder))
                continue
            if depth < MAX_DEPTH:
                try:
                    stack.extend((p, depth + 1) for p in folder.iterdir()
                                 if p.is_dir() and not p.name.startswith(".") and p.name != "workspace")
                except OSError:
                    continue
    return sorted(found, key=lambda r: _mtime(r[2]), reverse=True)


def resolve(roots: list[Path], root: int, rel: str) -> Path | None:
    """The run folder named by (root index, relative path), if it is one and stays inside its root."""
    if not 0 <= root < len(roots):
        return None
    base = roots[root].resolve()
    folder = (base / rel).resolve()
    if folder != base and base not in folder.parents:
        return None
    return folder if (folder / "results.jsonl").is_file() else None


def read_rows(folder: Path) -> tuple[list[dict], int]:
    rows, bad = [], 0
    try:
        with open(folder / "results.jsonl", encoding="utf-8", errors="replace") as f:
            for i, line in enumerate(f):
                if i >= MAX_ROWS:
                    break
                try:
                    row = json.loads(line)
                except ValueError:
                    bad += 1
                    continue
                if isinstance(row, dict):
                    rows.append(_checked(row))
                else:
                    bad += 1
    except OSError:
        bad += 1
    return rows, bad


def _checked(row: dict) -> dict:
    """A row as the pages use it: a mode and a session that are text or nothing, numbers that are numbers
    (missing ones stay missing: shown blank, summed as 0)."""
    out = dict(row)
    for key in ("mode", "session"):
        if out.get(key) is not None and not isinstance(out[key], str):
            out[key] = json.dumps(out[key], default=str)
    for key in ("score", "calls", "input_tokens", "output_tokens", "cost_usd", "wall_s"):
        out[key] = None if out.get(key) is None else _num(out[key])
    out["tokens"] = _num(out.get("input_tokens")) + _num(out.get("output_tokens"))
    return out


def _num(v) -> float:
    try:
        n = float(v or 0)
    except (TypeError, ValueError):
        return 0.0
    return n if math.isfinite(n) else 0.0


def summarize(rows: list[dict]) -> dict:
    scores = [_num(r.get("score")) for r in rows]
    return {"items": len(rows), "mean_score": statistics.fmean(scores) if scores else 0.0,
            "tokens": sum(r["tokens"] for r in rows),
            "cost_usd": sum(_num(r.get("cost_usd")) for r in rows), "calls": sum(_num(r.get("calls")) for r in rows),
            "wall_s": sum(_num(r.get("wall_s")) for r in rows)}


def describe(root: int, rel: str, folder: Path) -> dict:
    """A run's header and its figures per mode (one entry, mode None, for runs without modes)."""
    rows, bad = read_rows(folder)
    summary = _json(folder / "summary.json")
    try:
        config = load_yaml(folder / "config.yaml", safe=True) if (folder / "config.yaml").is_file() else {}
    except Exception:
        config = {}
    config = config if isinstance(config, dict) else {}
    modes = sorted({r.get("mode") for r in rows}, key=lambda m: (m is not None, str(m)))
    return {"root": root, "rel": rel, "name": folder.name if rel != "." else folder.resolve().name,
            "benchmark": summary.get("benchmark") or config.get("benchmark") or "?",
            "model": "oracle" if config.get("oracle") or summary.get("oracle") else config.get("model"),
            "modified": _mtime(folder), "bad_lines": bad, "rows": rows,
            "modes": [{"mode": m, **summarize([r for r in rows if r.get("mode") == m])} for m in modes]}


def _json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _mtime(folder: Path) -> float:
    try:
        return (folder / "results.jsonl").stat().st_mtime
    except OSError:
        return 0.0
