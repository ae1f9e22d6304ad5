"""Per-session summaries: `sessions/<id>/summary.json`, a small derived file beside the truth.

A summary holds what `status`, `usage`, `agents` and the runner's start need of a session without
reading its whole history: own usage (calls, tokens in/out, cost, calls of unknown cost, tool calls
per tool, wall time in turns), turns (a resumed turn is not a new turn), the number of events, the
last event, and a copy of the session.yaml fields `status` shows. It is never the truth and is
rebuilt whenever it cannot be trusted. It says how far it has read: the byte offset just past the
last complete line of history.jsonl it counted, the bytes just before that offset, and the stat of
the history and of the session.yaml it copied. So any reader can tell:

- history unchanged (same inode, mtime, size): nothing to read;
- history grew (same file) and the bytes before the offset are the same: only the new lines are read;
- history shorter than the offset, replaced by another file, changed without growing, or the bytes
  before the offset differ; the summary missing, unreadable, of another version, or for another id:
  recount from the start;
- session.yaml changed: parse it again.

Counting is one fold over events, the same for a recount and an update, and the sums are kept
unrounded (rounded only when shown), so an updated summary is exactly a recount. The runner writes
summaries at status changes and turn ends (not at every event); a reader that finds one behind
brings it up to date and writes it back. Every write is atomic (temp file + rename): a runner
killed mid-write leaves the old summary, or none, never half of one. Git-ignored: a runtime file.
"""
from __future__ import annotations

import copy
import io
import json
import math
import os
from pathlib import Path

from primefs.errors import PrimefsError
from primefs.store.frontmatter import load_yaml, loads_yaml
from primefs.store.fsutil import open_regular, write_atomic
from primefs.store.history import NewEvents, check_at, still_there
from primefs.store.settings import check_session_meta

FILE = "summary.json"
VERSION = 1
# What `status` shows of session.yaml (plus `id`): copied so a status needs no YAML parsing.
# "approval": the number of the approval it waits for (runner/approvals.py), else absent
META = ("name", "parent", "depth", "status", "stop_reason", "error", "model", "goal", "created", "updated", "node",
        "approval")


def zero_usage() -> dict:
    return {"calls": 0, "input_tokens": 0, "output_tokens": 0, "cache_read_tokens": 0, "cache_write_tokens": 0,
            "cost_usd": 0.0, "wall_s": 0.0, "cost_unknown_calls": 0, "tool_calls": 0, "tools": {}}


# Counted since summaries had them: an older summary (or index row) lacks them, and its events had none.
CACHE_FIELDS = ("cache_read_tokens", "cache_write_tokens")


def empty(sid: str) -> dict:
    return {"version": VERSION, "id": sid, "offset": 0, "check": "", "history": None, "events": 0,
            "usage": zero_usage(), "turns": 0, "last": None, "meta_key": None, "meta": {}, "broken": None}


def number(value, kind=float):
    """A count from a field a hand-written line may hold anything in: a string, null or NaN count as 0."""
    try:
        n = kind(value or 0)
    except (TypeError, ValueError, OverflowError):  # a hand-written event: counted as nothing
        return kind(0)
    return n if math.isfinite(n) else kind(0)  # NaN or Infinity in a hand-written line: nothing either


def fold(s: dict, e) -> None:
    """Count one event (a parsed history line) into summary `s`: the one usage counter (`primefs usage`,
    status, the web view, budgets and trace counts all count through it)."""
    s["events"] += 1
    if not isinstance(e, dict):
        return
    t, u = e.get("type"), s["usage"]
    if t == "model_call":
        fold_call(u, e)
    elif t == "turn_end":
        u["wall_s"] += number(e.get("elapsed_s"))
    elif t == "tool_call":
        u["tool_calls"] += 1
        per = u["tools"].setdefault(str(e.get("name")), {"calls": 0, "errors": 0, "seconds": 0.0})
        per["calls"] += 1
        per["errors"] += 1 if e.get("error") else 0
        per["seconds"] = round(per["seconds"] + number(e.get("duration_s")), 4)
    elif t == "turn_start" and not e.get("resumed"):
        s["turns"] += 1
    last = {"ts": e.get("ts") if _number(e.get("ts")) else None, "type": str(t)}
    if t == "turn_end" and e.get("outcome"):
        last["outcome"] = str(e["outcome"])
    s["last"] = last


