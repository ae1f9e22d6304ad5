"""The conversation a model sees is derived from history events: one mapping, used live and on reload."""
from __future__ import annotations

import json
import re

RESUMED = "The runner restarted while you were working; the last cell was interrupted. Continue."
INTERRUPTED = "interrupted by a runner restart"  # a cell the dead runner never saw end (tracereplay finds it)
FENCE = re.compile(r"```(?:python3?|py|ipython)[ \t]*\n(.*?)```", re.DOTALL)


def fenced_code(text: str) -> list[str]:
    return [m.strip("\n") for m in FENCE.findall(text or "") if m.strip()]


def message_text(sender: str, kind: str, text: str) -> str:
    return f"[{kind} from {sender}]\n{text}"


def to_messages(event: dict, tool_mode: str) -> list[dict]:
    """Chat messages for one history event (most events add none)."""
    t = event["type"]
    if t == "task":
        return [{"role": "user", "content": event["text"]}]
    if t == "message":
        if event.get("read_by"):  # read by code (inbox/recv/wait), not shown as a prompt
            return []
        return [{"role": "user", "content": message_text(event["from"], event["kind"], event["text"])}]
    if t == "notice":  # the harness speaking to the model (e.g. after a restart)
        return [{"role": "user", "content": f"[primefs] {event['text']}"}]
    if t == "assistant":
        if tool_mode == "native" and event.get("calls"):
            return [{"role": "assistant", "content": event.get("text") or None,
                     "tool_calls": [{"id": c["id"], "type": "function",
                                     "function": {"name": c["name"], "arguments": c["arguments"]}}
                                    for c in event["calls"]]}]
        return [{"role": "assistant", "content": event.get("text") or ""}]
    if t == "cell":
        if tool_mode == "native" and event.get("call_id"):
            return [{"role": "tool", "tool_call_id": event["call_id"], "content": event["shown"]}]
        return [{"role": "user", "content": f"Output:\n{event['shown']}"}]
    return []


def rebuild(events: list[dict], tool_mode: str) -> list[dict]:
    """The conversation from history: after a compaction, its summary replaces what it covered."""
    last = next((e for e in reversed(events) if e["type"] == "compaction"), None)
    messages: list[dict] = []
    if last is not None:
        messages.append({"role": "user", "content": "[primefs] Earlier work was compacted into this summary (the "
                                                    "full history is in `history.events()` / `history.search()`):\n"
                                                    + last["summary"]})
    for e in events:
        if last is None or not isinstance(e.get("n"), int) or e["n"] > last["upto_n"]:
            messages.extend(to_messages(e, tool_mode))
    return messages


def code_of_call(name: str, arguments: str) -> tuple[str | None, str | None]:
    """(code, error) for one native tool call."""
    if name != "python":
        return None, f"unknown tool {name!r}: the only tool is `python` with argument `code`"
    try:
        args = json.loads(arguments or "{}")
    except ValueError as exc:
        return None, f"tool arguments are not valid JSON ({exc}); send {{\"code\": \"...\"}}"
    code = args.get("code") if isinstance(args, dict) else None
    if not isinstance(code, str):
        return None, "the `python` tool needs a string argument `code`"
    return code, None
