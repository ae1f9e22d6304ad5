"""The continual harness: notes, memories, skills and subagent specs as files, each change one git commit.

Global entries live in `harness/`, session-local ones in `sessions/<id>/harness/` (same layout). Every
change is one commit touching only that entry, with `Primefs-*` trailers saying who, what and why;
`log` reads them back, `revert` undoes one change with a new commit, `record_outcome` adds a git note.
"""
from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from ruamel.yaml.comments import CommentedMap

from primefs.errors import PrimefsError
from primefs.harness.commits import DIRS, KINDS, SKILL_FILE, HarnessGit, provenance, summary
from primefs.store import frontmatter, redact
from primefs.store.fsutil import check_name, write_atomic
from primefs.store.gitops import commit_lock
from primefs.store.session import Session, iso, with_harness
from primefs.store.workspace import Workspace

ENTRY_NAME_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")


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
    if not isinstance(name, str) or len(name) > 64 or not ENTRY_NAME_RE.fullmatch(name):
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
        self.git = HarnessGit(ws.root)

    def check_unlocked(self, kind: str, name: str, source: str) -> None:
        """A person's `harness: {locked: [...]}` in primefs.yaml: only a person edits those entries."""
        if source == "user":
            return
        for pattern in (self.ws.config.get("harness") or {}).get("locked") or []:
            if fnmatch.fnmatchcase(f"{kind}/{name}", pattern):
                raise PrimefsError(f"{kind}/{name} is locked (primefs.yaml harness.locked: {pattern}): only a person "
                                   "may edit it")

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
        if not ENTRY_NAME_RE.fullmatch(name) or len(name) > 64:
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
            meta, body = frontmatter.read(md, label, root=self.root)  # a link out of the workspace is refused
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

    def list(self, kind: str | None = None, sessions=(), all_sessions: bool = False,
             holders: list[str] | None = None) -> list[Entry]:
        """Entries visible from `sessions` (nearest shadows farther and global, by kind and name).
        Broken files come back as entries with `problem` set (they still shadow); never raises for them.
        `all_sessions`: every global and every session-local entry, nothing shadowed (for listings); the
        sessions with a harness folder are `holders` when known (Index.harness_sessions), else looked for."""
        kinds = [check_kind(kind)] if kind else list(KINDS)
        if all_sessions:
            sessions = with_harness(self.ws.sessions) if holders is None else holders
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
            gate: str | None = None, **fields) -> str | None:
        """Create or update one entry and commit it; returns the commit sha, or None when the content
        (front matter apart from `primefs:`, body, a skill's files) is as it was: nothing is written.

        On update the existing front matter is edited in place (unknown keys and comments kept); `body`
        None keeps the old body. `fields` are extra front matter keys (`allowed_tools` -> `allowed-tools`;
        None removes a key). `files` (skills only): {"mod.py": code, "old.py": None to delete}."""
        check_kind(kind)
        check_entry_name(name)
        body, description, fields, files = _checked_change(kind, body, description, fields, files)
        self.check_unlocked(kind, name, source)
        path = self._path(self._base(scope, session), kind, name)
        trailers = provenance(session, kind, name, self._rel(path), source, evidence, intent, gate)
        md = path / SKILL_FILE if kind == "skill" else path
        with commit_lock(self.root):
            self.git.commit_hand_edits([self._rel(path)])
            existing = md.exists()
            if existing:
                meta, old_body = frontmatter.read(md, self._rel(md), root=self.root)  # broken: raise, never overwrite
                before = _content(meta, old_body)
            elif body is None:
                raise PrimefsError(f"{kind} {name!r} does not exist yet; give its body")
            else:
                meta, old_body = CommentedMap(), ""
                if kind in ("skill", "agent") and not description:
                    raise PrimefsError(f"a new {kind} needs a description: it is all the model sees of it")
            persons = source == "agent" and _by_person(path, md, meta if existing else None)  # (before it changes)
            _set_front_matter(meta, name, description, fields)
            text = body if body is not None else old_body
            if existing and _content(meta, text) == before and _same_files(path, files):
                return None  # only the timestamp and provenance would change: not worth a commit
            if persons:
                raise _persons_error(kind, name)
            _stamp(meta, source, session)
            _write_entry(md, path, meta, text, files)
            line = summary(description or meta.get("description") or text)
            subject = f"harness({kind}/{name}): {'update' if existing else 'add'}" + (f" - {line}" if line else "")
            return self.git.commit([self._rel(path)], subject, trailers)

    def delete(self, kind: str, name: str, *, scope: str = "global", session: str | None = None,
               source: str = "agent", evidence=None, intent: str | None = None, gate: str | None = None) -> str | None:
        """Remove one entry (a skill's whole folder) and commit that; returns the commit sha."""
        check_kind(kind)
        check_entry_name(name)
        self.check_unlocked(kind, name, source)
        path = self._path(self._base(scope, session), kind, name)
        trailers = provenance(session, kind, name, self._rel(path), source, evidence, intent, gate)
        with commit_lock(self.root):
            if not path.exists():
                raise PrimefsError(f"no {scope} {kind} {name!r} (looked for {self._rel(path)})")
            self.git.commit_hand_edits([self._rel(path)])
            md = path / SKILL_FILE if kind == "skill" else path
            if source == "agent" and _by_person(path, md, frontmatter.read(md, self._rel(md), root=self.root)[0]
                                                if md.is_file() and not md.is_symlink() else None):
                raise _persons_error(kind, name)
            shutil.rmtree(path) if path.is_dir() else path.unlink()
            return self.git.commit([self._rel(path)], f"harness({kind}/{name}): delete", trailers)

    # -- history (harnessgit.py) ------------------------------------------------------------------
    def commit_user_edits(self) -> list[str]:
        return self.git.commit_user_edits()

    def log(self, limit: int | None = None) -> list[dict]:
        return self.git.log(limit)

    def revert(self, sha: str, **kw) -> str:
        return self.git.revert(sha, **kw)

    def record_outcome(self, sha: str, outcome: str, note: str | None = None) -> None:
        self.git.record_outcome(sha, outcome, note)


