"""The harness's history in git: one commit per change with `Primefs-*` trailers (who, what, why),
hand edits committed as `Primefs-Source: user`, the log read back from the trailers, reverts as new
commits, outcomes as git notes. The file layout it maps paths onto is defined here too."""
from __future__ import annotations

import os
import re
from pathlib import Path

from primefs.errors import PrimefsError
from primefs.harness.changes import parse_trailers, read_log
from primefs.store.fsutil import check_name
from primefs.store.gitops import commit_lock, git

KINDS = ("note", "memory", "skill", "agent")
DIRS = {"note": "notes", "memory": "memory", "skill": "skills", "agent": "agents"}
KIND_OF_DIR = {d: k for k, d in DIRS.items()}
SOURCES = ("agent", "refine", "user")
OUTCOMES = ("good", "bad")
NOTES_REF = "primefs-outcomes"
SKILL_FILE = "SKILL.md"


class HarnessGit:
    def __init__(self, root: Path):
        self.root = Path(root)

    def commit(self, paths: list[str], subject: str, trailers: list[tuple[str, str]]) -> str | None:
        """Commit exactly `paths` (caller holds the commit lock), never anything else the user staged."""
        git(self.root, "add", "-A", "--", *paths)
        if git(self.root, "diff", "--cached", "--quiet", "--", *paths, check=False).returncode == 0:
            return None
        message = subject + "\n\n" + "".join(f"{k}: {v}\n" for k, v in trailers)
        r = git(self.root, "commit", "-q", "--no-verify", "-F", "-", "--", *paths, input=message, check=False)
        if r.returncode != 0:
            raise PrimefsError(f"git commit of {', '.join(paths)} failed: {(r.stderr or r.stdout).strip()}")
        return git(self.root, "rev-parse", "HEAD").stdout.strip()

    def commit_user_edits(self) -> list[str]:
        """Commit uncommitted changes under harness/ and sessions/*/harness/, one commit per entry,
        with `Primefs-Source: user`. Files that are not entries (e.g. harness/README.md) are left alone."""
        with commit_lock(self.root):
            return self.commit_hand_edits(["harness", *self.session_harness_dirs()])

    def session_harness_dirs(self) -> list[str]:
        """sessions/<id>/harness folders that exist or have files in git. Named one by one: a glob
        pathspec (`sessions/*/harness/**`) makes `git status` walk every session's folder."""
        tracked = git(self.root, "ls-files", "-z", "--", ":(glob)sessions/*/harness/**").stdout  # the index only
        found = {"/".join(p.split("/")[:3]) for p in tracked.split("\0") if p}
        try:
            with os.scandir(self.root / "sessions") as it:
                found |= {f"sessions/{e.name}/harness" for e in it
                          if e.is_dir() and os.path.isdir(os.path.join(e.path, "harness"))}
        except FileNotFoundError:
            pass
        return sorted(found)

    def commit_hand_edits(self, pathspecs: list[str]) -> list[str]:
        # Also run before every put/delete (lock held), so an agent's commit never absorbs a person's edit.
        r = git(self.root, "status", "--porcelain=v1", "-z", "--untracked-files=all", "--no-renames",
                "--", *pathspecs)
        entries: dict[str, tuple[str, str]] = {}  # entry path -> (kind, name)
        for rec in r.stdout.split("\0"):
            found = entry_of(rec[3:]) if len(rec) > 3 else None
            if found:
                entries[found[2]] = found[:2]
        shas = []
        for path, (kind, name) in sorted(entries.items()):
            md = self.root / path / SKILL_FILE if kind == "skill" else self.root / path
            in_head = git(self.root, "cat-file", "-e", f"HEAD:{md.relative_to(self.root).as_posix()}", check=False).returncode == 0
            action = "delete" if not md.exists() else "update" if in_head else "add"
            trailers = provenance(None, kind, name, path, "user", None, None)
            sha = self.commit([path], f"harness({kind}/{name}): {action} (hand edit)", trailers)
            if sha:
                shas.append(sha)
        return shas

    # -- history ------------------------------------------------------------------------------------
    def harness_commit(self, sha: str) -> tuple[str, str, dict]:
        ok = isinstance(sha, str) and sha and not sha.startswith("-")  # never let a "sha" be a git option
        r = git(self.root, "rev-parse", "--verify", "--quiet", f"{sha}^{{commit}}", check=False) if ok else None
        if r is None or r.returncode != 0:
            raise PrimefsError(f"unknown commit {sha!r}")
        full = r.stdout.strip()
        out = git(self.root, "log", "-1", "--format=%P%x1f%s%x1f%(trailers:only,unfold)", full).stdout
        parents, subject, trailers = out.split("\x1f", 2)
        t = parse_trailers(trailers)
        if "Primefs-Kind" not in t:
            t = self._plain_revert(full) or t
        if "Primefs-Kind" not in t:
            raise PrimefsError(f"commit {full[:10]} ({subject}) is not a harness change (no Primefs-Kind trailer)")
        if len(parents.split()) != 1:
            raise PrimefsError(f"commit {full[:10]} is a merge or root commit; cannot revert it")
        return full, subject, t

    def _plain_revert(self, full: str) -> dict:
        """A plain `git revert` of a harness change counts as a change of that entry (it has no trailers)."""
        row = next((r for r in self.log() if r["sha"] == full), None)
        return {"Primefs-Kind": row["kind"], "Primefs-Name": row["name"], "Primefs-Path": row["path"] or ""} if row else {}

    def log(self, limit: int | None = None) -> list[dict]:
        """Harness commits and reverts of them, newest first, with trailers, outcome and `reverted_by`."""
        rows = read_log(self.root, NOTES_REF)
        return rows[:limit] if limit else rows

    def revert(self, sha: str, *, source: str = "user", session: str | None = None,
               evidence=None, intent: str | None = None) -> str:
        """Undo one harness commit with a new commit (`git revert`); returns the new sha.

        Pending hand edits are committed first (so they are neither lost nor swept in). Refused, with the
        tree left as it was, for non-harness commits, staged changes, or conflicts with later changes."""
        full, subject, t = self.harness_commit(sha)
        kind, name = t["Primefs-Kind"], t.get("Primefs-Name", "?")
        trailers = provenance(session, kind, name, t.get("Primefs-Path", ""), source, evidence, intent)
        self.commit_user_edits()
        with commit_lock(self.root):
            by = next((r["reverted_by"] for r in self.log() if r["sha"] == full), None)
            if by:  # git would find nothing to undo; say why instead
                raise PrimefsError(f"cannot revert {full[:10]} ({subject}): already reverted by {by[:10]}")
            gitdir = self.root / git(self.root, "rev-parse", "--git-dir").stdout.strip()
            if any((gitdir / f).exists() for f in ("REVERT_HEAD", "CHERRY_PICK_HEAD", "MERGE_HEAD", "sequencer",
                                                     "rebase-merge", "rebase-apply")):
                raise PrimefsError("a git merge, revert or rebase is in progress in the workspace; finish it first")
            if git(self.root, "diff", "--cached", "--quiet", check=False).returncode != 0:
                raise PrimefsError("there are staged changes in the workspace (git diff --cached); "
                                   "commit or unstage them before reverting")
            before = git(self.root, "rev-parse", "HEAD").stdout.strip()
            r = git(self.root, "revert", "--no-edit", full, check=False)
            if r.returncode != 0:
                self._undo_failed_revert(before)
                raise PrimefsError(f"cannot revert {full[:10]} ({subject}): {_why(r)}")
            trailers.append(("Primefs-Reverts", full))
            what = subject.split("): ", 1)[-1]  # "add - ..." of "harness(kind/name): add - ..."
            if subject.startswith('Revert "'):  # a plain `git revert`: 'Revert "harness(kind/name): add - ..."'
                what = f"git revert ({what.rstrip(chr(34))})"
            message = (f"harness({kind}/{name}): revert {full[:10]} ({summary(what, 50)})\n\n"
                       f"This reverts commit {full}.\n\n" + "".join(f"{k}: {v}\n" for k, v in trailers if v))
            # --only with no paths: change just the message, never pick up anything staged meanwhile
            a = git(self.root, "commit", "--amend", "--only", "-q", "--no-verify", "-F", "-", input=message, check=False)
            if a.returncode != 0:  # a revert without its trailers would not be a harness change: take it back
                git(self.root, "reset", "-q", "--keep", before, check=False)
                raise PrimefsError(f"cannot revert {full[:10]} ({subject}): git commit failed: {whole(a)}")
            return git(self.root, "rev-parse", "HEAD").stdout.strip()

    def _undo_failed_revert(self, before: str) -> None:
        git(self.root, "revert", "--abort", check=False)  # back to HEAD, tree clean
        # a revert whose commit could not be written (e.g. signing failed) is left staged with no
        # revert in progress, so --abort does nothing; the index was clean before, so undo what it staged
        if git(self.root, "rev-parse", "HEAD").stdout.strip() == before:
            git(self.root, "reset", "-q", "--merge", before, check=False)

    def record_outcome(self, sha: str, outcome: str, note: str | None = None) -> None:
        """Record whether a change had its intended effect, as a git note (replaces an earlier one)."""
        if outcome not in OUTCOMES:
            raise PrimefsError(f"outcome must be good or bad, not {outcome!r}")
        full, _, _ = self.harness_commit(sha)
        text = outcome + (f"\n{note.strip()}" if note and note.strip() else "") + "\n"
        with commit_lock(self.root):
            git(self.root, "notes", f"--ref={NOTES_REF}", "add", "-f", "-F", "-", full, input=text)


