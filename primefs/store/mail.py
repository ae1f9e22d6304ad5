"""Maildir-style mailboxes: sessions/<id>/mail/{tmp,new,cur,bad}/.

Delivery writes in tmp/, fsyncs and renames into new/ (readers never see half a message).
A reader claims a message by renaming it into cur/ as `<name>!2,` (only one rename wins), and
acknowledges it once the turn that read it has recorded it, as `<name>!2,S`. A claimed but
unacknowledged message is therefore visible after a crash. ':' is avoided in names (Windows).
"""
from __future__ import annotations

import os
import secrets
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from primefs.errors import PrimefsError
from primefs.store import frontmatter, redact
from primefs.store.fsutil import NAME_RE, fsync_dir, ring
from primefs.store.session import iso

CLAIMED, SEEN = "!2,", "!2,S"
KINDS = ("message", "result", "user", "heartbeat", "system")


class BadMessage(PrimefsError):
    pass


@dataclass
class Message:
    id: str
    sender: str
    to: str
    kind: str
    text: str
    created: str
    path: Path | None = None

    def as_dict(self) -> dict:
        return {"id": self.id, "from": self.sender, "to": self.to, "kind": self.kind,
                "text": self.text, "created": self.created}


def new_message_id() -> str:
    return f"{time.time_ns()}.{secrets.token_hex(4)}"


def mend(mail_dir: Path) -> list[str]:
    """The mailbox's folders made whole (a person or a disk can break them): a missing one is made, and
    anything else in a folder's place (a file, a link) is kept in bad/ with a reason, never deleted.
    Returns what was kept aside ("mail/cur")."""
    aside = []
    for path in (mail_dir, *(mail_dir / sub for sub in ("tmp", "new", "cur"))):
        try:  # one lstat a folder: this runs at each delivery and each look at the mail
            if stat.S_ISDIR(os.lstat(path).st_mode):
                continue
            if path == mail_dir:
                os.rename(path, path.with_name(f"mail.not-a-folder.{secrets.token_hex(3)}"))
            else:
                quarantine(path, f"mail/{path.name} was not a folder: kept here, the folder made again",
                           mail_dir / "bad")
            aside.append("mail" if path == mail_dir else f"mail/{path.name}")
        except FileNotFoundError:
            pass
        path.mkdir(exist_ok=True)
    return aside


def deliver(mail_dir: Path, *, sender: str, to: str, kind: str, text: str, extra: dict | None = None,
            msg_id: str | None = None) -> Message:
    """`msg_id`: the same message delivered twice has one id (a turn's result mail, sent again by a runner
    that ends a turn another runner's stop cut off): its reader shows it once."""
    mend(mail_dir)
    text = redact.text(text)  # known secrets never reach a file
    msg = Message(id=msg_id or new_message_id(), sender=sender, to=to, kind=kind, text=text, created=iso())
    meta = {"id": msg.id, "from": sender, "to": to, "kind": kind, "created": msg.created, **redact.value(extra or {})}
    tmp = mail_dir / "tmp" / f"{msg.id}.{secrets.token_hex(3)}.md" if msg_id else mail_dir / "tmp" / f"{msg.id}.md"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(frontmatter.dump(meta, text, safe=True))
        f.flush()
        os.fsync(f.fileno())
    target = mail_dir / "new" / tmp.name
    os.rename(tmp, target)
    fsync_dir(target.parent)
    ring(mail_dir.parent)
    msg.path = target
    return msg


def new_files(mail_dir: Path) -> list[Path]:
    try:
        return sorted(p for p in (mail_dir / "new").iterdir() if not p.name.startswith("."))
    except (FileNotFoundError, NotADirectoryError):
        return []


def base_name(path: Path) -> str:
    name = path.name
    return name.split("!2,")[0]


def _free(folder: Path, base: str, suffix: str) -> Path:
    """folder/<base><suffix>, or another name if that one is taken: a name used again never replaces
    the message that had it."""
    target = folder / (base + suffix)
    return target if not os.path.lexists(target) else folder / f"{base}.{secrets.token_hex(3)}{suffix}"


def claim(path: Path) -> Path | None:
    """Move new/<name> to cur/<name>!2, ; None if someone else claimed it first."""
    target = _free(path.parent.parent / "cur", base_name(path), CLAIMED)
    try:
        os.rename(path, target)
    except FileNotFoundError:
        return None
    return target


