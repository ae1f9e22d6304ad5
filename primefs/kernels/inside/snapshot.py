"""Runs inside kernels: snapshots of the user namespace, so a session's variables survive its kernel.

The runner asks for them through the kernel host (kernelhost.KernelHandle.snapshot/restore); see
docs/kernel-api.md, "Variables that survive".
"""
from __future__ import annotations

import json
import os
import time
import types
from pathlib import Path

PROVIDED: dict = {}  # what setup() put in the namespace: defined again in every kernel, never saved
SNAPSHOT, MANIFEST = "snapshot.pkl", "manifest.json"


class _TooBig(Exception):
    pass


class _CappedWriter:
    """A file-like sink that gives up as soon as `limit` bytes are exceeded (pickling stops early)."""

    def __init__(self, limit: int):
        self.limit, self.chunks, self.size = limit, [], 0

    def write(self, data) -> int:
        self.size += len(data)
        if self.size > self.limit:
            raise _TooBig()
        self.chunks.append(bytes(data))
        return len(data)


def _saveable_names(ns: dict) -> list[str]:
    hidden = getattr(_shell(), "user_ns_hidden", {}) or {}
    return [k for k, v in ns.items() if not k.startswith("_") and not (k in PROVIDED and PROVIDED[k] is v)
            and not (k in hidden and hidden[k] is v) and k not in ("In", "Out", "exit", "quit", "get_ipython")]


def _shell():
    try:
        from IPython import get_ipython

        return get_ipython()
    except ImportError:
        return None


def snapshot(folder: str, max_bytes: int, reason: str = "") -> str:
    """Save the user's variables (each pickled with dill on its own) to folder/snapshot.pkl and
    folder/manifest.json; modules are saved by name and imported again. Returns the manifest (JSON)."""
    import dill

    ns = _shell().user_ns
    saved, skipped, modules, blobs, total = [], [], {}, {}, 0
    for name in _saveable_names(ns):
        value = ns[name]
        kind = type(value).__name__
        if isinstance(value, types.ModuleType):
            modules[name] = value.__name__
            continue
        sink = _CappedWriter(max(0, max_bytes - total))
        try:
            dill.dump(value, sink, recurse=True)
        except _TooBig:
            skipped.append({"name": name, "type": kind, "reason": f"over the snapshot size cap ({max_bytes:,} bytes)"})
            continue
        except Exception as exc:  # noqa: BLE001 - whatever a value's pickling raises, the others go on
            skipped.append({"name": name, "type": kind, "reason": f"{type(exc).__name__}: {exc}"[:300]})
            continue
        blobs[name] = b"".join(sink.chunks)
        total += sink.size
        saved.append({"name": name, "type": kind, "bytes": sink.size})
    manifest = {"created": time.time(), "reason": reason, "saved": saved, "skipped": skipped, "modules": modules,
                "bytes": total, "max_bytes": max_bytes}
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    _write_atomic(out / SNAPSHOT, dill.dumps(blobs))
    _write_atomic(out / MANIFEST, json.dumps(manifest, indent=1).encode())
    return json.dumps(manifest)


def restore(folder: str) -> str:
    """Load folder's snapshot into the namespace. Returns {restored, failed, skipped, modules, created}."""
    import importlib

    import dill

    ns = _shell().user_ns
    out = {"restored": [], "failed": [], "skipped": [], "modules": [], "created": None}
    try:
        manifest = json.loads((Path(folder) / MANIFEST).read_text(encoding="utf-8"))
        blobs = dill.loads((Path(folder) / SNAPSHOT).read_bytes())
    except FileNotFoundError:
        return json.dumps(out)
    except Exception as exc:  # noqa: BLE001 - a broken snapshot: nothing restored, and said so
        out["failed"].append({"name": "(snapshot)", "reason": f"{type(exc).__name__}: {exc}"[:300]})
        return json.dumps(out)
    out["created"], out["skipped"] = manifest.get("created"), manifest.get("skipped") or []
    for name, module in (manifest.get("modules") or {}).items():
        try:
            ns[name] = importlib.import_module(module)
            out["modules"].append(name)
        except Exception as exc:  # noqa: BLE001
            out["failed"].append({"name": name, "reason": f"import {module}: {type(exc).__name__}: {exc}"[:300]})
    for name, blob in blobs.items():
        try:
            ns[name] = dill.loads(blob)
            out["restored"].append(name)
        except Exception as exc:  # noqa: BLE001
            out["failed"].append({"name": name, "reason": f"{type(exc).__name__}: {exc}"[:300]})
    return json.dumps(out)


def _write_atomic(path: Path, data: bytes) -> None:
    # Renamed into place (a reader sees the old or the new file, never half of one), not fsynced:
    # a snapshot guards against a runner or kernel dying, not the machine.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
