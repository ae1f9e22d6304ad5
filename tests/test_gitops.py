"""Turn commits through the private index (gitops.PrivateIndex): each commit holds exactly its paths,
whatever a killed committer left behind."""
from __future__ import annotations

import subprocess

import pytest

from primefs.store import gitops
from primefs.store.gitops import commit_paths


def changed(ws, rev: str = "HEAD") -> list[str]:
    out = subprocess.run(["git", "-C", str(ws.root), "show", "--name-only", "--format=", rev],
                         capture_output=True, text=True, check=True).stdout
    return sorted(line for line in out.splitlines() if line)


def subject(ws) -> str:
    return subprocess.run(["git", "-C", str(ws.root), "log", "-1", "--format=%s"], capture_output=True, text=True,
                          check=True).stdout.strip()


@pytest.mark.parametrize("cut_after", ["update-index", "write-tree", "commit-tree"])
def test_a_commit_cut_off_before_update_ref_leaves_nothing_for_the_next(ws, monkeypatch, cut_after):
    (ws.root / "notes").mkdir()
    (ws.root / "notes" / "first.md").write_text("one\n")
    assert commit_paths(ws.root, ["notes/first.md"], "first")  # the private index exists and holds HEAD
    (ws.root / "notes" / "a.md").write_text("a\n")
    (ws.root / "notes" / "b.md").write_text("b\n")

    class Killed(BaseException):
        pass

    real = gitops.PrivateIndex._git

    def run(self, *args, **kw):
        out = real(self, *args, **kw)
        if args[0] == cut_after:
            raise Killed()  # the runner killed here: the private index has a.md, HEAD does not
        return out

    monkeypatch.setattr(gitops.PrivateIndex, "_git", run)
    with pytest.raises(Killed):
        commit_paths(ws.root, ["notes/a.md"], "a")
    monkeypatch.undo()
    assert subject(ws) == "first"
    assert commit_paths(ws.root, ["notes/b.md"], "b")
    assert subject(ws) == "b" and changed(ws) == ["notes/b.md"]  # not a.md under b's message
    assert commit_paths(ws.root, ["notes/a.md"], "a")
    assert subject(ws) == "a" and changed(ws) == ["notes/a.md"]
    assert not commit_paths(ws.root, ["notes/a.md", "notes/b.md"], "nothing")
    tree = subprocess.run(["git", "-C", str(ws.root), "ls-tree", "-r", "--name-only", "HEAD", "notes"],
                          capture_output=True, text=True, check=True).stdout.split()
    assert tree == ["notes/a.md", "notes/b.md", "notes/first.md"]


@pytest.mark.parametrize("auto", [None, "0"])
def test_turn_commits_are_packed_now_and_then(ws, monkeypatch, auto):
    """A turn commit stores each history it changed anew, whole, as a loose object; the plumbing it is made
    of never runs git's upkeep (only porcelain such as `git commit` does). So the committer packs every
    GC_EVERY commits: past git's own count (`gc.auto`) or past LOOSE_MAX_KIB (a history makes few objects,
    and big ones). The versions of an append-only file become small deltas. `gc.auto 0` turns it off."""
    import json

    if auto is not None:
        subprocess.run(["git", "-C", str(ws.root), "config", "gc.auto", auto], check=True)
    monkeypatch.setattr(gitops.Committer, "GC_EVERY", 10)
    monkeypatch.setattr(gitops.Committer, "EVERY_S", 0.0)
    monkeypatch.setattr(gitops, "LOOSE_MAX_KIB", 256)
    committer = gitops.Committer(ws.root)
    folder = ws.sessions / "s-1"
    folder.mkdir()
    for turn in range(30):  # a history that grows by a turn's events
        with open(folder / "history.jsonl", "a") as f:
            for k in range(50):
                f.write(json.dumps({"type": "cell", "n": turn * 50 + k, "output": f"{turn} {k} " * 40}) + "\n")
        committer.request("sessions/s-1", f"turn {turn}")
        committer.flush()
    committer.close()
    counts = dict(line.split(": ") for line in subprocess.run(
        ["git", "-C", str(ws.root), "count-objects", "-v"], capture_output=True, text=True, check=True).stdout.splitlines())
    if auto == "0":
        assert counts["in-pack"] == "0", counts
    else:
        assert int(counts["in-pack"]) >= 3 * 20 and int(counts["size-pack"]) < 256, counts
    assert committer.errors == []
    log = subprocess.run(["git", "-C", str(ws.root), "log", "--format=%s"], capture_output=True, text=True).stdout
    assert log.splitlines()[:30] == [f"sessions/s-1: turn {t}" for t in reversed(range(30))]
    subprocess.run(["git", "-C", str(ws.root), "fsck", "--no-progress"], check=True, capture_output=True)


