"""Archive: finished session trees leave sessions/ for one zip file each, `archive/<root id>.zip`.

A workspace only grows; `primefs archive` keeps sessions/ (and git's working tree) to what may still
change. A tree goes whole or not at all: a root and all its descendants, each finished (by default
done, stopped or failed; `--status` may add idle), none with unread mail or heartbeats, none in use by
a runner, and with `--before DATE` none with an event since. Its goal file goes with it. Members are
workspace-relative paths (`sessions/<id>/...`, `goals/x.md`) and `primefs-archive.json` (what it
holds): `unzip archive/<id>.zip` in the workspace brings the tree back. Archived sessions stay in the
index (index.py): `primefs logs` finds their events and `primefs log` reads them from the zip.

One tree, step by step, so that a crash at any point leaves it whole, in one place (`recover`):
  1. a journal: .primefs/archiving/<root>/journal.json names the sessions and the goal (durably);
  2. each session folder, then the goal file, renamed into .primefs/archiving/<root>/;
  3. the moved folders looked at again: unread mail, or a history or session.yaml changed since step 1
     (something arrived meanwhile): everything goes back;
  4. the zip written as archive/<root>.zip.tmp, synced, renamed to archive/<root>.zip: from here on
     the tree is archived;
  5. the index rows point at the zip; 6. one git commit (the zip, the folders and goal removed);
  7. .primefs/archiving/<root>/ removed.
`recover` (run by `primefs archive`, `reindex` and a starting runner) finishes the trees whose zip
exists (5-7) and moves the others back.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import stat
import time
import zipfile
from collections import Counter, defaultdict
from contextlib import nullcontext
from pathlib import Path

from primefs import __version__
from primefs.errors import PrimefsError
from primefs.index.db import ARCHIVING, Index, read_result, row_of
from primefs.index.events import index_histories, sync_events
from primefs.store import summary as summaries
from primefs.store.fsutil import NAME_RE, fsync_dir, open_regular, walk_tree, write_atomic
from primefs.store.gitops import commit_paths, git
from primefs.store.journal import mark_session
from primefs.store.mail import what_waits
from primefs.store.session import subtree
from primefs.store.settings import FINISHED
from primefs.store.summary import stat_key

ARCHIVE = "archive"
MANIFEST = "primefs-archive.json"
DEFAULT_STATUSES = ("done", "stopped", "failed")
RUNTIME = ("kernel", "summary.json", "stop.request", "refine.request")  # never archived


CONFLICTS = "archive-conflicts"  # .primefs/archive-conflicts/<root>/: what a roll-back could not put back


def staging(ws) -> Path:
    return ws.state / ARCHIVING


def conflicts(ws) -> list[str]:
    """Workspace-relative paths a roll-back kept aside (their place was taken meanwhile): for the user."""
    folder = ws.state / CONFLICTS
    if not folder.is_dir():
        return []
    return sorted(p.relative_to(ws.root).as_posix() for root in folder.iterdir() if root.is_dir()
                  for p in root.iterdir())


def _trees(rows: dict[str, dict]) -> dict[str, list[str]]:
    """root -> the root and its descendants (parents first) among these rows; an orphan is a root."""
    children: dict[str, list[str]] = defaultdict(list)
    roots = []
    for sid, row in sorted(rows.items()):
        parent = row.get("parent")
        (children[parent].append(sid) if parent in rows and parent != sid else roots.append(sid))
    return {root: subtree(children, root) for root in roots}


def plan(ws, index: Index, *, before: float | None = None, statuses=DEFAULT_STATUSES, busy=lambda sid: False
         ) -> tuple[list[dict], Counter]:
    """The trees that can be archived now, and why the others cannot (reason -> trees)."""
    rows = index.sync()
    skipped: Counter = Counter()
    out = []
    for root, members in _trees(rows).items():
        tree = [rows[sid] for sid in members]
        why = None
        if any(r["broken"] for r in tree):
            why = "a broken session.yaml"
        elif any(r["status"] not in statuses for r in tree):
            why = "not finished" if any(r["status"] not in FINISHED for r in tree) else "status not chosen"
        elif before is not None and max((r["last_ts"] or 0) for r in tree) >= before:
            why = "newer than --before"
        elif any(busy(sid) for sid in members):
            why = "in use by the runner"
        else:
            why = next((w for r in tree if (w := what_waits(ws.sessions / r["id"], r["status"] == "stopped"))), None)
        if why:
            skipped[why] += 1
            continue
        out.append({"root": root, "name": rows[root]["name"], "sessions": members, "goal": None,
                    "stopped": [r["id"] for r in tree if r["status"] == "stopped"],
                    "file": f"{ARCHIVE}/{root}.zip", "last_ts": max((r["last_ts"] or 0) for r in tree)})
    # A goal file goes with the last tree that names it, when no session staying names it: it must
    # stay while one does (the runner takes a goal no session names), and must not stay behind alone.
    leaving = {sid for t in out for sid in t["sessions"]}
    staying = {row["goal"] for sid, row in rows.items() if sid not in leaving and row["goal"]}
    for t in out:
        goal = rows[t["root"]]["goal"]
        if goal and goal not in staying and (ws.root / goal).is_file():
            for other in out:
                other["goal"] = None if other["goal"] == goal else other["goal"]
            t["goal"] = goal
    return out, skipped


def _keys(folder: Path) -> list:
    return [stat_key(folder / "history.jsonl"), stat_key(folder / "session.yaml")]


def archive_tree(ws, index: Index, tree: dict, busy=lambda sid: False) -> bool:
    """Steps 1-7 for one tree. False (and the tree back in place) if something arrived meanwhile."""
    root, members, goal = tree["root"], tree["sessions"], tree["goal"]
    sync_events(index, members)  # its events are found through the index once it is zipped
    stage = staging(ws) / root
    stage.mkdir(parents=True, exist_ok=False)
    keys = {sid: _keys(ws.sessions / sid) for sid in members}
    journal = {"root": root, "name": tree["name"], "sessions": members, "goal": goal, "file": tree["file"],
               "keys": keys, "started": time.time()}
    write_atomic(stage / "journal.json", json.dumps(journal))  # 1
    for sid in members:  # 2
        os.rename(ws.sessions / sid, stage / sid)
    if goal:
        (stage / goal).parent.mkdir(parents=True, exist_ok=True)
        os.rename(ws.root / goal, stage / goal)
    for sid in members:  # 3
        if _keys(stage / sid) != keys[sid] or what_waits(stage / sid, sid in tree.get("stopped", ())) or busy(sid):
            roll_back(ws, stage)
            return False
    _index_staged(index, stage, members)
    _write_zip(ws, stage, journal)  # 4
    _finish(ws, index, stage, journal)  # 5-7
    return True


def _index_staged(index: Index, stage: Path, members: list[str]) -> None:
    """The rows and events of the staged folders, as they go into the zip: what was appended between the
    index's last look and step 1 is found too (their files no longer change)."""
    rows = []
    for sid in members:
        folder = stage / sid
        s = summaries.fresh(folder, write=False)
        rows.append(row_of(s, read_result(folder), [s["history"], s["meta_key"], stat_key(folder / "result.md")]))
    index.write(index.store, rows, [])
    staged = set(members)
    index_histories(index, lambda sid: stage / sid if sid in staged else None, members)


