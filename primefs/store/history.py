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
from typing import Iterable, Iterator

from primefs.store import events, fastjson, journal, livefeed, redact
from primefs.store.fsutil import NotRegular, open_regular


def now() -> float:
    return round(time.time(), 6)


class History:
    def __init__(self, path: Path):
        self.path = Path(path)
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._seq: int | None = None
        self._marker = journal.marker_of(self.path.parent)

    def _open(self) -> int:
        if self._fd is None:
            repair_tail(self.path)
            self._seq = next_n(self.path)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO planted in its place: refuse, never block
                os.close(fd)
                raise NotRegular(errno.EINVAL, "not a regular file", str(self.path))
            os.set_blocking(fd, True)
            self._fd = fd
        return self._fd

    def append(self, type: str, **fields) -> dict:
        """Append an event; returns it (with `ts`, `type` and a per-session sequence number `n`).
        Known secrets in its fields are redacted first (redact.py). With PRIMEFS_CHECK_EVENTS set (the
        tests), an event the registry (events.py) does not declare is refused."""
        if os.environ.get("PRIMEFS_CHECK_EVENTS"):
            wrong = events.problem(type, fields)
            if wrong:
                raise ValueError(wrong)
        fields = redact.value(fields)
        with self._lock:
            fd = self._open()
            event = {"ts": now(), "type": type, "n": self._seq, **fields}
            # a lone surrogate (a file name that is no UTF-8) goes in as its JSON escape, read back as U+FFFD
            os.write(fd, (json.dumps(event, ensure_ascii=False, default=str) + "\n").encode("utf-8", "backslashreplace"))
            self._seq += 1
        journal.mark(self._marker)
        if livefeed._listeners:  # `run -v` in this process
            livefeed.publish(self.path.parent.name, event)
        return event

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


def next_n(path: Path) -> int:
    """The `n` of the next event: one past the last one's, read from the end (a history grows for the
    session's life: counting its events at every open cost its whole length). A history whose last event
    has no `n` (edited by hand) is counted."""
    last = next(latest_events(path), None)
    if last is not None and type(last.get("n")) is int and last["n"] >= 0:
        return last["n"] + 1
    return sum(1 for _ in iter_events(path))


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


def parse_event(line: bytes) -> dict | None:
    """One history line as an event, or None for a garbled one: not JSON, nested too deep, not an
    object, no text `type`, a `ts` that is no time (NaN, 1e308, a string), a field readers rely on
    missing or of the wrong type (events.SHAPES). Lone surrogates (a legal JSON
    escape, which nothing can print or store) become U+FFFD. Every reader of history lines uses this."""
    try:
        e = fastjson.loads(line)  # orjson: 3-5 times json's speed on what primefs writes (reindex reads millions)
    except (ValueError, RecursionError):
        return None
    if not isinstance(e, dict) or not isinstance(e.get("type"), str):
        return None
    ts = e.get("ts")
    if ts is not None and (isinstance(ts, bool) or not isinstance(ts, (int, float)) or not 0 <= ts < MAX_TS):
        return None
    if not _well_typed(e):
        return None
    if b"\\ud" in line or b"\\uD" in line:
        e = mend_surrogates(e)
    return e


MAX_TS = 1e11  # year 5138: a time past it is not one


# per event type: (field, types, required) of events.COMMON and its events.SHAPES, in one tuple (read per line)
_CHECKS = {t: tuple((f, types, req) for shape in (events.COMMON, fields) for f, (types, req) in shape.items())
           for t, fields in events.SHAPES.items()}
_COMMON_CHECKS = tuple((f, types, req) for f, (types, req) in events.COMMON.items())


def _well_typed(e: dict) -> bool:
    """The fields readers rely on (events.SHAPES: the conversation, seen mail, compaction) have their types."""
    for field, types, required in _CHECKS.get(e["type"], _COMMON_CHECKS):
        value = e.get(field, e)  # e itself: the field is missing
        if value is e:
            if required:
                return False
        elif value.__class__ is bool or not isinstance(value, types):
            return False
    calls = e.get("calls") if e["type"] == "assistant" else None
    return not calls or all(isinstance(c, dict) and all(isinstance(c.get(k), str) for k in ("id", "name", "arguments"))
                            for c in calls)


def mend_surrogates(value):
    """Strings anywhere in JSON data, lone surrogates replaced by U+FFFD (iteratively: no depth limit)."""
    def fix(s):
        return s.encode("utf-16", "surrogatepass").decode("utf-16", "replace") if isinstance(s, str) else s

    root = [value]
    stack = [(root, 0)]
    while stack:
        holder, key = stack.pop()
        v = holder[key]
        if isinstance(v, str):
            holder[key] = fix(v)
        elif isinstance(v, list):
            stack.extend((v, i) for i in range(len(v)))
        elif isinstance(v, dict):
            fixed = {fix(k): v[k] for k in v}
            v.clear()
            v.update(fixed)
            stack.extend((v, k) for k in v)
    return root[0]