def _by_person(path: Path, md: Path, meta) -> bool:
    """Whether a person wrote this entry (`harness put`, or by hand: no `primefs:` stamp in `meta`, its front
    matter). A kernel (source "agent") may add entries and change its own and other agents', never a
    person's: a skill a person made, replaced by a kernel, ran that kernel's code in every session importing
    it, as that session (found by an attack)."""
    if not os.path.lexists(path):
        return False
    stamp = None if meta is None or md.is_symlink() else meta.get("primefs")
    return not isinstance(stamp, dict) or stamp.get("source") == "user"


def _persons_error(kind: str, name: str) -> PrimefsError:
    return PrimefsError(f"{kind}/{name} was written by a person: an agent may not change or delete it (add one "
                        "under another name, or ask the person)")


# Module-level forms of the workspace-wide operations.
def commit_user_edits(ws: Workspace) -> list[str]:
    return HarnessGit(ws.root).commit_user_edits()


def log(ws: Workspace, limit: int | None = None) -> list[dict]:
    return HarnessGit(ws.root).log(limit)


def revert(ws: Workspace, sha: str, **kw) -> str:
    return HarnessGit(ws.root).revert(sha, **kw)


def record_outcome(ws: Workspace, sha: str, outcome: str, note: str | None = None) -> None:
    HarnessGit(ws.root).record_outcome(sha, outcome, note)


# -- helpers ------------------------------------------------------------------------------------------
def _checked_change(kind: str, body, description, fields: dict, files):
    """What `put` was given, redacted, once it is a change `put` may make (else PrimefsError)."""
    # a harness entry is committed and shown to every later session: known secrets never go in
    body, description = (redact.text(body) if body is not None else None), \
        (redact.text(description) if description is not None else None)
    fields = redact.value(fields)
    files = {k: (redact.text(v) if isinstance(v, str) else v) for k, v in files.items()} if files else files
    if files and kind != "skill":
        raise PrimefsError("files=... is only for skills (their Python modules)")
    for fname in files or {}:
        if check_name(fname, "skill file name") == SKILL_FILE:
            raise PrimefsError(f"{SKILL_FILE} is written from body/description, not files=...")
    for key in fields:
        if key in ("name", "primefs"):
            raise PrimefsError(f"{key!r} is set by primefs; not a field you can pass")
    return body, description, fields, files


def _set_front_matter(meta, name: str, description: str | None, fields: dict) -> None:
    """Edit the front matter in place: name, description, and `fields` (`a_b` -> `a-b`; None removes a key)."""
    meta["name"] = name
    if description is not None:
        meta["description"] = description
    for key, value in fields.items():
        key = key.replace("_", "-")
        if value is None:
            meta.pop(key, None)
        else:
            meta[key] = value


def _stamp(meta, source: str, session: str | None) -> None:
    """The `primefs:` block: when the entry was made and changed, by whom."""
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


def _write_entry(md: Path, path: Path, meta, text: str, files: dict | None) -> None:
    """The entry's .md file (a skill's SKILL.md), and a skill's `files` (code, or None to delete)."""
    md.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(md, frontmatter.dump(meta, text if text.endswith("\n") else text + "\n"))
    for fname, code in (files or {}).items():
        if code is None:
            (path / fname).unlink(missing_ok=True)
        else:
            write_atomic(path / fname, code)


def _content(meta, body: str) -> str:
    """What an entry says, without its `primefs:` block (timestamps, who wrote it last)."""
    data = {k: v for k, v in meta.items() if k != "primefs"}
    return json.dumps([data, body if body.endswith("\n") else body + "\n"], default=str)


def _same_files(folder: Path, files: dict | None) -> bool:
    """Would writing a skill's `files` (code, or None to delete) leave them as they are?"""
    for fname, code in (files or {}).items():
        p = folder / fname
        if (code is None and p.exists()) or (code is not None and (not p.is_file() or p.read_text(encoding="utf-8") != code)):
            return False
    return True


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