def fold_call(u: dict, e: dict) -> None:
    """Count one model_call event into usage `u` (zero_usage's keys), guarded against what a hand-written
    line may hold (a string, NaN)."""
    u["calls"] += 1
    u["input_tokens"] += number(e.get("input_tokens"), int)
    u["output_tokens"] += number(e.get("output_tokens"), int)
    for k in CACHE_FIELDS:
        u[k] = u.get(k, 0) + number(e.get(k), int)
    u["cost_usd"] += number(e.get("cost_usd"))
    u["cost_unknown_calls"] += 0 if e.get("cost_known") else 1


def usage(s: dict) -> dict:
    """The usage object of `primefs usage` (docs/cli.md), rounded as shown."""
    u = copy.deepcopy(s["usage"])
    for k in CACHE_FIELDS:
        u.setdefault(k, 0)
    u["cost_usd"] = round(u["cost_usd"], 10)
    u["wall_s"] = round(u["wall_s"], 4)
    return u


def stat_key(path) -> list | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_ino, st.st_mtime_ns, st.st_size]


def _forget_history(s: dict) -> None:
    s.update({k: v for k, v in empty(s["id"]).items() if k not in ("meta_key", "meta", "broken")})


def read_history(s: dict, f, size: int, each=None) -> None:
    """Bring `s` up to `size` bytes of the open history `f`: only the new lines if the file was only
    appended to since, else everything again. `each(start, end, event)` also sees every event folded
    (the web view's charts, from the same pass)."""
    if s["offset"] == 0 or not still_there(f, s["offset"], s["check"], size):  # nothing read yet: nothing counted
        _forget_history(s)
    read = NewEvents(f, s["offset"], size)
    for start, end, event in read:
        fold(s, event)
        if each is not None:
            each(start, end, event)
    s["offset"] = read.offset
    s["check"] = check_at(f, s["offset"])


def follow(s: dict, path: Path, each=None) -> bool:
    """Bring `s` up to date with the history at `path` (read_history); False if it had not changed."""
    key = stat_key(path)
    if key == s["history"]:
        return False
    if key is None:  # no history (yet): nothing counted
        _forget_history(s)
        return True
    old = s["history"]
    if old is not None and (key[0] != old[0] or (key[2] == old[2] and key[1] != old[1])):
        _forget_history(s)  # another file, or changed in place without growing: not an append, count again
    try:
        with open_regular(path) as f:
            read_history(s, f, key[2], each)
    except OSError:
        return False
    s["history"] = key
    return True


def meta_fields(meta: dict) -> dict:
    return json.loads(json.dumps({k: meta.get(k) for k in META}, default=str))  # plain JSON values


def _meta(s: dict, folder: Path, meta: dict | None, meta_key) -> bool:
    if meta is not None and meta_key is not None:  # the runner's own copy, written just now
        new = {"meta_key": list(meta_key), "meta": meta_fields(meta), "broken": None}
    else:
        path = folder / "session.yaml"
        key = stat_key(path)  # before reading: a file replaced meanwhile is read again next time
        if key is not None and key == s["meta_key"]:
            return False
        label = f"sessions/{folder.name}/session.yaml"
        try:
            data = check_session_meta(load_yaml(path, safe=True, label=label), label)
            new = {"meta_key": key, "meta": meta_fields(data), "broken": None}
        except (PrimefsError, OSError) as exc:
            new = {"meta_key": key, "meta": {}, "broken": str(exc)}
    if all(s.get(k) == v for k, v in new.items()):
        return False
    s.update(new)
    return True