def _write_zip(ws, stage: Path, journal: dict) -> None:
    final = ws.root / journal["file"]
    final.parent.mkdir(exist_ok=True)
    tmp = final.with_name(final.name + ".tmp")
    manifest = {k: journal[k] for k in ("root", "name", "sessions", "goal")}
    manifest.update(archived=time.time(), primefs=__version__)
    skipped: list[str] = []
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as z:
        for sid in journal["sessions"]:
            z.writestr(f"sessions/{sid}/", b"")
            for rel, kind, st, value in walk_tree(stage / sid, deep="raise"):  # never through a link; all or none
                top = rel.split("/", 1)[0]
                if top in RUNTIME or rel.startswith("mail/tmp") or rel.endswith(".tmp"):
                    continue
                _add(z, f"sessions/{sid}/{rel}", kind, st, value, skipped)
        if journal["goal"]:
            path = stage / journal["goal"]
            _add(z, journal["goal"], "file", os.lstat(path), lambda: open_regular(path), skipped)
        manifest["skipped"] = skipped  # FIFOs, sockets, devices: not files, never read
        z.writestr(MANIFEST, json.dumps(manifest, indent=1))
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.rename(tmp, final)
    fsync_dir(final.parent)


def _add(z: zipfile.ZipFile, arcname: str, kind: str, st, value, skipped: list[str]) -> None:
    """One entry (as fsutil.walk_tree gives it): a folder (empty ones too), a regular file's bytes, a
    symbolic link as a link (its target never read: a link to /etc/shadow or /dev/zero stays a link),
    anything else left out."""
    if kind == "dir":
        z.writestr(arcname + "/", b"")
        return
    if kind not in ("file", "link"):
        skipped.append(arcname)
        return
    info = zipfile.ZipInfo(arcname, time.localtime(st.st_mtime)[:6])
    info.compress_type = zipfile.ZIP_DEFLATED
    if kind == "link":
        info.external_attr = (stat.S_IFLNK | 0o777) << 16
        z.writestr(info, value)
        return
    info.external_attr = (st.st_mode & 0xFFFF) << 16
    with value() as src, z.open(info, "w", force_zip64=st.st_size > (1 << 31)) as dst:
        shutil.copyfileobj(src, dst, 1 << 20)


