"""A session's work as it happens, beyond history.jsonl.

- The text of a model reply while it streams: `<runtime>/streams/<session>.txt` (the private runtime
  folder, hidden from sandboxed kernels; known secrets redacted piece by piece), there only during the
  call. `attach` and `log -f` in other processes read it.
- In the runner's own process, listeners called with each history event as it is appended and with
  each piece of streamed text (`{"type": "delta", "text": ...}`, never stored): `primefs run -v`.
"""
from __future__ import annotations

import codecs
import os
import threading
import time
from pathlib import Path

from primefs.store import redact

_listeners: list = []
_lock = threading.Lock()


def listen(fn) -> None:
    """Call fn(session_id, event) for every history event appended (and streamed text) in this process."""
    with _lock:
        _listeners.append(fn)


def unlisten(fn) -> None:
    with _lock:
        if fn in _listeners:
            _listeners.remove(fn)


def publish(sid: str, event: dict) -> None:
    for fn in list(_listeners):
        try:
            fn(sid, event)
        except Exception:  # noqa: BLE001 - a watcher's failure never reaches the session
            pass


def stream_path(runtime: Path, sid: str) -> Path:
    return Path(runtime) / "streams" / f"{sid}.txt"


class ReplyStream:
    """The text of one model call as it arrives; the file goes when the call ends (its reply is then
    in history.jsonl). Writing is best effort: a full disk never fails the model call."""

    def __init__(self, runtime: Path, sid: str):
        self.sid = sid
        self.path = stream_path(runtime, sid)
        self.fd: int | None = None
        self.closed = False
        self.lock = threading.Lock()  # the provider's thread writes; the gateway's thread closes

    def write(self, text: str) -> None:
        with self.lock:
            if not text or self.closed:  # an abandoned call may still be producing: not shown
                return
            text = redact.text(text)
            try:
                if self.fd is None:  # opened at the first text: calls that do not stream leave no file
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                    self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
                    os.write(self.fd, f"{time.time_ns()}\n".encode())  # this call's mark (StreamTail)
                os.write(self.fd, text.encode("utf-8"))
            except OSError:
                pass
            publish(self.sid, {"type": "delta", "ts": time.time(), "text": text})

    def close(self) -> None:
        with self.lock:
            self.closed = True
            if self.fd is not None:
                os.close(self.fd)
                self.fd = None
                try:
                    self.path.unlink()
                except OSError:
                    pass


class Feed:
    """One session's work read from its files, by any process: each `read()` gives the history events
    appended since, then the text streamed since as a `delta` event (the reply being written now: its
    `assistant` event, when it comes, holds the whole text)."""

    def __init__(self, session_dir: Path, runtime: Path, from_start: bool = True):
        from primefs.store.history import HistoryReader

        self.history = HistoryReader(Path(session_dir) / "history.jsonl")
        if not from_start:
            self.history.seek_end()
        self.stream = StreamTail(stream_path(runtime, Path(session_dir).name))

    def read(self) -> list[dict]:
        events = self.history.read()
        text = self.stream.read()  # after the history: a reply streaming now comes after the events before it
        if text:
            events.append({"type": "delta", "ts": time.time(), "text": text})
        return events


class StreamTail:
    """Reads a session's streamed reply from another process: the new text since the last read. Each
    call's file starts with a line of its own (a time in ns): another first line is another call, read
    from its beginning (the file's inode may well be reused)."""

    def __init__(self, path: Path):
        self.path = path
        self.mark = b""
        self.pos = 0
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def read(self) -> str:
        try:
            with open(self.path, "rb") as f:
                mark = f.readline(64)
                if not mark.endswith(b"\n"):
                    return ""
                if mark != self.mark:
                    self.mark, self.pos = mark, len(mark)
                    self.decoder.reset()
                f.seek(self.pos)
                data = f.read(1 << 20)
        except OSError:
            return ""
        self.pos += len(data)
        return self.decoder.decode(data)
