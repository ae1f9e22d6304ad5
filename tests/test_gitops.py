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
