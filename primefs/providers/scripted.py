"""The ``scripted`` provider: replies from a script file, no network, no litellm.

Model id ``scripted/<path>`` (path relative to the workspace, or absolute), or an alias with
``provider: scripted`` and ``script: <path>``. See ``script.py`` for the file format.
"""
from __future__ import annotations

import json
import threading
from pathlib import Path

from primefs.providers.base import ModelError, ModelReply, ToolCall
from primefs.providers.script import estimate_tokens, fenced, load_script, next_reply, prompt_tokens


def script_path(settings: dict) -> Path:
    """The script file: relative to the workspace (wherever the runner was started), and inside it."""
    root = Path(settings.get("workspace") or ".").resolve()
    given = str(settings.get("script") or settings["model"].split("/", 1)[1])
    try:
        path = (root / given).resolve()
    except (OSError, ValueError, RuntimeError) as exc:
        raise ModelError(f"script file {given!r} cannot be used: {exc}", retryable=False) from None
    if not path.is_relative_to(root):
        raise ModelError(f"script file {given} is outside the workspace {root}; copy it in", retryable=False)
    if path.is_relative_to(root / "sessions"):  # a kernel's room: its script would be a model it controls
        raise ModelError(f"script file {given} is in a session's folder, which a kernel may write; keep it "
                         "elsewhere in the workspace", retryable=False)
    return path


class ScriptedProvider:
    name = "scripted"

    def __init__(self):
        self._cache: dict[str, tuple[float, dict]] = {}
        self._lock = threading.Lock()

    def matches(self, model_id: str) -> bool:
        return model_id.startswith("scripted/")  # or an alias with `provider: scripted` and `script:`

    def _script(self, p: Path) -> dict:
        path = str(p)
        try:
            mtime = p.stat().st_mtime
        except OSError:
            raise ModelError(f"script file not found: {path}", retryable=False)
        with self._lock:
            cached = self._cache.get(path)
        if cached and cached[0] == mtime:
            return cached[1]
        try:  # (not under the lock: one slow file, which a kernel may name, must not hold every session's call)
            script = load_script(p)
        except Exception as exc:
            raise ModelError(f"bad script file {path}: {exc}", retryable=False)
        with self._lock:
            self._cache[path] = (mtime, script)
        return script

    def complete(self, messages, tools, settings) -> ModelReply:
        reply = next_reply(self._script(script_path(settings)), messages)
        text, code = reply.get("text", "") or "", reply.get("code")
        calls = []
        if code is not None and tools:
            calls = [ToolCall(id="call_0", name="python", arguments=json.dumps({"code": code}))]
        elif code is not None:
            text = fenced(text, code)
        usage = reply.get("usage") or {}
        out = text + "".join(c.arguments for c in calls)
        return ModelReply(
            text=text,
            tool_calls=calls,
            input_tokens=int(usage.get("input_tokens", prompt_tokens(messages))),
            output_tokens=int(usage.get("output_tokens", estimate_tokens(out))),
            cache_read_tokens=int(usage.get("cache_read_tokens", 0)),
            cache_write_tokens=int(usage.get("cache_write_tokens", 0)),
            cost_usd=float(reply.get("cost_usd", 0.0)),
            cost_known=True,  # a script's calls cost what it says: nothing, unless it sets cost_usd
            model=settings["model"],
        )
