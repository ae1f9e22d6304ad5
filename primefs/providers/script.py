"""Scripted model replies, for tests, benchmarks and replayable demos.

A script is YAML (or JSON) of this shape::

    rules:
      - match: "largest files"     # regex searched in the first user message; omit to match all
        replies:
          - code: "print(1 + 1)"   # the model runs this cell (a tool call, or a ```python fence)
          - text: "It is 2."       # a reply without code ends the turn
    default:                       # optional: replies when no rule matches
      - text: "ok"

A plain list of rules, or a plain list of replies, is accepted too. Which reply comes next is
derived from the conversation itself (the number of assistant messages so far), so the
same script drives many concurrent sessions deterministically and needs no state.
A reply may carry ``usage: {input_tokens, output_tokens}``; otherwise tokens are estimated
as characters / 4, rounded up. Past the last reply the model answers ``(script exhausted)``.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from primefs.store.fsutil import read_regular

EXHAUSTED = {"text": "(script exhausted)"}


def load_script(path: str | Path) -> dict:
    from ruamel.yaml import YAML

    text = read_regular(path)  # (a FIFO a kernel named as its model's script: refused, not waited on)
    data = YAML(typ="safe").load(text) if not str(path).endswith(".json") else json.loads(text)
    return normalize_script(data)


def normalize_script(data: Any) -> dict:
    if isinstance(data, dict) and ("rules" in data or "default" in data):
        rules, default = list(data.get("rules") or []), list(data.get("default") or [])
    elif isinstance(data, list) and data and all(isinstance(r, dict) and "replies" in r for r in data):
        rules, default = data, []
    elif isinstance(data, list):
        rules, default = [], data
    else:
        raise ValueError("a script is a mapping with 'rules'/'default', or a list of rules or replies")
    for rule in rules:
        if not isinstance(rule.get("replies"), list):
            raise ValueError(f"script rule {rule!r} has no 'replies' list")
    return {"rules": rules, "default": default}


def _text_of(message: dict) -> str:
    content = message.get("content") or ""
    if isinstance(content, list):  # OpenAI content parts
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content


def next_reply(script: dict, messages: list[dict]) -> dict:
    """The reply the script gives to this conversation."""
    first_user = next((_text_of(m) for m in messages if m.get("role") == "user"), "")
    replies = script["default"]
    for rule in script["rules"]:
        pattern = rule.get("match")
        if pattern is None or re.search(pattern, first_user):
            replies = rule["replies"]
            break
    index = sum(1 for m in messages if m.get("role") == "assistant")
    return replies[index] if index < len(replies) else EXHAUSTED


def estimate_tokens(text: str) -> int:
    return math.ceil(len(text) / 4) if text else 0


def prompt_tokens(messages: list[dict]) -> int:
    total = 0
    for m in messages:
        total += estimate_tokens(_text_of(m))
        for call in m.get("tool_calls") or []:
            total += estimate_tokens(call.get("function", {}).get("arguments", ""))
    return total


def fenced(text: str, code: str) -> str:
    """A reply's text with its code as a ```python fence, for models without tool calls."""
    parts = [text] if text else []
    parts.append(f"```python\n{code}\n```")
    return "\n\n".join(parts)
