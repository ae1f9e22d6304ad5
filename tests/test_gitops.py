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