def whole(r) -> str:
    """All that git said, as one line. Its hints are left out: they name commands for a revert in
    progress (--continue, --skip), and the failed revert has been undone."""
    lines = [ln.strip() for ln in (r.stderr + "\n" + r.stdout).splitlines()]
    return "; ".join(ln for ln in lines if ln and not ln.startswith("hint:")) or f"git exited with {r.returncode}"


def _why(r) -> str:
    out = r.stdout + "\n" + r.stderr
    paths = re.findall(r"Merge conflict in (\S+)", out)
    if paths:
        return f"it conflicts with later changes to {', '.join(paths)}; edit the file instead"
    other = [ln.strip() for ln in out.splitlines() if ln.startswith("CONFLICT")]
    if other:
        return f"it conflicts with later changes ({'; '.join(other)})"
    if "nothing to commit" in out:
        return "its change is not in the files any more (git revert found nothing to undo)"
    return f"git revert failed: {whole(r)}"


def one_line(value) -> str:
    return " ".join(str(value).split())  # trailer values must be one line


def summary(text: str, width: int = 60) -> str:
    line = next((ln.strip("# ").strip() for ln in str(text).splitlines() if ln.strip()), "")
    return line if len(line) <= width else line[:width - 3].rstrip() + "..."


def provenance(session, kind, name, path, source, evidence, intent, gate=None) -> list[tuple[str, str]]:
    if source not in SOURCES:
        raise PrimefsError(f"source must be one of {', '.join(SOURCES)}, not {source!r}")
    if isinstance(evidence, str):
        evidence = [evidence]
    evidence = [one_line(e) for e in evidence or () if one_line(e)]
    intent = one_line(intent) if intent else ""
    if source == "refine" and not (evidence and intent):
        raise PrimefsError("a refine change needs evidence=[event ids] and intent='expected effect'")
    if session:
        check_name(session, "session id")
    out = [("Primefs-Session", session or "-"), ("Primefs-Kind", kind), ("Primefs-Name", name),
           ("Primefs-Path", path), ("Primefs-Source", source)]
    if evidence:
        out.append(("Primefs-Evidence", ", ".join(evidence)))
    if intent:
        out.append(("Primefs-Intent", intent))
    if gate:
        out.append(("Primefs-Gate", one_line(gate)))
    return out


def entry_of(rel: str) -> tuple[str, str, str] | None:
    """A workspace-relative file path -> (kind, name, entry path), if it belongs to a harness entry."""
    parts = rel.split("/")
    if parts[0] == "sessions" and len(parts) > 2 and parts[2] == "harness":
        prefix, parts = parts[:3], parts[3:]
    elif parts[0] == "harness":
        prefix, parts = parts[:1], parts[1:]
    else:
        return None
    if len(parts) < 2 or parts[0] not in KIND_OF_DIR or parts[1].startswith("."):
        return None
    kind = KIND_OF_DIR[parts[0]]
    if kind == "skill":
        return (kind, parts[1], "/".join(prefix + parts[:2])) if len(parts) >= 3 else None
    if len(parts) != 2 or not parts[1].endswith(".md"):
        return None
    return kind, parts[1][:-3], "/".join(prefix + parts)