def _finish(ws, index: Index, stage: Path, journal: dict) -> None:
    members = journal["sessions"]
    stat = stat_key(ws.root / journal["file"])

    def point_at_zip(db):  # 5. Rows missing here (the index rebuilt meanwhile), or this write locked out:
        # sync_archives compares the manifest with the rows and adds what is missing (archived.py)
        db.execute("UPDATE sessions SET place = ? WHERE id IN (SELECT value FROM json_each(?))",
                   (journal["file"], json.dumps(members)))
        db.execute("INSERT OR REPLACE INTO archives (place, stat, sessions) VALUES (?, ?, ?)",
                   (journal["file"], json.dumps(stat), json.dumps(members)))

    index.write(point_at_zip)
    paths = [f"sessions/{sid}" for sid in members] + ([journal["goal"]] if journal["goal"] else [])
    tracked = git(ws.root, "ls-files", "-z", "--", *paths, check=False).stdout.split("\0")
    paths = [p for p in paths if any(t == p or t.startswith(p + "/") for t in tracked)]  # git add refuses others
    commit_paths(ws.root, [journal["file"], *paths],  # 6: whole folders, their harness/ too (it left with them)
                 f"archive: {journal['root']} ({journal['name']}), {len(members)} session(s) -> {journal['file']}",
                 harness=True)
    _remove_stage(stage)  # 7


def _remove_stage(stage: Path) -> None:
    """Renamed first (one atomic step), then removed: a kill half-way through the removal leaves a
    `.done-` folder the next start removes, never half a stage that looks cut off before its journal."""
    done = stage.with_name(f".done-{stage.name}")
    shutil.rmtree(done, ignore_errors=True)
    os.rename(stage, done)
    shutil.rmtree(done)


def roll_back(ws, stage: Path) -> list[str]:
    """Everything of a tree whose zip was never finished goes back where it was. A folder or goal file
    whose place was taken meanwhile (a session of that id back in sessions/) is never deleted: it is
    kept aside in .primefs/archive-conflicts/<root>/. Returns what was kept aside."""
    journal = read_journal(stage)
    if journal is None:  # cut off before the journal was written (nothing was moved yet), or damaged
        return _clear(ws, stage, [])
    aside: list[str] = []
    moves = [(stage / sid, ws.sessions / sid) for sid in journal["sessions"]]
    if journal.get("goal"):
        moves.append((stage / journal["goal"], ws.root / journal["goal"]))
    for src, dst in moves:
        if not src.exists():
            continue
        if not dst.exists():
            os.rename(src, dst)
            mark_session(dst)  # back in sessions/: its row is brought up to date (store/journal.py)
            continue
        _keep_aside(ws, stage.name, src, src.relative_to(stage).as_posix().replace("/", "--"), aside)
    (ws.root / (journal["file"] + ".tmp")).unlink(missing_ok=True)
    return _clear(ws, stage, aside)


