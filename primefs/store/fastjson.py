"""orjson where its speed matters (status of 50,000 sessions, the index's rows), json where orjson says no.

orjson reads strict JSON only and writes UTF-8 without spaces; what it refuses (NaN, a lone surrogate,
an integer past 64 bits, very deep nesting) goes through json, so nothing that worked before fails.
"""
from __future__ import annotations

import json

import orjson


def loads(text: str | bytes):
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


def dumps(obj, default=str) -> str:
    """One line of JSON (no indentation)."""
    try:
        return orjson.dumps(obj, default=default, option=orjson.OPT_NON_STR_KEYS).decode()
    except TypeError:  # (orjson.JSONEncodeError is one)
        return json.dumps(obj, default=default)