def load(folder: Path) -> dict | None:
    """The summary file as written, or None if missing or not one of ours."""
    try:
        with open_regular(Path(folder) / FILE) as f:
            data = json.loads(f.read())
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or data.get("version") != VERSION or data.get("id") != Path(folder).name:
        return None
    return data if _well_formed(data) else None


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _well_formed(d: dict) -> bool:
    """Every field of the type a summary has, down to each tool's counts and the last event (a file
    edited by hand is rebuilt, not trusted: a wrong type would crash `usage`, `status` or `archive`)."""
    def key(v) -> bool:
        return v is None or (isinstance(v, list) and len(v) == 3 and all(
            isinstance(x, int) and not isinstance(x, bool) for x in v))

    def tool(v) -> bool:
        return (isinstance(v, dict) and set(v) == {"calls", "errors", "seconds"} and _number(v["seconds"])
                and all(isinstance(v[k], int) and not isinstance(v[k], bool) and v[k] >= 0 for k in ("calls", "errors")))

    def last(v) -> bool:
        return v is None or (isinstance(v, dict) and set(v) <= {"ts", "type", "outcome"} and "type" in v
                             and (v.get("ts") is None or _number(v["ts"]))
                             and all(isinstance(v[k], str) for k in ("type", "outcome") if k in v))

    def meta(v) -> bool:
        return isinstance(v, dict) and set(v) <= set(META) and all(
            x is None or isinstance(x, str) or (k == "depth" and _number(x)) for k, x in v.items())

    try:
        u = d["usage"]
        bytes.fromhex(d["check"])
        return (set(d) == set(empty("")) and set(u) == set(zero_usage()) and isinstance(u["tools"], dict)
                and all(_number(u[k]) for k in u if k != "tools")
                and all(isinstance(n, str) and tool(v) for n, v in u["tools"].items())
                and all(isinstance(d[k], int) and not isinstance(d[k], bool) and d[k] >= 0
                        for k in ("offset", "events", "turns"))
                and key(d["history"]) and key(d["meta_key"]) and meta(d["meta"])
                and last(d["last"]) and isinstance(d["broken"], (str, type(None))))
    except (KeyError, TypeError, ValueError, AttributeError):
        return False


def fresh(folder: Path, prev: dict | None = None, *, meta: dict | None = None, meta_key=None,
          write: bool = True) -> dict:
    """The session's summary, current with its files. `prev`: a summary already in memory (else the
    file is read); `meta`/`meta_key`: the session.yaml content and stat the caller just wrote or read.
    Written back (atomically, best effort) when it changed and `write`."""
    folder = Path(folder)
    s = copy.deepcopy(prev) if prev is not None else load(folder)
    changed = s is None
    for attempt in (0, 1):
        if s is None:
            s = empty(folder.name)
        try:
            changed = follow(s, folder / "history.jsonl") | changed
            changed = _meta(s, folder, meta, meta_key) | changed
            break
        except (TypeError, KeyError, ValueError, AttributeError, IndexError):  # a summary edited by hand
            if attempt:
                raise
            s, changed = None, True
    if changed and write:
        try:
            write_atomic(folder / FILE, json.dumps(s, separators=(",", ":")), durable=False)
        except OSError:  # a read-only workspace, a folder removed meanwhile: still a good answer
            pass
    return s


def of_contents(sid: str, history: bytes, session_yaml: str) -> dict:
    """The summary of a session known by its files' contents (an archived session: archive.py)."""
    s = empty(sid)
    read_history(s, io.BytesIO(history), len(history))
    label = f"sessions/{sid}/session.yaml"
    try:
        s["meta"] = meta_fields(check_session_meta(loads_yaml(session_yaml, label, safe=True), label))
    except PrimefsError as exc:
        s["broken"] = str(exc)
    return s


def recount(folder: Path) -> dict:
    """A summary counted from nothing (not written): what every summary must equal."""
    return fresh(folder, empty(Path(folder).name), write=False)
