"""A small inotify watch (Linux): one descriptor and one thread for any number of folders, each added
and removed at will.

The runner watches sessions/ itself and the folders of the sessions that are awake (alive.py), not
every folder of every session: watchdog's recursive watch of sessions/ took 2.4 s and ~50,000 watches
at 10,000 sessions (the kernel's default limit is reached a little past that), and watchdog starts a
thread per watched folder otherwise. Events are hints: `on_path(path)` gets the folder and the name
of what changed in it; a lost event (queue overflow) calls `on_overflow()`.
"""
from __future__ import annotations

import ctypes
import errno
import os
import select
import struct
import threading
from pathlib import Path
from typing import Callable

IN_ATTRIB, IN_CLOSE_WRITE, IN_MOVED_FROM, IN_MOVED_TO = 0x4, 0x8, 0x40, 0x80
IN_CREATE, IN_DELETE, IN_Q_OVERFLOW, IN_IGNORED = 0x100, 0x200, 0x4000, 0x8000
IN_ONLYDIR, IN_NONBLOCK, IN_CLOEXEC = 0x01000000, 0o4000, 0o2000000
CHANGES = IN_CREATE | IN_MOVED_TO | IN_MOVED_FROM | IN_CLOSE_WRITE | IN_DELETE  # not opens, reads, appends
EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of name


class Inotify:
    def __init__(self, on_path: Callable[[Path], None], on_overflow: Callable[[], None] = lambda: None):
        libc = ctypes.CDLL(None, use_errno=True)  # AttributeError where there is no inotify: the caller polls
        self._add_watch, self._rm_watch = libc.inotify_add_watch, libc.inotify_rm_watch
        self._add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        self._rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
        self.fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        self.on_path, self.on_overflow = on_path, on_overflow
        self._paths: dict[int, str] = {}  # strings, not Paths: the runner watches every session folder
        self._wds: dict[str, int] = {}
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._loop, name="primefs-inotify", daemon=True)
        self._thread.start()

    def add(self, folder: Path, mask: int = CHANGES) -> bool:
        """Watch a folder (again: its mask is replaced). False if it cannot be watched (gone, over the
        limit of watches): the runner's periodic look still covers it."""
        folder = os.fspath(folder)
        wd = self._add_watch(self.fd, os.fsencode(folder), mask | IN_ONLYDIR)
        if wd < 0:
            return False
        with self._lock:
            self._paths[wd], self._wds[folder] = folder, wd
        return True

    def remove(self, folder: Path) -> None:
        with self._lock:
            wd = self._wds.pop(os.fspath(folder), None)
            if wd is not None:
                self._paths.pop(wd, None)
        if wd is not None:
            self._rm_watch(self.fd, wd)  # EINVAL if the folder is gone already: nothing to do

    def _loop(self) -> None:
        while True:
            try:
                ready, _, _ = select.select([self.fd, self._wake_r], [], [])
            except (OSError, ValueError):  # closed
                return
            if self._wake_r in ready:
                return
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                continue
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                return
            self._dispatch(data)

    def _dispatch(self, data: bytes) -> None:
        pos = 0
        while pos + EVENT.size <= len(data):
            wd, mask, _cookie, size = EVENT.unpack_from(data, pos)
            name = data[pos + EVENT.size: pos + EVENT.size + size].rstrip(b"\0")
            pos += EVENT.size + size
            if mask & IN_Q_OVERFLOW:
                self._guard(self.on_overflow)
                continue
            with self._lock:
                folder = self._paths.get(wd)
                if mask & IN_IGNORED and folder is not None:  # the folder went away
                    self._paths.pop(wd, None)
                    if self._wds.get(folder) == wd:
                        self._wds.pop(folder)
            if folder is not None and not mask & IN_IGNORED:
                self._guard(self.on_path, Path(folder, os.fsdecode(name)) if name else Path(folder))

    @staticmethod
    def _guard(fn, *args) -> None:
        try:
            fn(*args)
        except Exception:  # noqa: BLE001 - a hint's handler must not end the watch (the runner logs its own)
            pass

    def close(self) -> None:
        os.write(self._wake_w, b"x")
        self._thread.join(5)
        for fd in (self.fd, self._wake_r, self._wake_w):
            os.close(fd)
