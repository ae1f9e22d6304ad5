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


def test_turn_commits_are_packed_now_and_then(ws, monkeypatch):
    """A turn commit stores each history it changed anew, whole, as a loose object; the plumbing it is made
    of never runs `git gc --auto` (only porcelain such as `git commit` does). So the committer runs it every
    GC_EVERY commits, and git packs once past its own threshold (`gc.auto`, low here): the versions of an
    append-only file become small deltas, and .git stays near the size of what it holds."""
    import json

    subprocess.run(["git", "-C", str(ws.root), "config", "gc.auto", "1"], check=True)
    monkeypatch.setattr(gitops.Committer, "GC_EVERY", 10)
    monkeypatch.setattr(gitops.Committer, "EVERY_S", 0.0)
    committer = gitops.Committer(ws.root)
    folder = ws.sessions / "s-1"
    folder.mkdir()
    for turn in range(30):  # ~100 new objects a commit: enough for git's estimate of loose objects to see them
        with open(folder / "history.jsonl", "a") as f:
            f.write(json.dumps({"type": "cell", "n": turn, "output": "x" * 2000}) + "\n")
        for k in range(100):
            (folder / f"out-{k}.txt").write_text(f"{turn} {k}\n")
        committer.request("sessions/s-1", f"turn {turn}")
        committer.flush()
    committer.close()
    counts = dict(line.split(": ") for line in subprocess.run(
        ["git", "-C", str(ws.root), "count-objects", "-v"], capture_output=True, text=True, check=True).stdout.splitlines())
    assert int(counts["in-pack"]) > 2000 and int(counts["count"]) < 1000, counts
    assert committer.errors == []
    log = subprocess.run(["git", "-C", str(ws.root), "log", "--format=%s"], capture_output=True, text=True).stdout
    assert log.splitlines()[:30] == [f"sessions/s-1: turn {t}" for t in reversed(range(30))]
    subprocess.run(["git", "-C", str(ws.root), "fsck", "--no-progress"], check=True, capture_output=True)
