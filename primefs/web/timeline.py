"""A page of one history: the last N events, read backwards from the end, never the whole file.

Offsets are byte offsets into history.jsonl. The file is append-only, so an offset taken now still
points at the same line later: "earlier" links carry the offset the page starts at, and the live
stream carries the offset it has read up to (also as the SSE event id, so a reconnect resumes there).
"""
from __future__ import annotations

import os
from pathlib import Path

from primefs.store.fsutil import open_regular
from primefs.store.history import line_start, parse_event

BLOCK = 65536


def line_end(path: Path, size: int | None = None) -> int:
    """Offset just past the last complete line at or before `size` (default, or past it: the file's end)."""
    try:
        end = os.stat(path).st_size
    except OSError:
        return 0
    return line_start(path, end if size is None else min(size, end))


def tail_events(path: Path, limit: int, before: int | None = None) -> tuple[list[dict], int, int]:
    """Up to `limit` complete events ending at offset `before` (default: the end of the file).

    Returns (events, start, end): `start` is the offset of the first line taken (0 when the page
    reaches the beginning), `end` the offset just past the last. Garbled lines are skipped."""
    end = line_end(path, before)
    taken: list[bytes] = []  # newest first
    start = end
    try:
        with open_regular(path) as f:
            pos, buf = end, b""  # buf: the bytes from pos up to start, whole lines only at its end
            while len(taken) < limit:
                if buf:
                    i = buf.rfind(b"\n", 0, len(buf) - 1)
                    if i >= 0 or pos == 0:  # the last line of buf is whole: take it
                        taken.append(buf[i + 1:])
                        buf, start = buf[:i + 1], pos + i + 1
                        continue
                if pos == 0:
                    break
                read_from = max(0, pos - BLOCK)
                f.seek(read_from)
                buf = f.read(pos - read_from) + buf
                pos = read_from
    except OSError:  # missing, or not a regular file
        return [], 0, 0
    events = []
    for line in reversed(taken):
        e = parse_event(line)
        if e is not None:
            events.append(e)
    return events, start, end