def test_a_folder_deleted_before_its_first_commit_does_not_sink_the_batch(ws):
    """`git add` refuses a whole batch for one pathspec that matches nothing: a session folder removed by
    hand between its turn's end and the commit took the other sessions' commits with it."""
    for name in ("a", "b", "gone"):
        (ws.root / "sessions" / name).mkdir(parents=True)
        (ws.root / "sessions" / name / "history.jsonl").write_text("{}\n")
    assert commit_paths(ws.root, ["sessions/a"], "a")
    (ws.root / "sessions" / "a" / "history.jsonl").write_text("{}\n{}\n")
    subprocess.run(["rm", "-rf", str(ws.root / "sessions" / "gone")], check=True)
    assert commit_paths(ws.root, ["sessions/a", "sessions/b", "sessions/gone"], "three")
    assert changed(ws) == ["sessions/a/history.jsonl", "sessions/b/history.jsonl"]
    # a tracked folder deleted by hand is still committed as deleted
    subprocess.run(["rm", "-rf", str(ws.root / "sessions" / "b")], check=True)
    assert commit_paths(ws.root, ["sessions/b", "sessions/gone"], "b gone")
    assert changed(ws) == ["sessions/b/history.jsonl"]
    assert not commit_paths(ws.root, ["sessions/gone"], "nothing")


