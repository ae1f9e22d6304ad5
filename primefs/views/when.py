"""Times as people write and read them: `30m`/`2026-11-29` in options, `3m05s` in tables."""
from __future__ import annotations

import re
import time
from datetime import datetime

from primefs.errors import PrimefsError

RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|h|d|w)$")
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_when(text: str | None, option: str) -> float | None:
    """`2026-11-29`, `2026-11-29 14:00[:00]` (local time, or with an offset), or `30m`/`2h`/`7d`/`1w` ago."""
    if text is None:
        return None
    value = text.strip()
    m = RELATIVE.match(value)
    if m:
        return time.time() - float(m.group(1)) * UNITS[m.group(2)]
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        raise PrimefsError(f"{option}: {text!r} is not a date: use 2026-11-29, '2026-11-29 14:00', or 30m, 2h, 7d "
                           "(that long ago)") from None


def human_age(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"