def events_of(f) -> Iterator[dict]:
    """The complete events of an open binary file of JSON lines; a torn or garbled line is skipped."""
    for line in f:
        if not line.endswith(b"\n"):
            break
        e = parse_event(line)
        if e is not None:
            yield e


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


class NewEvents:
    """The complete events of an open history between `start` (a line start) and `end`, as (line start,
    offset just past it, event); a garbled line is skipped, but `offset` (how far was read) moves past it
    too. The one incremental read of a history: the summary's fold, the event index, `primefs log -f`
    and the web view all go through it."""

    def __init__(self, f, start: int, end: int):
        self.f, self.offset, self.end = f, start, end

    def __iter__(self) -> Iterator[tuple[int, int, dict]]:
        for stop, line in iter_lines(self.f, self.offset, self.end):
            start, self.offset = self.offset, stop
            event = parse_event(line)
            if event is not None:
                yield start, stop, event


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


def open_turn(latest: Iterable[dict]) -> dict | None:
    """The `turn_start` of the last turn if no `turn_end` followed it; `latest`: the events from the end back
    (a runner stopped in that turn)."""
    for e in latest:
        if e["type"] in ("turn_start", "turn_end"):
            return e if e["type"] == "turn_start" else None
    return None


def turn_cut_off(path: Path) -> bool:
    """Whether the history's last turn has its `turn_start` and no `turn_end` (read from the end)."""
    return open_turn(latest_events(path)) is not None


def latest_events(path: Path, chunk: int = 1 << 16) -> Iterator[dict]:
    """The complete events of a history from its end back, read only as far as the caller goes: what
    came since the last turn costs a few kilobytes, not the whole file (which grows for the life of a
    session). A torn or garbled line is skipped, as by iter_events."""
    try:
        f = open_regular(path)
    except OSError:
        return
    with f:
        pos, rest = os.fstat(f.fileno()).st_size, None  # None: still after the last newline
        while pos > 0:
            start = max(0, pos - chunk)
            f.seek(start)
            lines = (f.read(pos - start) + (rest or b"")).split(b"\n")
            pos = start
            if rest is None:  # what follows the last newline: nothing, or a line still being written
                if len(lines) == 1 and start > 0:
                    continue
                lines.pop()
            rest = lines.pop(0) if start > 0 else b""  # the start of a line that began before this chunk
            for line in reversed(lines):
                e = parse_event(line)
                if e is not None:
                    yield e


def since_compaction(path: Path) -> tuple[dict | None, list[dict]]:
    """The last compaction of a history and every event after what it covered (`n` past its `upto_n`, the
    compaction itself included), oldest first; (None, every event) if there is none. Read from the end:
    what a compaction or a conversation's rebuild needs costs the events since, not the whole history
    (which grows for the life of a session)."""
    last, tail = None, []
    for e in latest_events(path):
        if last is None and e["type"] == "compaction":
            last = e
        elif last is not None and isinstance(e.get("n"), int) and e["n"] <= last["upto_n"]:
            break
        tail.append(e)
    tail.reverse()
    return last, tail


def read_events(path: Path, type: str | None = None) -> list[dict]:
    return [e for e in iter_events(path) if type is None or e.get("type") == type]


def line_start(path: Path, size: int) -> int:
    """Offset just past the last newline at or before `size` (0 if none)."""
    if size == 0:
        return 0
    try:
        with open_regular(path) as f:
            pos = size
            while pos > 0:
                start = max(0, pos - 65536)
                f.seek(start)
                i = f.read(pos - start).rfind(b"\n")
                if i >= 0:
                    return start + i + 1
                pos = start
    except OSError:
        pass
    return 0


class HistoryReader:
    """Incremental reader of one history.jsonl: each `read()` returns the complete events appended since."""

    def __init__(self, path: Path, pos: int = 0):
        self.path = Path(path)
        self.pos = pos  # just past the last complete line consumed

    def size(self) -> int:
        try:
            return os.stat(self.path).st_size
        except FileNotFoundError:
            return 0

    def read(self) -> list[dict]:
        size = self.size()
        if size < self.pos:  # truncated (a torn tail repaired): go on from the new end
            self.pos = self._line_start(size)
        if size == self.pos:
            return []
        try:
            with open_regular(self.path) as f:
                read = NewEvents(f, self.pos, size)
                events = [event for _, _, event in read]
        except OSError:
            return []
        self.pos = read.offset
        return events

    def _line_start(self, size: int) -> int:
        return line_start(self.path, size)

    def seek_end(self) -> None:
        """Skip what is there now (a torn last line is kept, to be read when complete)."""
        self.pos = self._line_start(self.size())
