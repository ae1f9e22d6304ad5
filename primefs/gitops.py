"""The one committer: every runner commit goes through here, serialized by an OS file lock.

git never waits for `.git/index.lock`, so two committers race and fail; all primefs commits in a
workspace take `.primefs/commit.lock` (fcntl) first. Requests are coalesced by a background
thread: a burst of turn ends becomes one commit instead of hundreds.
"""
from __future__ import annotations

import fcntl
import subprocess
import threading
import time
from contextlib import contextmanager
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


class Committer:
    """Background, coalescing commits of session folders at turn boundaries."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self._pending: dict[str, str] = {}  # path -> reason
        self._cond = threading.Condition()
        self._busy = False
        self._closed = False
        self.errors: list[str] = []
        self._thread = threading.Thread(target=self._loop, name="primefs-committer", daemon=True)
        self._thread.start()

    def request(self, path: str, reason: str) -> None:
        with self._cond:
            self._pending[path] = reason
            self._cond.notify_all()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if not self._pending and self._closed:
                    return
                batch, self._pending = self._pending, {}
                self._busy = True
            try:
                lines = sorted(f"{p}: {r}" for p, r in batch.items())
                subject = lines[0] if len(lines) == 1 else f"sessions: {len(lines)} turn boundaries"
                body = "" if len(lines) == 1 else "\n\n" + "\n".join(lines)
                commit_paths(self.root, sorted(batch), subject + body)
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
