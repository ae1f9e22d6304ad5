"""Small durable file operations shared by sessions, goals and mail. Every text file primefs writes into a
workspace goes through `write_atomic` or `write_new`, which redact known secrets first (redact.py)."""
from __future__ import annotations

import errno
import os
import re
import stat
import tempfile
from pathlib import Path

from primefs.errors import PrimefsError
from primefs.store import redact

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def check_name(name: str, what: str = "name") -> str:
    """Names from outside become file names: refuse anything that could escape a folder."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name) or ".." in name:
        raise PrimefsError(f"invalid {what} {name!r}: use letters, digits, '.', '_' or '-' (max 128), "
                           "starting with a letter or digit")
    return name


class NotRegular(OSError):
    """A FIFO, device, socket or folder where a regular file belongs."""


def open_regular(path, mode: str = "rb", follow: bool = False):
    """Open a regular file without ever blocking or being led elsewhere: a FIFO, device or socket in its
    place (and, unless `follow`, a symbolic link) raises OSError instead of hanging the reader or
    reading another file. `mode`: "rb", "r" (UTF-8, errors replaced) or "rb+"."""
    flags = (os.O_RDWR if "+" in mode else os.O_RDONLY) | os.O_NONBLOCK | os.O_CLOEXEC
    if not follow:
        flags |= os.O_NOFOLLOW
    fd = os.open(path, flags)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegular(errno.EINVAL, "not a regular file", str(path))
        os.set_blocking(fd, True)
        if "b" in mode:
            return os.fdopen(fd, mode)
        return os.fdopen(fd, mode, encoding="utf-8", errors="replace")
    except BaseException:
        os.close(fd)
        raise


MAX_DEPTH = 256  # folders nested deeper are listed, not entered (walk_tree)


class TooDeep(OSError):
    """Folders nested deeper than MAX_DEPTH (walk_tree with deep="raise")."""


def walk_tree(top, deep: str = "skip"):
    """Everything below the folder `top` as (relative path, kind, st, value), read through folder
    descriptors so that nothing is reached through a link, even one swapped in while the walk runs (a
    live kernel may be changing its room): kind "dir"; "file" (value: a function that opens it, binary,
    to be called before the next item); "link" (value: its target, never followed); "other" (FIFOs,
    sockets, devices: never opened). Folders that are links are listed as links, not entered. A loop,
    not a recursion: a kernel's folders nested thousands deep cannot crash its reader; those deeper than
    MAX_DEPTH are listed and not entered (`deep="skip"`), or raise TooDeep (`deep="raise"`). At most one
    open descriptor per level."""
    try:
        topfd = os.open(top, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return
    levels = [(topfd, "", iter(_listing(topfd)))]  # one per folder being read: its fd, its path, entries left
    try:
        while levels:
            dirfd, base, entries = levels[-1]
            name, st = next(entries, (None, None))
            if name is None:
                os.close(levels.pop()[0])
                continue
            if stat.S_ISDIR(st.st_mode):
                yield base + name, "dir", st, None
                if len(levels) > MAX_DEPTH:
                    if deep == "raise":
                        raise TooDeep(errno.ELOOP, f"folders nested deeper than {MAX_DEPTH}", base + name)
                    continue
                try:
                    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                                 dir_fd=dirfd)
                except OSError:
                    continue  # gone, or a link swapped in: not entered
                levels.append((fd, base + name + "/", iter(_listing(fd))))
            elif stat.S_ISLNK(st.st_mode):
                try:
                    yield base + name, "link", st, os.readlink(name, dir_fd=dirfd)
                except OSError:
                    pass
            elif stat.S_ISREG(st.st_mode):
                yield base + name, "file", st, _opener(name, dirfd)
            else:
                yield base + name, "other", st, None
    finally:
        for fd, _base, _names in levels:
            os.close(fd)


def _listing(dirfd: int) -> list[tuple]:
    """(name, lstat) of a folder's entries: its files, links and others by name, then its folders by name
    (the order os.fwalk gave, top-down: what trust.py hashes stays the same)."""
    out = []
    try:
        names = os.listdir(dirfd)
    except OSError:
        return out
    for name in names:
        try:
            out.append((name, os.stat(name, dir_fd=dirfd, follow_symlinks=False)))
        except OSError:
            continue  # gone meanwhile
    out.sort(key=lambda e: (stat.S_ISDIR(e[1].st_mode), e[0]))
    return out


def _opener(name: str, dirfd: int):
    def open_it():
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dirfd)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise NotRegular(errno.EINVAL, "not a regular file", name)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    return open_it


def read_regular(path, follow: bool = False) -> str:
    """A regular file's text (UTF-8, errors replaced); OSError as open_regular() raises it."""
    with open_regular(path, "r", follow) as f:
        return f.read()


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, text: str, durable: bool = True) -> None:
    """Write via a temp file and rename, so readers never see a half-written file. Known secrets are
    replaced by [redacted] first."""
    path = Path(path)
    text = redact.text(text)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)  # mkstemp makes 0600; workspace files are ordinary files
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable:
        fsync_dir(path.parent)


