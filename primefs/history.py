"""history.jsonl: an append-only event log, one small JSON object per line.

Each record is written with one O_APPEND write, so concurrent appends never interleave and a
crash can tear at most the last line. Readers skip a torn last line; a writer that opens the
log truncates a torn tail before appending (see design notes: big single writes tear on SIGKILL,
so large outputs should be kept short or stored as separate files).
"""
from __future__ import annotations

import errno
import json
import os
import stat
import threading
import time
from pathlib import Path
from typing import Iterator

from . import livefeed, redact
from .fsutil import NotRegular, open_regular


def now() -> float:
    return round(time.time(), 6)


class History:
    def __init__(self, path: Path):
        self.path = Path(path)
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._seq: int | None = None

    def _open(self) -> int:
        if self._fd is None:
            repair_tail(self.path)
            self._seq = sum(1 for _ in iter_events(self.path))
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO planted in its place: refuse, never block
                os.close(fd)
                raise NotRegular(errno.EINVAL, "not a regular file", str(self.path))
            os.set_blocking(fd, True)
            self._fd = fd
        return self._fd

    def append(self, type: str, **fields) -> dict:
        """Append an event; returns it (with `ts`, `type` and a per-session sequence number `n`).
        Known secrets in its fields are redacted first (redact.py)."""
        fields = redact.value(fields)
        with self._lock:
            fd = self._open()
            event = {"ts": now(), "type": type, "n": self._seq, **fields}
            os.write(fd, (json.dumps(event, ensure_ascii=False, default=str) + "\n").encode("utf-8"))
            self._seq += 1
        if livefeed._listeners:  # `run -v` in this process
            livefeed.publish(self.path.parent.name, event)
        return event

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


def repair_tail(path: Path) -> bool:
    """Cut a torn (unterminated) last line left by a crash. Returns True if it cut something."""
    try:
        with open_regular(path, "rb+") as f:
            size = f.seek(0, os.SEEK_END)
            if size == 0:
                return False
            f.seek(max(0, size - 1))
            if f.read(1) == b"\n":
                return False
            # find the start of the torn line
            pos, chunk = size, 65536
            while pos > 0:
                start = max(0, pos - chunk)
                f.seek(start)
                data = f.read(pos - start)
                i = data.rfind(b"\n")
                if i >= 0:
                    f.truncate(start + i + 1)
                    return True
                pos = start
            f.truncate(0)
            return True
    except OSError:  # missing, or not a regular file (the writer refuses it)
        return False


def iter_events(path: Path) -> Iterator[dict]:
    """Every complete event; a torn or garbled line is skipped."""
    try:
        f = open_regular(path)
    except OSError:  # missing, or not a regular file: no events
        return
    with f:
        yield from events_of(f)


def events_of(f) -> Iterator[dict]:
    """The complete events of an open binary file of JSON lines; a torn or garbled line is skipped."""
    for line in f:
        if not line.endswith(b"\n"):
            break
        try:
            yield json.loads(line)
        except ValueError:
            continue


def iter_lines(f, start: int, end: int, chunk: int = 1 << 22) -> Iterator[tuple[int, bytes]]:
    """(offset just past the line, the line) for every complete line of an open binary file between
    `start` (a line start) and `end`; an unterminated last line is not yielded. Reads in chunks, so a
    history of any size costs little memory."""
    f.seek(start)
    pos, rest = start, b""
    while pos < end:
        data = f.read(min(chunk, end - pos))
        if not data:
            break
        pos += len(data)
        data, cut = rest + data, 0
        base = pos - len(data)
        while True:
            i = data.find(b"\n", cut)
            if i < 0:
                break
            yield base + i + 1, data[cut:i + 1]
            cut = i + 1
        rest = data[cut:]


CHECK_BYTES = 32  # kept from just before a reader's offset: tells an append from a rewrite


def check_at(f, offset: int) -> str:
    """The bytes just before `offset` of an open history (hex): what a reader that stopped there saw."""
    start = max(0, offset - CHECK_BYTES)
    f.seek(start)
    return f.read(offset - start).hex()


def still_there(f, offset: int, check: str, size: int) -> bool:
    """Whether a reader that stopped at `offset` (seeing `check` before it) can go on from there: the
    file was only appended to since, not cut or rewritten."""
    return offset <= size and (offset == 0 or check_at(f, offset) == check)


def read_events(path: Path, type: str | None = None) -> list[dict]:
    return [e for e in iter_events(path) if type is None or e.get("type") == type]
