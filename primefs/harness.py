"""The continual harness: notes, memories, skills and subagent specs as files, each change one git commit.

Global entries live in `harness/`, session-local ones in `sessions/<id>/harness/` (same layout). Every
change is one commit touching only that entry, with `Primefs-*` trailers saying who, what and why;
`log` reads them back, `revert` undoes one change with a new commit, `record_outcome` adds a git note.
"""
from __future__ import annotations

import re
import shutil
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from ruamel.yaml.comments import CommentedMap

from . import frontmatter
from .errors import PrimefsError
from .fsutil import check_name, write_atomic
from .gitops import commit_lock, git
from .session import iso, Session
from .workspace import Workspace

KINDS = ("note", "memory", "skill", "agent")
DIRS = {"note": "notes", "memory": "memory", "skill": "skills", "agent": "agents"}
KIND_OF_DIR = {d: k for k, d in DIRS.items()}
SOURCES = ("agent", "refine", "user")
OUTCOMES = ("good", "bad")
NAME_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
NOTES_REF = "primefs-outcomes"
SKILL_FILE = "SKILL.md"


@dataclass
class Entry:
    kind: str
    name: str
    scope: str                   # "global" or "session"
    session: str | None          # the session folder it lives in (scope "session")
    path: str                    # workspace-relative: the .md file, or the skill's folder
    description: str = ""
    body: str = ""
    meta: dict = field(default_factory=dict)   # the whole front matter (round-trip: comments kept)
    files: list[str] = field(default_factory=list)  # a skill's other files (its Python modules)
    updated: float = 0.0         # primefs.updated, else the file's mtime: orders memories for the prompt
    problem: str | None = None   # set when the file is unusable; the message names file and line


def check_kind(kind: str) -> str:
    if kind not in KINDS:
        raise PrimefsError(f"unknown harness kind {kind!r}: use one of {', '.join(KINDS)}")
    return kind


def check_entry_name(name: str) -> str:
    if not isinstance(name, str) or len(name) > 64 or not NAME_RE.match(name):
        raise PrimefsError(f"invalid harness name {name!r}: use lowercase letters, digits and single '-' "
                           "between them (kebab-case, max 64), e.g. sky-color")
    return name


def session_chain(ws: Workspace, session_id: str) -> list[str]:
    """The session and its ancestors, nearest first: the `sessions` argument of get/list."""
    chain: list[str] = []
    sid = session_id
    while sid and sid not in chain:
        chain.append(check_name(sid, "session id"))
        try:
            sid = Session(ws.sessions / sid).read_meta().get("parent")
        except (OSError, PrimefsError):
            break
    return chain