def read_journal(stage: Path) -> dict | None:
    """A stage's journal, or None if it is missing or damaged (not JSON, nested, of other shapes): what
    such a stage holds is then kept aside, never guessed at."""
    try:
        with open_regular(stage / "journal.json") as f:
            j = json.loads(f.read())
    except (OSError, ValueError, RecursionError):
        return None
    ok = isinstance(j, dict) and isinstance(j.get("root"), str) and isinstance(j.get("file"), str) \
        and isinstance(j.get("sessions"), list) and all(isinstance(s, str) and NAME_RE.fullmatch(s) for s in j["sessions"]) \
        and (j.get("goal") is None or isinstance(j["goal"], str) and j["goal"].startswith("goals/") and ".." not in j["goal"]) \
        and isinstance(j.get("name"), str) and isinstance(j.get("keys", {}), dict) and ".." not in j["file"]
    return j if ok else None


def _keep_aside(ws, root: str, src: Path, name: str, aside: list[str]) -> None:
    kept = ws.state / CONFLICTS / root / name
    if kept.exists():
        kept = kept.with_name(f"{kept.name}.{secrets.token_hex(3)}")
    kept.parent.mkdir(parents=True, exist_ok=True)
    os.rename(src, kept)
    aside.append(kept.relative_to(ws.root).as_posix())


def _clear(ws, stage: Path, aside: list[str]) -> list[str]:
    """The stage removed once only its journal is left; anything else in it is kept aside, not deleted."""
    left = [p for p in stage.rglob("*") if p.is_file() and not p.name.startswith("journal.json")]
    if left:
        _keep_aside(ws, stage.name, stage, "left-in-stage", aside)
    else:
        _remove_stage(stage)
    return aside


def recover(ws, index: Index | None = None) -> list[str]:
    """Trees a crash left between sessions/ and their zip: finished or moved back. Returns their roots."""
    folder = staging(ws)
    if not folder.is_dir():
        return []
    done = []
    for stage in sorted(p for p in folder.iterdir() if p.is_dir()):
        if stage.name.startswith(".done-"):  # finished; its removal was cut off
            shutil.rmtree(stage, ignore_errors=True)
            continue
        journal = read_journal(stage)
        complete = journal is not None and (ws.root / journal["file"]).is_file()
        if complete:
            with (nullcontext(index) if index is not None else Index(ws.root)) as own:
                _finish(ws, own, stage, journal)
        else:
            roll_back(ws, stage)
        done.append(stage.name)
    return done


def run(ws, *, before: float | None = None, statuses=DEFAULT_STATUSES, dry_run: bool = False,
        busy=lambda sid: False, on_tree=lambda tree: None) -> dict:
    """Archive every tree that can be (the caller holds the runner lock, or is the runner)."""
    with Index(ws.root) as index:
        if not dry_run:
            recover(ws, index)
        trees, skipped = plan(ws, index, before=before, statuses=statuses, busy=busy)
        archived = []
        for tree in trees:
            if dry_run:
                archived.append(tree)
                continue
            on_tree(tree)
            if archive_tree(ws, index, tree, busy):
                archived.append(tree)
            else:
                skipped["something arrived while archiving"] += 1
    out = {"dry_run": dry_run, "trees": [{k: t[k] for k in ("root", "name", "file", "goal")} | {"sessions": len(
        t["sessions"])} for t in archived], "sessions": sum(len(t["sessions"]) for t in archived),
        "skipped": dict(skipped)}
    kept = conflicts(ws)
    return out | ({"kept_aside": kept} if kept else {})


# -- with a runner running: it does the work (it knows which sessions are in use) -------------------------
def serve(ws, request: dict, *, busy, freeze, done) -> dict:
    """The runner's side of `primefs archive` (a request through store/control.ask_runner). freeze(sessions):
    a tree is about to move (nothing may wake them meanwhile); done(gone, back): these left sessions/,
    those stayed (unfreeze them)."""
    archived: list[dict] = []

    def on_tree(tree):
        freeze(tree["sessions"])
        archived.append(tree)

    try:
        return run(ws, before=request.get("before"), statuses=tuple(request.get("statuses") or DEFAULT_STATUSES),
                   busy=busy, on_tree=on_tree)
    except Exception as exc:  # noqa: BLE001 - said to the command that asked, and the runner goes on
        raise PrimefsError(f"the runner could not archive: {type(exc).__name__}: {exc}") from exc
    finally:
        done([sid for t in archived for sid in t["sessions"] if not (ws.sessions / sid).exists()],
             [sid for t in archived for sid in t["sessions"] if (ws.sessions / sid).exists()])