def test_a_failed_commit_is_tried_again(ws, monkeypatch):
    """A commit that failed (here: a person's git holds the branch's lock) dropped its paths until the
    session's next turn (a finished session has none). Now they go with the next try; the error is said
    once, as it happens; a flush does not wait out its timeout for a commit that cannot be made yet."""
    import time

    monkeypatch.setattr(gitops.Committer, "RETRY_S", 0.3)
    said = []
    committer = gitops.Committer(ws.root, log=said.append)
    (ws.root / "sessions" / "a").mkdir(parents=True)
    (ws.root / "sessions" / "a" / "history.jsonl").write_text("{}\n")
    branch = subprocess.run(["git", "-C", str(ws.root), "symbolic-ref", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    lock = ws.root / ".git" / f"{branch}.lock"
    lock.write_text("")
    try:
        committer.request("sessions/a", "turn 1")
        started = time.monotonic()
        committer.flush(timeout=30)
        assert time.monotonic() - started < 10
        time.sleep(1)  # more tries, failing the same way: said once
        assert len(said) == 1 and ".lock" in said[0] and committer.errors == [said[0].split(" s): ", 1)[1]]
        assert subject(ws) != "sessions/a: turn 1"
    finally:
        lock.unlink()
    deadline = time.monotonic() + 10
    while subject(ws) != "sessions/a: turn 1" and time.monotonic() < deadline:
        time.sleep(0.05)
    committer.close()
    assert subject(ws) == "sessions/a: turn 1" and changed(ws) == ["sessions/a/history.jsonl"]


def test_a_burst_of_requests_is_committed_in_batches_of_a_bounded_size(ws, monkeypatch):
    """A runner's first start on 50,000 changed sessions requests a commit of each (alive.settle_changed):
    one git command line with all their paths would pass the system's limit. At most MAX_BATCH a commit."""
    monkeypatch.setattr(gitops.Committer, "MAX_BATCH", 2)
    monkeypatch.setattr(gitops.Committer, "EVERY_S", 0.0)
    committer = gitops.Committer(ws.root)
    for i in range(5):
        (ws.root / "sessions" / f"s{i}").mkdir(parents=True)
        (ws.root / "sessions" / f"s{i}" / "history.jsonl").write_text("{}\n")
        committer.request(f"sessions/s{i}", "recovered")
    committer.close()
    commits = subprocess.run(["git", "-C", str(ws.root), "log", "--format=%H", "--", "sessions/s*"],
                             capture_output=True, text=True).stdout.split()
    assert len(commits) >= 3 and all(len(changed(ws, c)) <= 2 for c in commits)  # (the first may go alone)
    tracked = subprocess.run(["git", "-C", str(ws.root), "ls-files", "sessions/s*"], capture_output=True,
                             text=True).stdout
    assert sorted(tracked.split()) == [f"sessions/s{i}/history.jsonl" for i in range(5)]


def test_a_turn_commit_does_not_grow_with_its_sessions_mail(ws):
    """Every message a session ever took stays in its mail/cur/, in git. A commit listed both indexes' entries of
    the session's folder whole: at 100,000 messages, 1.3 s of the runner's CPU and 67 MB a commit (bench/mailbox.py).
    It now copies only what differs from HEAD: what it holds in memory does not grow with the folder."""
    import tracemalloc

    cur = ws.root / "sessions" / "s1" / "mail" / "cur"
    cur.mkdir(parents=True)
    for i in range(5000):
        (cur / f"1700000000.{i:07d}.old:2,S").write_text("old\n")
    (cur.parent.parent / "history.jsonl").write_text("{}\n")
    assert commit_paths(ws.root, ["sessions/s1"], "a long life")
    (cur / "1700000000.0000000.old:2,S").unlink()
    (cur / "new:2,S").write_text("new\n")
    (cur.parent.parent / "history.jsonl").write_text("{}\n{}\n")
    tracemalloc.start()
    try:
        assert commit_paths(ws.root, ["sessions/s1"], "one more message")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 500_000, peak  # (~3 MB before, for 5,000 files)
    assert changed(ws) == ["sessions/s1/history.jsonl", "sessions/s1/mail/cur/1700000000.0000000.old:2,S",
                           "sessions/s1/mail/cur/new:2,S"]
    status = subprocess.run(["git", "-C", str(ws.root), "status", "--porcelain", "--", "sessions"],
                            capture_output=True, text=True, check=True).stdout
    assert status == ""  # your index holds what was committed


def test_what_a_committer_remembers_of_rooms_does_not_grow_with_each_change(ws, monkeypatch):
    """A room's files are hashed by primefs, which remembers each file's last version so that an unchanged one is
    not read again. It remembered every version of every file ever committed, for the runner's life: a kernel that
    rewrites a file each turn grew it at each turn. Now one entry a path, the BLOBS_KEPT last."""
    monkeypatch.setattr(gitops, "_BLOBS", {})
    monkeypatch.setattr(gitops, "BLOBS_KEPT", 5)
    room = ws.root / "sessions" / "s1" / "work"
    room.mkdir(parents=True)
    for turn in range(20):
        (room / "log.txt").write_text(f"turn {turn}\n")
        assert commit_paths(ws.root, ["sessions/s1"], f"turn {turn}")
    assert len(gitops._BLOBS) == 1
    show = ["git", "-C", str(ws.root), "show", "HEAD:sessions/s1/work/log.txt"]
    assert subprocess.run(show, capture_output=True, text=True, check=True).stdout == "turn 19\n"
    for i in range(8):
        (room / f"f{i}.txt").write_text(f"{i}\n")
    assert commit_paths(ws.root, ["sessions/s1"], "more files")
    assert len(gitops._BLOBS) == 5  # the last 5
    (room / "f7.txt").write_text("changed\n")
    assert commit_paths(ws.root, ["sessions/s1"], "one changed")
    show[-1] = "HEAD:sessions/s1/work/f7.txt"
    assert subprocess.run(show, capture_output=True, text=True, check=True).stdout == "changed\n"
    assert changed(ws) == ["sessions/s1/work/f7.txt"]