class Harness:
    def __init__(self, ws: Workspace):
        self.ws = ws
        self.root = ws.root

    # -- locations ----------------------------------------------------------------------------------
    def _base(self, scope: str, session: str | None) -> Path:
        if scope == "global":
            return self.ws.harness
        if scope != "session":
            raise PrimefsError(f"unknown harness scope {scope!r}: use global or session")
        if not session:
            raise PrimefsError("scope 'session' needs the session id (session=...)")
        check_name(session, "session id")
        if not (self.ws.sessions / session).is_dir():
            raise PrimefsError(f"no session {session!r} in {self.ws.sessions}")
        return self.ws.sessions / session / "harness"

    def _path(self, base: Path, kind: str, name: str) -> Path:
        return base / DIRS[kind] / name if kind == "skill" else base / DIRS[kind] / f"{name}.md"

    def _rel(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()

    def _locations(self, sessions) -> list[tuple[str, str | None, Path]]:
        if isinstance(sessions, str):  # one id, not its characters
            sessions = [sessions]
        out = [("session", s, self.ws.sessions / check_name(s, "session id") / "harness") for s in sessions or ()]
        return out + [("global", None, self.ws.harness)]

    # -- reading ------------------------------------------------------------------------------------
    def _read(self, kind: str, name: str, scope: str, session: str | None, path: Path) -> Entry:
        entry = Entry(kind, name, scope, session, self._rel(path))
        md = path / SKILL_FILE if kind == "skill" else path
        label = self._rel(md)
        if not NAME_RE.match(name) or len(name) > 64:
            entry.problem = f"{label}: {name!r} is not a valid harness name (kebab-case, max 64)"
            return entry
        if kind == "skill":
            if not path.is_dir():
                entry.problem = f"{entry.path}: a skill must be a folder with a SKILL.md"
                return entry
            entry.files = sorted(p.name for p in path.iterdir()
                                 if p.is_file() and p.name != SKILL_FILE and not p.name.startswith("."))
            if not md.is_file():
                entry.problem = f"{label}: missing (a skill folder needs a SKILL.md)"
                return entry
        try:
            meta, body = frontmatter.read(md, label)
        except PrimefsError as exc:
            entry.problem = str(exc)
            return entry
        if meta.get("name") is not None and meta.get("name") != name:
            line = meta.lc.key("name")[0] + 2 if hasattr(meta, "lc") else 2
            entry.problem = f"{label}:{line}: name {meta.get('name')!r} must equal the file name {name!r}"
            return entry
        entry.meta, entry.body = meta, body
        entry.description = str(meta.get("description") or "").strip()
        pf = meta.get("primefs")
        entry.updated = _timestamp(pf.get("updated") if isinstance(pf, dict) else None) or md.stat().st_mtime
        return entry

    def get(self, kind: str, name: str, sessions=()) -> Entry | None:
        """The entry visible from `sessions` (nearest first), else global; None if there is none.
        Raises PrimefsError (naming file and line) if the visible file is broken."""
        check_kind(kind)
        check_entry_name(name)
        for scope, sid, base in self._locations(sessions):
            path = self._path(base, kind, name)
            if path.exists():
                entry = self._read(kind, name, scope, sid, path)
                if entry.problem:
                    raise PrimefsError(entry.problem)
                return entry
        return None

    def list(self, kind: str | None = None, sessions=(), all_sessions: bool = False) -> list[Entry]:
        """Entries visible from `sessions` (nearest shadows farther and global, by kind and name).
        Broken files come back as entries with `problem` set (they still shadow); never raises for them.
        `all_sessions`: every global and every session-local entry, nothing shadowed (for listings)."""
        kinds = [check_kind(kind)] if kind else list(KINDS)
        if all_sessions:
            sessions = sorted(p.parent.name for p in self.ws.sessions.glob("*/harness") if p.is_dir())
        seen: set[tuple] = set()
        out: list[Entry] = []
        for scope, sid, base in self._locations(sessions):
            for k in kinds:
                folder = base / DIRS[k]
                if not folder.is_dir():
                    continue
                for p in sorted(folder.iterdir()):
                    if p.name.startswith("."):  # .gitkeep, write_atomic temp files
                        continue
                    name = p.name if k == "skill" else p.stem
                    if (k == "skill") != p.is_dir() or (k != "skill" and p.suffix != ".md"):
                        want = "folders <name>/ with a SKILL.md" if k == "skill" else "<name>.md files"
                        out.append(Entry(k, p.name, scope, sid, self._rel(p),
                                         problem=f"{self._rel(p)}: not a harness entry ({folder.name}/ holds {want})"))
                        continue
                    key = (k, name) if not all_sessions else (k, name, sid)
                    if key not in seen:
                        seen.add(key)
                        try:
                            out.append(self._read(k, name, scope, sid, p))
                        except OSError:  # removed while we listed: not an entry any more
                            pass
        return sorted(out, key=lambda e: (KINDS.index(e.kind), e.name, e.scope != "session"))

    # -- changing -----------------------------------------------------------------------------------
    def put(self, kind: str, name: str, body: str | None = None, *, scope: str = "global",
            session: str | None = None, description: str | None = None, source: str = "agent",
            evidence=None, intent: str | None = None, files: dict[str, str | None] | None = None,
            **fields) -> str | None:
        """Create or update one entry and commit it; returns the commit sha.

        On update the existing front matter is edited in place (unknown keys and comments kept); `body`
        None keeps the old body. `fields` are extra front matter keys (`allowed_tools` -> `allowed-tools`;
        None removes a key). `files` (skills only): {"mod.py": code, "old.py": None to delete}."""
        check_kind(kind)
        check_entry_name(name)
        if files and kind != "skill":
            raise PrimefsError("files=... is only for skills (their Python modules)")
        for fname in files or {}:
            if check_name(fname, "skill file name") == SKILL_FILE:
                raise PrimefsError(f"{SKILL_FILE} is written from body/description, not files=...")
        for key in fields:
            if key in ("name", "primefs"):
                raise PrimefsError(f"{key!r} is set by primefs; not a field you can pass")
        path = self._path(self._base(scope, session), kind, name)
        trailers = _provenance(session, kind, name, self._rel(path), source, evidence, intent)
        md = path / SKILL_FILE if kind == "skill" else path
        with commit_lock(self.root):
            self._commit_hand_edits([self._rel(path)])
            existing = md.exists()
            if existing:
                meta, old_body = frontmatter.read(md, self._rel(md))  # broken: raise, never overwrite
            elif body is None:
                raise PrimefsError(f"{kind} {name!r} does not exist yet; give its body")
            else:
                meta, old_body = CommentedMap(), ""
                if kind in ("skill", "agent") and not description:
                    raise PrimefsError(f"a new {kind} needs a description: it is all the model sees of it")
            meta["name"] = name
            if description is not None:
                meta["description"] = description
            for key, value in fields.items():
                key = key.replace("_", "-")
                if value is None:
                    meta.pop(key, None)
                else:
                    meta[key] = value
            pf = meta.get("primefs")
            if not isinstance(pf, dict):
                pf = meta["primefs"] = CommentedMap()
            now = iso()
            pf.setdefault("created", now)
            pf["updated"], pf["source"] = now, source
            if session:
                pf["session"] = session
            else:
                pf.pop("session", None)  # a stale author would be wrong provenance
            text = body if body is not None else old_body
            md.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(md, frontmatter.dump(meta, text if text.endswith("\n") else text + "\n"))
            for fname, code in (files or {}).items():
                if code is None:
                    (path / fname).unlink(missing_ok=True)
                else:
                    write_atomic(path / fname, code)
            summary = _summary(description or meta.get("description") or text)
            subject = f"harness({kind}/{name}): {'update' if existing else 'add'}" + (f" - {summary}" if summary else "")
            return self._commit([self._rel(path)], subject, trailers)

    def delete(self, kind: str, name: str, *, scope: str = "global", session: str | None = None,
               source: str = "agent", evidence=None, intent: str | None = None) -> str | None:
        """Remove one entry (a skill's whole folder) and commit that; returns the commit sha."""
        check_kind(kind)
        check_entry_name(name)
        path = self._path(self._base(scope, session), kind, name)
        trailers = _provenance(session, kind, name, self._rel(path), source, evidence, intent)
        with commit_lock(self.root):
            if not path.exists():
                raise PrimefsError(f"no {scope} {kind} {name!r} (looked for {self._rel(path)})")
            self._commit_hand_edits([self._rel(path)])
            shutil.rmtree(path) if path.is_dir() else path.unlink()
            return self._commit([self._rel(path)], f"harness({kind}/{name}): delete", trailers)

    def _commit(self, paths: list[str], subject: str, trailers: list[tuple[str, str]]) -> str | None:
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
            return self._commit_hand_edits(["harness", ":(glob)sessions/*/harness/**"])

    def _commit_hand_edits(self, pathspecs: list[str]) -> list[str]:
        # Also run before every put/delete (lock held), so an agent's commit never absorbs a person's edit.
        r = git(self.root, "status", "--porcelain=v1", "-z", "--untracked-files=all", "--no-renames",
                "--", *pathspecs)
        entries: dict[str, tuple[str, str]] = {}  # entry path -> (kind, name)
        for rec in r.stdout.split("\0"):
            found = _entry_of(rec[3:]) if len(rec) > 3 else None
            if found:
                entries[found[2]] = found[:2]
        shas = []
        for path, (kind, name) in sorted(entries.items()):
            md = self.root / path / SKILL_FILE if kind == "skill" else self.root / path
            in_head = git(self.root, "cat-file", "-e", f"HEAD:{self._rel(md)}", check=False).returncode == 0
            action = "delete" if not md.exists() else "update" if in_head else "add"
            trailers = _provenance(None, kind, name, path, "user", None, None)
            sha = self._commit([path], f"harness({kind}/{name}): {action} (hand edit)", trailers)
            if sha:
                shas.append(sha)
        return shas

    # -- history ------------------------------------------------------------------------------------
    def _harness_commit(self, sha: str) -> tuple[str, str, dict]:
        ok = isinstance(sha, str) and sha and not sha.startswith("-")  # never let a "sha" be a git option
        r = git(self.root, "rev-parse", "--verify", "--quiet", f"{sha}^{{commit}}", check=False) if ok else None
        if r is None or r.returncode != 0:
            raise PrimefsError(f"unknown commit {sha!r}")
        full = r.stdout.strip()
        out = git(self.root, "log", "-1", "--format=%P%x1f%s%x1f%(trailers:only,unfold)", full).stdout
        parents, subject, trailers = out.split("\x1f", 2)
        t = _parse_trailers(trailers)
        if "Primefs-Kind" not in t:
            raise PrimefsError(f"commit {full[:10]} ({subject}) is not a harness change (no Primefs-Kind trailer)")
        if len(parents.split()) != 1:
            raise PrimefsError(f"commit {full[:10]} is a merge or root commit; cannot revert it")
        return full, subject, t

    def log(self, limit: int | None = None) -> list[dict]:
        """Harness commits, newest first, with their trailers and recorded outcome."""
        fmt = "%H%x1f%aI%x1f%s%x1f%(trailers:only,unfold)%x1f%N%x1e"
        args = ["log", f"--notes={NOTES_REF}", "--grep=^Primefs-Kind:", f"--format={fmt}"]
        if limit:
            args.append(f"-n{limit}")
        out = []
        for rec in git(self.root, *args).stdout.split("\x1e"):
            if not rec.strip():
                continue
            sha, date, subject, trailers, note = rec.strip("\n").split("\x1f")
            t = _parse_trailers(trailers)
            if "Primefs-Kind" not in t:
                continue
            path = t.get("Primefs-Path", "")
            session = t.get("Primefs-Session", "-")
            outcome, _, outcome_note = note.strip().partition("\n")
            out.append({
                "sha": sha, "date": date, "subject": subject, "kind": t["Primefs-Kind"],
                "name": t.get("Primefs-Name"), "path": path or None,
                "scope": "session" if path.startswith("sessions/") else "global",
                "session": None if session == "-" else session, "source": t.get("Primefs-Source"),
                "evidence": [e.strip() for e in t.get("Primefs-Evidence", "").split(",") if e.strip()],
                "intent": t.get("Primefs-Intent"), "reverts": t.get("Primefs-Reverts"),
                "outcome": outcome or None, "outcome_note": outcome_note.strip() or None,
            })
        return out

    def revert(self, sha: str, *, source: str = "user", session: str | None = None,
               evidence=None, intent: str | None = None) -> str:
        """Undo one harness commit with a new commit (`git revert`); returns the new sha.

        Pending hand edits are committed first (so they are neither lost nor swept in). Refused, with the
        tree left as it was, for non-harness commits, staged changes, or conflicts with later changes."""
        full, subject, t = self._harness_commit(sha)
        kind, name = t["Primefs-Kind"], t.get("Primefs-Name", "?")
        trailers = _provenance(session, kind, name, t.get("Primefs-Path", ""), source, evidence, intent)
        self.commit_user_edits()
        with commit_lock(self.root):
            gitdir = self.root / git(self.root, "rev-parse", "--git-dir").stdout.strip()
            if any((gitdir / f).exists() for f in ("REVERT_HEAD", "CHERRY_PICK_HEAD", "MERGE_HEAD", "sequencer",
                                                     "rebase-merge", "rebase-apply")):
                raise PrimefsError("a git merge, revert or rebase is in progress in the workspace; finish it first")
            if git(self.root, "diff", "--cached", "--quiet", check=False).returncode != 0:
                raise PrimefsError("there are staged changes in the workspace (git diff --cached); "
                                   "commit or unstage them before reverting")
            r = git(self.root, "revert", "--no-edit", full, check=False)
            if r.returncode != 0:
                git(self.root, "revert", "--abort", check=False)  # back to HEAD, tree clean
                paths = re.findall(r"Merge conflict in (\S+)", r.stdout)
                other = [ln for ln in r.stdout.splitlines() if ln.startswith("CONFLICT")]
                why = (f"it conflicts with later changes to {', '.join(paths)}; edit the file instead" if paths else
                       f"it conflicts with later changes ({other[0]})" if other else
                       ((r.stderr or r.stdout).strip() or "git revert failed").splitlines()[0])
                raise PrimefsError(f"cannot revert {full[:10]} ({subject}): {why}")
            trailers.append(("Primefs-Reverts", full))
            what = subject.split("): ", 1)[-1]  # "add - ..." of "harness(kind/name): add - ..."
            message = (f"harness({kind}/{name}): revert {full[:10]} ({_summary(what, 50)})\n\n"
                       f"This reverts commit {full}.\n\n" + "".join(f"{k}: {v}\n" for k, v in trailers if v))
            # --only with no paths: change just the message, never pick up anything staged meanwhile
            git(self.root, "commit", "--amend", "--only", "-q", "--no-verify", "-F", "-", input=message)
            return git(self.root, "rev-parse", "HEAD").stdout.strip()

    def record_outcome(self, sha: str, outcome: str, note: str | None = None) -> None:
        """Record whether a change had its intended effect, as a git note (replaces an earlier one)."""
        if outcome not in OUTCOMES:
            raise PrimefsError(f"outcome must be good or bad, not {outcome!r}")
        full, _, _ = self._harness_commit(sha)
        text = outcome + (f"\n{note.strip()}" if note and note.strip() else "") + "\n"
        with commit_lock(self.root):
            git(self.root, "notes", f"--ref={NOTES_REF}", "add", "-f", "-F", "-", full, input=text)


# Module-level forms of the workspace-wide operations.
def commit_user_edits(ws: Workspace) -> list[str]:
    return Harness(ws).commit_user_edits()


def log(ws: Workspace, limit: int | None = None) -> list[dict]:
    return Harness(ws).log(limit)


def revert(ws: Workspace, sha: str, **kw) -> str:
    return Harness(ws).revert(sha, **kw)


def record_outcome(ws: Workspace, sha: str, outcome: str, note: str | None = None) -> None:
    Harness(ws).record_outcome(sha, outcome, note)


# -- helpers ------------------------------------------------------------------------------------------
def _one_line(value) -> str:
    return " ".join(str(value).split())  # trailer values must be one line


def _summary(text: str, width: int = 60) -> str:
    line = next((ln.strip("# ").strip() for ln in str(text).splitlines() if ln.strip()), "")
    return line if len(line) <= width else line[:width - 3].rstrip() + "..."


def _provenance(session, kind, name, path, source, evidence, intent) -> list[tuple[str, str]]:
    if source not in SOURCES:
        raise PrimefsError(f"source must be one of {', '.join(SOURCES)}, not {source!r}")
    if isinstance(evidence, str):
        evidence = [evidence]
    evidence = [_one_line(e) for e in evidence or () if _one_line(e)]
    intent = _one_line(intent) if intent else ""
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
    return out


def _parse_trailers(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip():
            out[key.strip()] = value.strip()
    return out


def _entry_of(rel: str) -> tuple[str, str, str] | None:
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


def _timestamp(value) -> float | None:
    if isinstance(value, datetime):
        return value.timestamp()
    try:
        return datetime.fromisoformat(str(value)).timestamp() if value else None
    except ValueError:
        return None


# -- the system prompt --------------------------------------------------------------------------------
def render_for_prompt(entries: list[Entry], memory_budget_chars: int = 4000) -> str:
    """The harness part of a system prompt: notes in full; memories in full, newest first, while they
    fit the budget (the rest counted, never cut short); skills and subagents as `name: description`."""
    ok = [e for e in entries if not e.problem]
    by = {k: [e for e in ok if e.kind == k] for k in KINDS}
    parts = []
    if by["note"]:
        parts.append("## Notes\n\n" + "\n\n".join(_block(e) for e in by["note"]))
    if by["memory"]:
        shown, left, used = [], 0, 0
        for e in sorted(by["memory"], key=lambda e: e.updated, reverse=True):
            block = _block(e)
            if used + len(block) <= memory_budget_chars:
                shown.append(block)
                used += len(block)
            else:
                left += 1  # whole memories or none: a cut memory can say the opposite of the file
        text = "## Memories\n\n" + "\n\n".join(shown)
        if left:
            text += (f"\n\n({left} more {'memory' if left == 1 else 'memories'} not shown, over the budget of "
                     f"{memory_budget_chars} characters; read them in harness/memory/ or sessions/<id>/harness/memory/.)")
        parts.append(text.replace("\n\n\n\n", "\n\n"))
    for kind, title in (("skill", "Skills"), ("agent", "Subagents")):
        if by[kind]:
            lines = [f"- {e.name}: {e.description or '(no description)'} ({e.path})" for e in by[kind]]
            parts.append(f"## {title}\n\n" + "\n".join(lines))
    problems = [e.problem for e in entries if e.problem]
    if problems:
        parts.append("## Harness files with problems (skipped)\n\n" + "\n".join(f"- {p}" for p in problems))
    return "\n\n".join(parts) + ("\n" if parts else "")


def _block(e: Entry) -> str:
    head = f"### {e.name} ({e.path})" + (f"\n{e.description}" if e.description else "")
    return f"{head}\n\n{e.body.strip()}" if e.body.strip() else head