def ack(path: Path) -> Path:
    if path.name.endswith(SEEN):
        return path
    target = _free(path.parent, base_name(path), SEEN)
    try:
        os.rename(path, target)
    except FileNotFoundError:
        pass
    return target


def unacked(mail_dir: Path) -> list[Path]:
    """Claimed, not acknowledged, in name order. (cur/ keeps every message ever taken: its names are looked
    at as plain strings, a path made only for the few claimed ones.)"""
    cur = mail_dir / "cur"
    try:
        names = os.listdir(cur)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [cur / name for name in sorted(n for n in names if n.endswith(CLAIMED))]


MAX_BYTES = 10_000_000  # a message is text for a model or for code; bigger data goes in files


def parse(path: Path, to: str = "", root: Path | None = None) -> Message:
    """A message file -> Message. Hand-written files without front matter count as user mail.
    Anything wrong with the file (a folder, a link out of `root`, too big, bad YAML) is BadMessage."""
    try:
        return _parse(path, to, root)
    except BadMessage:
        raise
    except PrimefsError as exc:
        raise BadMessage(str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - bad mail of any kind is moved aside, never a crash
        raise BadMessage(f"{path.name}: {type(exc).__name__}: {exc}") from None


def _parse(path: Path, to: str, root: Path | None) -> Message:
    meta, body = frontmatter.read(path, path.name, safe=True, max_bytes=MAX_BYTES, root=root)
    mid = meta.get("id")
    if mid in (None, ""):  # written by hand: its name and the file itself (a name used again is a new message)
        st = os.stat(path)
        mid = f"{base_name(path).removesuffix('.md')[:96]}.{st.st_ino:x}.{st.st_mtime_ns:x}"
    mid = str(mid)
    if not NAME_RE.fullmatch(mid) or ".." in mid:
        raise BadMessage(f"{path.name}: message id {mid!r} is not a safe name")
    kind = str(meta.get("kind") or "user")
    if kind not in KINDS:
        raise BadMessage(f"{path.name}: unknown kind {kind!r} (one of {', '.join(KINDS)})")
    return Message(id=mid, sender=str(meta.get("from") or "user"), to=str(meta.get("to") or to), kind=kind,
                   text=body, created=str(meta.get("created") or iso(path.stat().st_mtime)), path=path)


def quarantine(path: Path, reason: str, bad: Path | None = None) -> Path:
    """Move a bad message (mail/new/x, mail/cur/x; or what is in a folder's place, with `bad` given) to
    mail/bad/ with a .reason file beside it: never lost, never retried. Raises OSError if it cannot be
    moved (the caller then leaves it alone)."""
    bad = bad or path.parent.parent / "bad"
    bad.mkdir(exist_ok=True)
    name = base_name(path)
    if len(os.fsencode(name)) > 200:  # room for the .reason beside it (names end at 255 bytes)
        name = os.fsdecode(os.fsencode(name)[:200])
    target = bad / name
    if os.path.lexists(target):  # a second bad file of that name: keep both
        target = bad / f"{name}.{secrets.token_hex(3)}"
    os.rename(path, target)
    # a name that is no UTF-8 (bytes from a disk or a hand) is shown escaped in its reason, never fatal
    (bad / (target.name + ".reason")).write_text(reason + "\n", encoding="utf-8", errors="backslashreplace")
    return target


def what_waits(folder, stopped: bool = False) -> str | None:
    """What in a session's own files may still start a turn: "unread mail" (new, or claimed and never
    acknowledged: a runner died between) or "heartbeats" (a heartbeats/*.yaml file), else None. Mail to
    a stopped session never starts one (stopping is final). The one answer, for the runner (which
    sessions it looks at) and the archive (which trees it may take). Plain strings and listings: it
    runs for every finished session at a runner's start."""
    base = f"{folder}/"
    try:
        if not stopped and any(not name.startswith(".") for name in os.listdir(base + "mail/new")):
            return "unread mail"
        if not stopped and any(name.endswith(CLAIMED) for name in os.listdir(base + "mail/cur")):
            return "unread mail"
    except OSError:
        pass
    try:
        return "heartbeats" if any(name.endswith(".yaml") for name in os.listdir(base + "heartbeats")) else None
    except OSError:
        return None
