"""`primefs archive`: finished trees leave sessions/ whole (never a child without its parent, never a tree
with a live session), stay searchable and readable, and a crash at any step leaves a tree whole in one
place."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import BackgroundRunner, cli, wait_for
from scaletools import fan_out, grow

from primefs.index import archive
from primefs.store import mail
from primefs.index.archive import recover
from primefs.index.db import session_ids
from primefs.store.session import Session


def tracked(ws) -> str:
    return subprocess.run(["git", "-C", str(ws.root), "ls-files"], capture_output=True, text=True).stdout


def trees(ws) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for sid in session_ids(ws.sessions):
        meta = Session(ws.sessions / sid).meta
        out.setdefault(meta.get("parent") or sid, []).append(sid)
    return out


def whole_somewhere(ws, root: str, members: list[str]) -> str:
    """'here' (every session in sessions/, no zip) or 'archived' (the zip has them all, none is here)."""
    here = [(ws.sessions / sid / "session.yaml").is_file() for sid in members]
    zipped = ws.root / "archive" / f"{root}.zip"
    assert not (ws.state / "archiving" / root).exists(), "nothing left half-way"
    if all(here) and not zipped.exists():
        return "here"
    assert not any(here) and zipped.exists(), (here, zipped.exists())
    names = zipfile.ZipFile(zipped).namelist()
    assert all(f"sessions/{sid}/history.jsonl" in names for sid in members)
    return "archived"


def test_archive_moves_whole_finished_trees_and_keeps_them_readable(ws):
    ws = fan_out(ws)
    grow(ws, 2)
    before = {sid: Session(ws.sessions / sid).events() for sid in session_ids(ws.sessions)}
    logs_before = json.loads(cli(ws, "logs", "-n", "0", "--json").stdout)
    r = cli(ws, "archive", "--dry-run", "--json")
    plan = json.loads(r.stdout)
    assert plan["dry_run"] and plan["sessions"] == 12 and len(plan["trees"]) == 3 and session_ids(ws.sessions)
    r = cli(ws, "archive", "--json")
    assert r.returncode == 0, r.stderr
    done = json.loads(r.stdout)
    assert done["sessions"] == 12 and not done["dry_run"]
    assert session_ids(ws.sessions) == [] and not (ws.goals / "fan.md").exists()
    files = tracked(ws)
    assert "sessions/2" not in files and files.count("archive/") == 3 and "goals/fan.md" not in files
    assert subprocess.run(["git", "-C", str(ws.root), "status", "--porcelain", "--", "sessions", "archive", "goals"],
                          capture_output=True, text=True).stdout == ""
    # searchable and readable
    assert json.loads(cli(ws, "logs", "-n", "0", "--json").stdout) == logs_before
    for sid, events in list(before.items())[:4]:
        r = cli(ws, "log", sid, "--json")
        assert r.returncode == 0 and [json.loads(x) for x in r.stdout.splitlines()] == events
    r = cli(ws, "log", "fan")
    assert r.returncode == 0 and "(archived in" in r.stdout
    assert cli(ws, "status", "--json").stdout.strip() == "[]"
    # a goal file archived with its tree is not taken again
    r = cli(ws, "run", "--once", "-q")
    assert r.returncode == 0 and session_ids(ws.sessions) == []
    # unzip brings a tree back
    first = done["trees"][0]
    subprocess.run(["unzip", "-q", "-o", first["file"], "-x", archive.MANIFEST], cwd=ws.root, check=True)
    assert len(json.loads(cli(ws, "status", "--json").stdout)) == 4


def test_live_or_unfinished_trees_stay(ws):
    ws = fan_out(ws)
    grow(ws, 4)
    roots = sorted(trees(ws))
    mailed, beating, running, idle_root = roots[:4]
    kid = trees(ws)[mailed][1]
    mail.deliver(ws.sessions / kid / "mail", sender="user", to=kid, kind="user", text="later")  # a child with mail
    (ws.sessions / trees(ws)[beating][2] / "heartbeats").mkdir()
    (ws.sessions / trees(ws)[beating][2] / "heartbeats" / "hb-000001.yaml").write_text("id: hb-000001\n")
    Session(ws.sessions / trees(ws)[running][3]).update(status="running")
    Session(ws.sessions / idle_root).update(status="idle")
    r = cli(ws, "archive", "--json")
    result = json.loads(r.stdout)
    assert [t["root"] for t in result["trees"]] == [roots[4]]
    assert result["skipped"] == {"unread mail": 1, "heartbeats": 1, "not finished": 1, "status not chosen": 1}
    r = cli(ws, "archive", "--status", "idle,done", "--json")
    assert [t["root"] for t in json.loads(r.stdout)["trees"]] == [idle_root]
    r = cli(ws, "archive", "--before", "2020-01-01", "--json")  # nothing that old
    assert json.loads(r.stdout)["skipped"] == {"newer than --before": 2, "not finished": 1}
    for root, members in trees(ws).items():
        whole_somewhere(ws, root, members)
    r = cli(ws, "archive", "--status", "pending")
    assert r.returncode == 1 and r.stderr.startswith("error: --status") and "Traceback" not in r.stderr


STEPS = ["journal", "move", "move-goal", "zip", "index", "commit", "cleanup", "cleanup-half"]


@pytest.mark.parametrize("step", STEPS)
def test_a_crash_at_any_step_leaves_the_tree_whole_in_one_place(ws, monkeypatch, step):
    ws = fan_out(ws)
    [(root, members)] = trees(ws).items()

    class Crash(BaseException):
        pass

    def crash(*a, **k):
        raise Crash(step)

    real_rename = os.rename
    moves = []

    def rename(src, dst):
        moves.append(src)
        if step == "move" and len(moves) == 3 or step == "move-goal" and str(src).endswith("fan.md"):
            raise Crash(step)
        real_rename(src, dst)

    if step == "journal":
        monkeypatch.setattr(archive, "write_atomic", crash)
    elif step in ("move", "move-goal"):
        monkeypatch.setattr(archive.os, "rename", rename)
    elif step == "zip":
        monkeypatch.setattr(archive, "_add", crash)
    elif step == "index":  # right after the zip is complete, before the index points at it
        monkeypatch.setattr(archive, "_finish", crash)
    elif step == "commit":
        monkeypatch.setattr(archive, "commit_paths", crash)
    elif step == "cleanup":
        monkeypatch.setattr(archive.shutil, "rmtree", crash)
    else:  # killed half-way through removing the stage: its journal gone, session files left
        def half(path, *a, **k):
            files = sorted(Path(path).rglob("*"), key=lambda p: p.name != "journal.json")
            for f in [f for f in files if f.is_file()][:3]:
                f.unlink()
            raise Crash(step)
        monkeypatch.setattr(archive.shutil, "rmtree", half)
    with pytest.raises(Crash):
        archive.run(ws)
    monkeypatch.undo()
    recover(ws)
    where = whole_somewhere(ws, root, members)
    assert where == ("archived" if step in ("index", "commit", "cleanup", "cleanup-half") else "here")
    assert not archive.conflicts(ws) and not list(archive.staging(ws).glob("*"))  # nothing said at each start
    status = {r["id"] for r in json.loads(cli(ws, "status", "--json").stdout)}
    assert status == (set() if where == "archived" else set(members))
    if where == "archived":  # committed, searchable
        assert f"sessions/{root}" not in tracked(ws) and f"archive/{root}.zip" in tracked(ws)
        assert json.loads(cli(ws, "logs", "--counts", "--json").stdout)["sessions"] == 4
    else:
        assert cli(ws, "archive", "--json").returncode == 0  # and it can be archived after all
        assert whole_somewhere(ws, root, members) == "archived"


def test_a_runner_does_the_archive_and_a_killed_one_leaves_no_half_tree(ws):
    ws = fan_out(ws)
    grow(ws, 30)
    groups = trees(ws)
    with BackgroundRunner(ws) as br:
        wait_for(lambda: (ws.state / "runner.json").exists(), 30, "the runner")
        r = cli(ws, "archive", "--json", timeout=300)  # the runner does it
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["sessions"] == len(groups) * 4
        assert not br.runner.tree.knows(next(iter(groups)))
    for root, members in groups.items():
        assert whole_somewhere(ws, root, members) == "archived"
    # again, with the runner killed while it archives (a process; SIGKILL when the first tree is staged)
    for i in range(2):
        unzip = ws.root / "archive"
        for z in sorted(unzip.glob("*.zip"))[: 15]:
            subprocess.run(["unzip", "-q", "-o", str(z), "-x", archive.MANIFEST], cwd=ws.root, check=True)
            z.unlink()
    groups = trees(ws)
    assert groups
    proc = subprocess.Popen([sys.executable, "-m", "primefs", "-w", str(ws.root), "run", "-q"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: (ws.state / "runner.json").exists(), 30, "the runner")
        asker = subprocess.Popen([sys.executable, "-m", "primefs", "-w", str(ws.root), "archive"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: (ws.state / "archiving").is_dir() and any((ws.state / "archiving").iterdir()), 60,
                 "a tree being archived")
        proc.kill()
        proc.wait(10)
        asker.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert any((ws.state / "archiving").iterdir())  # cut off half-way
    assert cli(ws, "run", "--once", "-q").returncode == 0  # a starting runner puts it right
    places = [whole_somewhere(ws, root, members) for root, members in groups.items()]
    assert set(places) <= {"here", "archived"}
    r = cli(ws, "archive", "--json")
    assert r.returncode == 0, r.stderr
    for root, members in groups.items():
        assert whole_somewhere(ws, root, members) == "archived"


def test_archiving_takes_a_sessions_own_harness_files_out_of_git_too(ws):
    """A session's harness/ (committed by harness commits) leaves with its folder in the archive commit:
    nothing is left deleted-but-tracked for the next hand-edit commit to take as a person's deletion."""
    from primefs.harness.entries import Harness, HarnessGit

    ws = fan_out(ws)
    root = next(sid for sid in session_ids(ws.sessions) if Session(ws.sessions / sid).meta.get("parent") is None)
    h = Harness(ws)
    h.put("memory", "sky-color", "Red, in this session.", scope="session", session=root, description="local")
    assert f"sessions/{root}/harness/memory/sky-color.md" in tracked(ws)
    r = cli(ws, "archive", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["sessions"] == 4, r.stderr
    assert f"sessions/{root}" not in tracked(ws)
    assert subprocess.run(["git", "-C", str(ws.root), "status", "--porcelain", "--", "sessions", "archive"],
                          capture_output=True, text=True).stdout == ""
    head = subprocess.run(["git", "-C", str(ws.root), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    assert HarnessGit(ws.root).commit_user_edits() == []
    assert subprocess.run(["git", "-C", str(ws.root), "rev-parse", "HEAD"], capture_output=True, text=True).stdout == head
    with zipfile.ZipFile(ws.root / "archive" / f"{root}.zip") as z:
        assert f"sessions/{root}/harness/memory/sky-color.md" in z.namelist()


def _archived_rows(ws) -> dict:
    from primefs.index.db import Index

    index = Index(ws.root)
    try:
        return {sid: row["place"] for sid, row in index.rows().items()}
    finally:
        index.close()


def test_status_while_a_tree_is_being_archived_keeps_its_rows(ws, monkeypatch):
    """A full index sync (another command's `status`) that lands between two folder moves does not drop
    the rows of the folders already in .primefs/archiving/: the tree stays searchable once archived."""
    ws = fan_out(ws)
    [(root, members)] = trees(ws).items()
    counts = json.loads(cli(ws, "logs", "--counts", "--json").stdout)
    real_rename, moves = os.rename, []

    def rename(src, dst):
        real_rename(src, dst)
        moves.append(src)
        if len(moves) == 1:  # one folder moved, the others not yet
            r = cli(ws, "status", "--json")
            assert r.returncode == 0, r.stderr
            assert {rec["id"] for rec in json.loads(r.stdout)} == set(members) - {members[0]}

    monkeypatch.setattr(archive.os, "rename", rename)
    assert archive.run(ws)["sessions"] == 4
    monkeypatch.undo()
    assert _archived_rows(ws) == {sid: f"archive/{root}.zip" for sid in members}
    assert json.loads(cli(ws, "logs", "--counts", "--json").stdout) == counts
    r = cli(ws, "log", members[0], "--json")
    assert r.returncode == 0 and r.stdout, r.stderr


def test_rows_of_archived_sessions_lost_from_the_index_come_back_from_the_manifest(ws, monkeypatch):
    """The index compares each archive's manifest with its rows, not only whether it knows the file:
    rows dropped while a tree moved (an older primefs, a rebuilt index) or a step-5 write that was
    locked out are made good by the next `logs`."""
    import sqlite3

    from primefs.index.database import FILE
    from primefs.index.db import Index

    ws = fan_out(ws)
    grow(ws, 1)
    groups = trees(ws)
    counts = json.loads(cli(ws, "logs", "--counts", "--json").stdout)
    first, second = sorted(groups)
    # step 5 of the second tree locked out: its rows still say sessions/, and a `status` drops them
    real_write, calls = Index.write, []

    def write(self, fn, *a):
        if getattr(fn, "__name__", "") == "point_at_zip":
            calls.append(fn)
            if len(calls) == 2:
                return False  # the second tree's step 5: another writer held the lock all along
        return real_write(self, fn, *a)

    monkeypatch.setattr(Index, "write", write)
    assert archive.run(ws)["sessions"] == 8 and len(calls) == 2
    monkeypatch.undo()
    assert cli(ws, "status", "--json").stdout.strip() == "[]"
    # a row of the first tree lost (as a sync between two moves did before)
    db = sqlite3.connect(ws.state / FILE)
    db.execute("DELETE FROM events WHERE session = (SELECT key FROM sessions WHERE id = ?)", (groups[first][1],))
    db.execute("DELETE FROM sessions WHERE id = ?", (groups[first][1],))
    db.commit()
    db.close()
    assert json.loads(cli(ws, "logs", "--counts", "--json").stdout) == counts
    assert _archived_rows(ws) == {sid: f"archive/{root}.zip" for root, members in groups.items() for sid in members}
    for sid in (groups[first][1], groups[second][0]):
        r = cli(ws, "log", sid, "--json")
        assert r.returncode == 0 and r.stdout, r.stderr


def test_a_roll_back_never_deletes_a_folder_it_cannot_put_back(ws, monkeypatch):
    """Cut off after two folders moved; meanwhile a folder of the first one's id is back in sessions/:
    the roll-back puts the second back and keeps the first aside (never deleted), and says so."""
    ws = fan_out(ws)
    [(root, members)] = trees(ws).items()
    history = (ws.sessions / members[0] / "history.jsonl").read_bytes()

    class Crash(BaseException):
        pass

    real_rename, moves = os.rename, []

    def rename(src, dst):
        moves.append(src)
        if len(moves) == 3:
            raise Crash()
        real_rename(src, dst)

    monkeypatch.setattr(archive.os, "rename", rename)
    with pytest.raises(Crash):
        archive.run(ws)
    monkeypatch.undo()
    (ws.sessions / members[0]).mkdir()
    (ws.sessions / members[0] / "note.txt").write_text("someone else's\n")
    assert recover(ws) == [root]
    assert not (ws.state / "archiving" / root).exists()
    assert (ws.sessions / members[1] / "session.yaml").is_file()  # put back
    assert os.listdir(ws.sessions / members[0]) == ["note.txt"]  # not touched
    kept = ws.state / "archive-conflicts" / root / members[0]
    assert (kept / "history.jsonl").read_bytes() == history  # not deleted
    r = cli(ws, "archive", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["kept_aside"] == [f".primefs/archive-conflicts/{root}/{members[0]}"]
    r = cli(ws, "archive")
    assert "kept aside" in r.stdout and members[0] in r.stdout


def test_events_appended_just_before_the_move_are_indexed_with_the_tree(ws, monkeypatch):
    """A line appended after the index's last look but before the tree's snapshot (step 1) goes into the
    zip, and into the index with it: `logs` finds it."""
    ws = fan_out(ws)
    [(root, members)] = trees(ws).items()
    real_keys = archive._keys

    def keys(folder):
        if folder.parent == ws.sessions:  # step 1's snapshot, the folder still in sessions/
            Session(folder).history.append("notice", text=f"lastword{folder.name[-3:]}")
        return real_keys(folder)

    monkeypatch.setattr(archive, "_keys", keys)
    assert archive.run(ws)["sessions"] == 4
    monkeypatch.undo()
    with zipfile.ZipFile(ws.root / "archive" / f"{root}.zip") as z:
        lines = sum(len(z.read(f"sessions/{sid}/history.jsonl").splitlines()) for sid in members)
        assert all(b"lastword" in z.read(f"sessions/{sid}/history.jsonl") for sid in members)
    assert json.loads(cli(ws, "logs", "--counts", "--json").stdout)["events"] == lines
    r = cli(ws, "logs", "--json", "-n", "0", "-q", "lastword*")
    assert r.returncode == 0, r.stderr
    assert sorted(e["session"] for e in json.loads(r.stdout)) == sorted(members)
