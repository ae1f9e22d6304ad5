"""The one committer: every runner commit goes through here, serialized by an OS file lock.

git never waits for `.git/index.lock`, so two committers race and fail; all primefs commits in a
workspace take `.primefs/commit.lock` (fcntl) first. Requests are coalesced by a background
thread: a burst of turn ends becomes one commit instead of hundreds, its subject naming the sessions.
"""
from __future__ import annotations

import fcntl
import subprocess
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .workspace import git_env


@contextmanager
def commit_lock(root: Path):
    lock_path = Path(root) / ".primefs" / "commit.lock"
    lock_path.parent.mkdir(exist_ok=True)
    with open(lock_path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            _clear_stale_index_lock(Path(root))
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _clear_stale_index_lock(root: Path) -> None:
    # Only called with the commit lock held: no primefs commit is running, so an index.lock that
    # stays is either a user's git command (give it a moment) or left by a killed commit.
    lock = root / ".git" / "index.lock"
    for _ in range(20):
        if not lock.exists():
            return
        time.sleep(0.1)
    try:
        lock.unlink()
    except FileNotFoundError:
        pass


def git(root: Path, *args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=check,
                          env=git_env(), input=input)


# Harness files get their own commits with provenance trailers (harness.py), never a turn commit;
# kernel snapshots are runtime files (also git-ignored, but older workspaces lack that line).
EXCLUDE = (":(exclude,glob)sessions/*/harness/**", ":(exclude,glob)sessions/*/kernel/**")


def commit_paths(root: Path, paths: list[str], message: str) -> bool:
    """Stage and commit exactly these paths (never what else the user staged). False if nothing changed."""
    spec = [*paths, *EXCLUDE]
    with commit_lock(root):
        git(root, "add", "-A", "--", *spec)
        if git(root, "diff", "--cached", "--quiet", "--", *spec, check=False).returncode == 0:
            return False
        git(root, "commit", "-q", "--no-verify", "-m", message, "--", *spec)
        return True


SUBJECT_WIDTH = 72  # what `git log --oneline` and most tools show without cutting


@dataclass(frozen=True)
class Mark:
    """The session a commit request is for, so the commit's subject can name it."""
    sid: str
    name: str
    what: str                 # "turn 3 idle", "turn 2 interrupted", "direct call"
    goal: str | None = None   # the goal file it came from


def short_id(sid: str) -> str:
    return sid.rsplit("-", 1)[-1][:8]  # an id's random tail: "261129-143059385-lrq" -> "lrq"


def subject_for(marks: list[Mark], lines: list[str]) -> str:
    """`turn 3 idle: demo (lrq), goal demo` for one session; `turn end: 3 sessions: a, b +1 more` for more.
    Without marks: the one `<path>: <reason>` line, or how many paths."""
    marks = list({m.sid: m for m in marks}.values())
    if not marks:
        return lines[0] if len(lines) == 1 else f"{len(lines)} paths"
    if len(marks) == 1:
        m = marks[0]
        head = f"{m.what}: {m.name} ({short_id(m.sid)})"
        goal = f", goal {Path(m.goal).stem}" if m.goal else ""
        if len(head) + len(goal) <= SUBJECT_WIDTH:
            return head + goal
        return head if len(head) <= SUBJECT_WIDTH else head[:SUBJECT_WIDTH - 3] + "..."
    whats = {m.what for m in marks}
    head = f"{whats.pop() if len(whats) == 1 else 'turn end'}: {len(marks)} sessions: "
    names = sorted(m.name for m in marks)
    for shown in range(len(names), 0, -1):  # as many names as fit, the rest counted
        more = f" +{len(names) - shown} more" if shown < len(names) else ""
        text = head + ", ".join(names[:shown]) + more
        if len(text) <= SUBJECT_WIDTH:
            return text
    return head.rstrip(": ")


class Committer:
    """Background, coalescing commits of session folders at turn boundaries."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self._pending: dict[str, str] = {}  # path -> reason
        self._marks: dict[str, Mark] = {}   # path -> the session it is for
        self._cond = threading.Condition()
        self._busy = False
        self._closed = False
        self.errors: list[str] = []
        self._thread = threading.Thread(target=self._loop, name="primefs-committer", daemon=True)
        self._thread.start()

    def request(self, path: str, reason: str, mark: Mark | None = None) -> None:
        with self._cond:
            self._pending[path] = reason
            if mark is not None:
                self._marks[path] = mark
            self._cond.notify_all()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if not self._pending and self._closed:
                    return
                batch, self._pending = self._pending, {}
                marks = [self._marks.pop(p) for p in batch if p in self._marks]
                self._busy = True
            try:
                # the subject names the sessions; the body keeps one line per path with the full id
                lines = sorted(f"{p}: {r}" for p, r in batch.items())
                commit_paths(self.root, sorted(batch), subject_for(marks, lines) + "\n\n" + "\n".join(lines))
            except subprocess.CalledProcessError as exc:
                self.errors.append((exc.stderr or str(exc)).strip())
            except Exception as exc:  # the committer thread must outlive any one failure
                self.errors.append(f"{type(exc).__name__}: {exc}")
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def flush(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while (self._pending or self._busy) and time.monotonic() < deadline:
                self._cond.wait(0.1)

    def close(self) -> None:
        self.flush()
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(5)
