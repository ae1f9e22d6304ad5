"""The checks settings are made of (settings.py, hosts.py): finite numbers within bounds, bounded text,
and a value named in the user's words. Each error names where the value was (file, key) and what is allowed.
"""
from __future__ import annotations

import math

from primefs.errors import PrimefsError

ABOVE_ZERO = -0.0  # as a lowest bound: the value must be above 0 (a 0 timeout would hang or stop all)


def number(value, where: str, kind: str, low, high):
    """A finite number of the kind, within [low, high] (low -0.0: above 0). Returns it (ints as int)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise PrimefsError(f"{where} must be a finite number, not {value!r}")
    if kind == "int":
        if value != int(value):
            raise PrimefsError(f"{where} must be a whole number, not {value!r}")
        value = int(value)
    positive = low == 0 and math.copysign(1, low) < 0
    if (positive and value <= 0) or value < low or value > high:
        shown = f"above 0 and at most {high:g}" if positive else f"between {low:g} and {high:g}"
        given = f"{value:g}" if abs(value) >= 1e15 else repr(value)  # 1e+99, not the hundred digits of int(1e99)
        raise PrimefsError(f"{where} must be {shown}, not {given}")
    return value


def kind_of(value) -> str:
    """What a YAML value is, in the user's words (not ruamel's class names)."""
    for types, word in ((bool, "true/false"), (dict, "a mapping"), ((list, tuple), "a list"), (str, "text"),
                        ((int, float), "a number")):
        if isinstance(value, types):
            return word
    return "nothing" if value is None else type(value).__name__


def check_text(value, where: str, limit: int = 4096) -> str:
    """Text of at most `limit` characters, without NUL. Returns it."""
    if not isinstance(value, str) or "\0" in value or len(value) > limit:
        raise PrimefsError(f"{where} must be text (at most {limit} characters, no NUL), not {short(value)}")
    return value


def short(value) -> str:
    """A value as an error message shows it: its repr, cut to 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
