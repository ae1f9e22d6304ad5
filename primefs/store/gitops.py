"""The one committer: every runner commit goes through here, serialized by an OS file lock.

git never waits for `.git/index.lock`, so two committers race and fail; all primefs commits in a
workspace take `.primefs/commit.lock` (fcntl) first. Requests are coalesced by a background
thread: a burst of turn ends becomes one commit instead of hundreds, its subject naming the sessions.
"""
from __future__ import annotations

import fcntl
import io
import itertools
import os
import subprocess
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from primefs.store.fsutil import walk_tree
from primefs.store.workspace import git_env


def lock_file(root: Path) -> Path:
    """.primefs/commit.lock, made if missing; only its owner may open it, and sandboxed kernels see an empty
    file in its place (agent.kernel_spec): a kernel holding it would stop every commit of the workspace."""
    path = Path(root) / ".primefs" / "commit.lock"
    path.parent.mkdir(exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        if os.fstat(fd).st_mode & 0o077:
            os.fchmod(fd, 0o600)  # (made 0644 by an earlier primefs)
    finally:
        os.close(fd)
    return path


@contextmanager
def commit_lock(root: Path):
    with open(lock_file(root), "r+") as f:
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


def git(root: Path, *args: str, check: bool = True, input: str | None = None,
        env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=check,
                          env={**git_env(), **(env or {})}, input=input)


# Runtime files (kernel snapshots, summaries, temp files of writes cut off by a crash) are ignored by
# git: the template's .gitignore says so, and `ignore_runtime` adds the patterns to .git/info/exclude
# for workspaces made before (naming an ignored path in a pathspec, even to exclude it, makes `git
# add` fail). Harness files get their own commits with provenance trailers (harness.py), never a turn
# commit: excluded per session folder, as a glob over sessions/*/ makes `git add` walk every
# session's folder (0.17 s instead of 0.03 s at 10,000 sessions).
RUNTIME = ("sessions/*/kernel/", "sessions/*/summary.json", "sessions/**/.*.tmp",
           "sessions/*/work/worktree/")  # a worktree of another repository (worktrees.py): its work is there


def pathspec(paths: list[str], harness: bool = False) -> list[str]:
    """These paths, without the harness folders of the session folders among them unless `harness`."""
    if harness:
        return list(paths)
    return list(paths) + [f":(exclude){p}/harness" for p in paths if p.startswith("sessions/") and p.count("/") == 1]


def ignore_runtime(root: Path) -> None:
    """The runtime patterns in .git/info/exclude (not the user's .gitignore: nothing to commit)."""
    try:
        exclude = Path(root) / git(Path(root), "rev-parse", "--git-path", "info/exclude").stdout.strip()
        have = exclude.read_text().splitlines() if exclude.exists() else []
        missing = [p for p in RUNTIME if p not in have]
        if missing:
            exclude.parent.mkdir(exist_ok=True)
            with open(exclude, "a") as f:
                f.write("".join(f"{p}\n" for p in ["# primefs runtime files", *missing]))
    except (OSError, subprocess.CalledProcessError):  # not a git repository: nothing is committed anyway
        pass


# -- rooms: what kernels wrote ----------------------------------------------------------------------
# A session's room (sessions/<id>/work/) is written by its kernel, which may still run while the runner
# commits. git reads files by path, and a kernel that swaps a folder for a link at the right moment
# would make it read anything the runner may (as root: anything). So rooms are never given to `git add`:
# they are read here through folder descriptors (fsutil.walk_tree), their blobs written to the object
# store, their entries put in the index; no filter or attribute of git applies to them.
# (objects, path) -> ((dev, ino, size, mtime_ns, ctime_ns), sha): a file unchanged since its last commit is not read
# again. One entry a path, the BLOBS_KEPT committed last: keyed by version too, it grew with every change of every
# file a kernel ever wrote, for the runner's life.
_BLOBS: dict[tuple, tuple] = {}
_BLOBS_LOCK = threading.Lock()  # (the committer's thread, and a turn's worktree commit)
BLOBS_KEPT = 100_000  # ~0.5 KB each


def removal(path: str) -> str:
    """The `git update-index --index-info` line that takes `path` out of an index (mode 0)."""
    return f"0 {'0' * 40}\t{path}"


def rooms_of(paths: list[str]) -> list[str]:
    return [f"{p}/work" for p in paths if p.startswith("sessions/") and p.count("/") == 1]


def blob_entries(objects_dir: Path, folder: Path, prefix: str, skip: tuple = ()) -> dict[str, str]:
    """{path: "mode sha"} of the files and links below `folder` (paths `prefix` + their path in it), read
    through folder descriptors (never through a link: a live kernel may be changing the folder), their
    blobs written into `objects_dir`. Top-level names in `skip` are left out."""
    from gitdb import IStream, LooseObjectDB

    objects = LooseObjectDB(str(objects_dir))
    found: dict[str, str] = {}
    for rel, kind, st, value in walk_tree(folder) if folder.is_dir() else []:
        if rel.split("/", 1)[0] in skip:
            continue
        path = prefix + rel
        if kind == "link":
            data = os.fsencode(value)
            sha = objects.store(IStream(b"blob", len(data), io.BytesIO(data))).binsha.hex()
            found[path] = f"120000 {sha}"
        elif kind == "file":
            key, version = (str(objects_dir), path), (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            with _BLOBS_LOCK:
                known = _BLOBS.pop(key, None)
            sha = known[1] if known is not None and known[0] == version else None
            if sha is None:
                try:
                    with value() as f:
                        size = os.fstat(f.fileno()).st_size
                        sha = objects.store(IStream(b"blob", size, f)).binsha.hex()
                except OSError:
                    continue  # gone, or swapped for something that is not a file
            with _BLOBS_LOCK:
                _BLOBS[key] = (version, sha)  # (last: the most recently committed stay)
                if len(_BLOBS) > BLOBS_KEPT:
                    del _BLOBS[next(iter(_BLOBS))]
            found[path] = f"{'100755' if st.st_mode & 0o111 else '100644'} {sha}"
    return found


def room_entries(root: Path, rooms: list[str]) -> list[str]:
    """`git update-index --index-info` lines that make the index hold these rooms as they are now."""
    objects = Path(root) / git(root, "rev-parse", "--git-path", "objects").stdout.strip()
    found: dict[str, str] = {}
    for room in rooms:
        found.update(blob_entries(objects, Path(root) / room, f"{room}/"))
    if found:  # what .gitignore leaves out (as `git add` would); tracked files stay
        ignored = git(root, "check-ignore", "-z", "--stdin", input="".join(p + "\0" for p in found),
                      check=False).stdout.split("\0")
        for p in ignored:
            found.pop(p, None)
    lines = [f"{entry}\t{path}" for path, entry in found.items()]
    if rooms:
        for rec in git(root, "ls-files", "-s", "-z", "--", *rooms).stdout.split("\0"):
            if rec and rec.split("\t", 1)[1] not in found:
                lines.append(removal(rec.split("\t", 1)[1]))  # gone from the room
    return lines


def commit_paths(root: Path, paths: list[str], message: str, *, harness: bool = False) -> bool:
    """Stage and commit exactly these paths (never what else the user staged). False if nothing changed.
    A session folder's harness/ is left to harness commits unless `harness` (a whole folder that leaves).

    The commit is built in a private index (.primefs/git-index, kept equal to HEAD) rather than with
    `git commit -- paths`, which refreshes every entry of the index (a stat of every file of every
    session: 0.2 s a commit at 10,000 sessions). The user's index gets these paths as committed."""
    with commit_lock(root):
        paths = known_paths(root, paths)
        if not paths:
            return False
        spec, rooms = pathspec(paths, harness), rooms_of(paths)
        git(root, "add", "-A", "--", *spec, *(f":(exclude){r}" for r in rooms))  # rooms: room_entries
        lines = room_entries(root, rooms)
        if lines:
            git(root, "update-index", "-z", "--index-info", input="".join(line + "\0" for line in lines))
        index = PrivateIndex(root)
        try:
            return index.commit(spec, message)
        except subprocess.CalledProcessError:  # HEAD moved under us, or our index is damaged: once more
            index.forget()
            return index.commit(spec, message)


def known_paths(root: Path, paths: list[str]) -> list[str]:
    """These paths less those neither on disk nor in git's index (a session folder deleted before its first
    commit): `git add` refuses a whole batch, the other sessions' paths with it, for one pathspec that
    matches nothing."""
    gone = [p for p in paths if not os.path.lexists(os.path.join(root, p))]
    if not gone:
        return list(paths)
    tracked = git(root, "ls-files", "-z", "--", *gone).stdout.split("\0")
    keep = {p for p in gone if any(t == p or t.startswith(p + "/") for t in tracked if t)}
    return [p for p in paths if p not in gone or p in keep]


def uncommitted(root: Path) -> list[str]:
    """Session folders and goal files with changes git has not committed (a commit a killed runner never
    made): one `git status` (0.6 s at 50,000 sessions), which takes no lock."""
    out = git(root, "--no-optional-locks", "status", "--porcelain", "-z", "--no-renames", "--untracked-files=normal",
              "--", "sessions", "goals", check=False)
    found = set()
    for rec in out.stdout.split("\0") if not out.returncode else []:
        parts = rec[3:].rstrip("/").split("/")
        if len(parts) >= 2 and parts[0] == "sessions":
            found.add(f"sessions/{parts[1]}")
        elif len(parts) == 2 and parts[0] == "goals":
            found.add(f"goals/{parts[1]}")
    return sorted(found)


def commit_cut_off(root: Path) -> list[str]:
    """Session folders a killed runner staged but never committed (commit_paths' `git add` done, its
    commit not): committed now, at start. The user's index against HEAD: no file of a session is looked
    at. Returns the folders committed."""
    out = git(root, "diff", "--cached", "--name-only", "--no-renames", "-z", "HEAD", "--", "sessions/", check=False)
    folders = sorted({"/".join(p.split("/")[:2]) for p in out.stdout.split("\0") if p.count("/") >= 2})
    if out.returncode or not folders:
        return []
    commit_paths(root, folders, f"recovered: {len(folders)} session(s) staged by a runner stopped before its commit"
                 "\n\n" + "\n".join(folders))
    return folders


class PrivateIndex:
    """An index file of our own holding HEAD's tree, plus the paths being committed from the user's."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.path = self.root / ".primefs" / "git-index"
        self.base = self.root / ".primefs" / "git-index.head"  # the commit it holds
        self.env = {"GIT_INDEX_FILE": str(self.path)}

    def _git(self, *args, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(self.root), *args], capture_output=True, text=True, check=check,
                              env={**git_env(), **self.env}, input=input)

    def _staged(self, head: str, spec: list[str]) -> list[str]:
        """`--index-info` lines that make our index (HEAD's tree) hold what the user's holds for `spec`: only
        what differs from HEAD. Listing both indexes whole made a turn commit grow with its session's age (every
        message ever taken stays in mail/cur/: at 100,000, 1.3 s of the runner's CPU and 67 MB a commit)."""
        out = git(self.root, "diff-index", "--cached", "--no-renames", "-z", head, "--", *spec).stdout.split("\0")
        lines = []
        for info, path in zip(out[0::2], out[1::2]):  # ":old-mode new-mode old-sha new-sha status", path
            _, mode, _, sha, status = info.split(" ")
            if status != "U":  # (an unmerged path: nothing to commit; git add resolves it)
                lines.append(removal(path) if status == "D" else f"{mode} {sha}\t{path}")
        return lines

    def commit(self, spec: list[str], message: str) -> bool:
        head = git(self.root, "rev-parse", "--verify", "-q", "HEAD", check=False).stdout.strip()
        if not head:  # no commit yet: the ordinary way
            git(self.root, "commit", "-q", "--no-verify", "--allow-empty-message", "-m", message, "--", *spec,
                check=False)
            return True
        try:
            based = self.base.read_text().strip()
        except OSError:
            based = ""
        if based != head or not self.path.exists():  # HEAD moved (a harness or user commit), or a commit was
            self._git("read-tree", head)             # cut off before its base was written: start over from HEAD
        lines = self._staged(head, spec)
        if not lines:
            self.base.write_text(head + "\n")  # the index holds HEAD's tree exactly
            return False
        self.base.unlink(missing_ok=True)  # the index no longer holds a commit until HEAD points at the new one
        self._git("update-index", "-z", "--index-info", input="".join(line + "\0" for line in lines))
        tree = self._git("write-tree").stdout.strip()
        commit = self._git("commit-tree", tree, "-p", head, "-F", "-", input=message).stdout.strip()
        git(self.root, "update-ref", "-m", "primefs: turn commit", "HEAD", commit, head)  # fails if HEAD moved
        self.base.write_text(commit + "\n")
        return True

    def forget(self) -> None:
        for path in (self.base, self.path):
            path.unlink(missing_ok=True)


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


LOOSE_MAX_KIB = 64 * 1024  # loose objects packed past this size, however few they are


def pack_loose(root: Path) -> None:
    """git's upkeep, which only porcelain (`git commit`) runs, never the plumbing turn commits are made of.
    Each turn commit stores every history it changed anew, whole, as a loose object: unpacked, .git grows
    without end, with the square of a history's length; packed, each version of an append-only file is a
    small delta of the one before. `gc --auto` packs past `gc.auto` loose objects (6,700) and merges packs;
    but a session's history makes few objects and big ones, so past LOOSE_MAX_KIB they are packed as well.
    A person's `gc.auto 0` turns both off."""
    if git(root, "config", "--get", "gc.auto", check=False).stdout.strip() == "0":
        return
    counts = dict(line.split(": ", 1) for line in git(root, "count-objects", "-v", check=False).stdout.splitlines()
                  if ": " in line)
    if int(counts.get("size", "0") or 0) > LOOSE_MAX_KIB:
        git(root, "repack", "-d", "-l", "-q", check=False)
        git(root, "prune-packed", "-q", check=False)
    git(root, "-c", "gc.autoDetach=false", "gc", "--auto", "--quiet", check=False)


class Committer:
    """Background, coalescing commits of session folders at turn boundaries: at most one commit every
    EVERY_S seconds (what ends meanwhile goes into the next), unless flushed. A commit is ~7 git processes
    (~30 ms of CPU): 1,000 children ending one by one made ~700 commits. Each git process reads the whole
    index, so in a big workspace a commit takes longer (0.2-0.3 s at 3,000 sessions, 2-4 s at 50,000): the next
    waits SHARE times as long as the last took, keeping git to a part of one core's time. Files are written
    (and synced) before; a commit that a crash prevents is made by the next runner (commit_cut_off)."""

    EVERY_S = 0.5
    SHARE = 3
    RETRY_S = 10.0  # after a failed commit
    MAX_BATCH = 2000  # paths a commit takes (its git commands get them as arguments: a command line has a limit)
    # Commits between two looks at git's upkeep (pack_loose): loose objects peak near LOOSE_MAX_KIB plus this
    # many commits' worth. At 100, three sessions 15,000 messages old (~15 MB a commit) piled up 1.3 GB.
    GC_EVERY = 10

    def __init__(self, root: Path, log=lambda msg: None):
        self.root = Path(root)
        self._pending: dict[str, str] = {}  # path -> reason
        self._marks: dict[str, Mark] = {}   # path -> the session it is for
        self._cond = threading.Condition()
        self._busy = False
        self._closed = False
        self._now = False  # flush(): commit what is pending without waiting for EVERY_S
        self._last = 0.0  # monotonic time of the last commit's end
        self._gap = self.EVERY_S  # from then to the next
        self._commits = 0
        self._attempts = 0  # commits tried
        self.errors: list[str] = []  # the last distinct failures
        self.log = log
        ignore_runtime(self.root)
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
                while not (self._closed or self._now) and time.monotonic() < self._last + self._gap:
                    self._cond.wait(self._last + self._gap - time.monotonic())
                self._now = False
                batch = dict(itertools.islice(self._pending.items(), self.MAX_BATCH))
                for p in batch:
                    del self._pending[p]
                marks = {p: self._marks.pop(p) for p in batch if p in self._marks}
                self._busy = True
            started, error = time.monotonic(), None
            try:
                # the subject names the sessions; the body keeps one line per path with the full id
                lines = sorted(f"{p}: {r}" for p, r in batch.items())
                commit_paths(self.root, sorted(batch), subject_for(list(marks.values()), lines) + "\n\n" +
                             "\n".join(lines))
                self._commits += 1
            except subprocess.CalledProcessError as exc:
                error = (exc.stderr or str(exc)).strip()
            except Exception as exc:  # the committer thread must outlive any one failure
                error = f"{type(exc).__name__}: {exc}"
            took = time.monotonic() - started
            # Upkeep runs in this thread, so it delays the next commit by its own time, but it is not paced
            # (SHARE times a 14-minute repack held commits 42 minutes more).
            if not error and self._commits % self.GC_EVERY == 0:
                try:
                    pack_loose(self.root)
                except Exception:  # noqa: BLE001 - upkeep: tried again GC_EVERY commits later
                    pass
            with self._cond:
                self._busy = False
                self._attempts += 1
                self._gap = max(self.EVERY_S, self.SHARE * took)
                self._last = time.monotonic()
                if error:
                    self._failed(batch, marks, error)
                self._cond.notify_all()

    def _failed(self, batch: dict, marks: dict, error: str) -> None:
        """A commit that failed (another git held the index's lock, a file git refused): its paths go with
        the next batch, RETRY_S later (what was requested since keeps its newer reason). Each error is said
        once, as it happens."""
        for p, reason in batch.items():
            self._pending.setdefault(p, reason)
            if p in marks:
                self._marks.setdefault(p, marks[p])
        self._gap = max(self._gap, self.RETRY_S)
        if error not in self.errors:
            self.errors = [*self.errors[-19:], error]
            self.log(f"warning: git commit failed (tried again in {self.RETRY_S:g} s): {error}")

    def flush(self, timeout: float = 60) -> None:
        """Commit what is pending now; returns once done, or once a try of it failed (its paths stay
        pending), or after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._now = True
            tried = self._attempts + (1 if self._busy else 0)  # (a commit under way holds none of what waits)
            self._cond.notify_all()
            while (self._pending or self._busy) and time.monotonic() < deadline:
                if self._attempts > tried and not self._busy:
                    return  # tried since, and failed: its paths wait for a retry (or the next runner's start)
                self._cond.wait(0.1)

    def close(self) -> None:
        self.flush()
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(5)