def ring(session_dir: Path) -> None:
    """The doorbell: tell a running runner to look at this session now, by touching its folder. The
    runner watches sessions/ itself, not every session's folders, and inotify reports a changed folder
    to its parent's watch: a finished session the runner has not loaded is looked at at once (alive.py).
    Best effort: without it, the runner's periodic look finds the change a few seconds later."""
    try:
        os.utime(session_dir)
    except OSError:
        pass


def write_new(path: Path, text: str) -> bool:
    """Create `path` with `text` atomically and durably; False if it already exists (never overwrites).
    Known secrets are replaced by [redacted] first."""
    path = Path(path)
    text = redact.text(text)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        try:
            if not _rename_new(tmp, path):  # a rename: a watcher knows the file arrived whole (a goal: read at once)
                os.link(tmp, path)
        except FileExistsError:
            return False
        fsync_dir(path.parent)
        return True
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:  # renamed
            pass


def _rename_new(src: str, dst: Path) -> bool:
    """rename(2) that never replaces (Linux renameat2 RENAME_NOREPLACE): True if renamed, False where the
    system or file system cannot (then the caller links); FileExistsError if `dst` exists."""
    import ctypes

    fn = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if fn is None:
        return False
    at_cwd, noreplace = -100, 1
    if fn(at_cwd, os.fsencode(src), at_cwd, os.fsencode(str(dst)), noreplace) == 0:
        return True
    err = ctypes.get_errno()
    if err == errno.EEXIST:
        raise FileExistsError(err, os.strerror(err), str(dst))
    if err in (errno.EINVAL, errno.ENOSYS, errno.EPERM):  # not supported here: link instead
        return False
    raise OSError(err, os.strerror(err), str(dst))


def read_json_dict(path: Path) -> dict:
    """A JSON object from a runtime file; {} when it is missing, broken or not an object."""
    import json

    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def open_for_writing(path: Path) -> bool:
    """Whether a process (that we may look at) has `path` open for writing: Linux /proc, best effort;
    elsewhere always False. A file a person is still writing (`cat > goals/x.md`) is not read yet."""
    try:
        target = os.stat(path)
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return False
    for pid in pids:
        fd_dir = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                st = os.stat(f"{fd_dir}/{fd}")
                if (st.st_ino, st.st_dev) != (target.st_ino, target.st_dev):
                    continue
                with open(f"/proc/{pid}/fdinfo/{fd}") as info:
                    flags = int(next(line for line in info if line.startswith("flags:")).split()[1], 8)
            except (OSError, StopIteration, ValueError):
                continue
            if flags & (os.O_WRONLY | os.O_RDWR):
                return True
    return False
