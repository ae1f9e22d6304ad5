"""The post office: delivers mail between sessions, claims it for its reader, resolves names.

Mailboxes are Maildir folders (mail.py); this part adds who may read what, and when. A reader is a
session's Agent: its `mail_lock` makes it the only reader of its box, its `seen_ids` make sure no
message is shown twice (also after a crash), its `cell_seq` voids requests of an ended cell, its `claimed`
spares a listing of cur/ (every message the session ever took) at each turn.

An id comes again only after a crash: a runner killed between showing a message and filing it in cur/,
or a cut-off turn's result sent again at the next start. Either is among the last things the session
took, so `seen_ids` holds the ids of its conversation since its last compaction, not of its whole life.
"""
from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path
from typing import Callable

from primefs.errors import PrimefsError
from primefs.runner.bell import Bell
from primefs.runner.tree import SessionTree
from primefs.store import mail


class PostOffice:
    def __init__(self, tree: SessionTree, bell: Bell, log, on_mail: Callable[[str], None] = lambda sid: None):
        self.tree, self.bell, self.log = tree, bell, log
        self.on_mail = on_mail  # new mail for a session: the scheduler may queue a turn
        self._results: dict[str, dict[str, list[mail.Message]]] = {}  # parent -> child -> result mail sent
        self._results_lock = threading.Lock()  # held from a result's file to its entry: no reader comes between
        self._stuck: set[Path] = set()  # bad mail that could not even be moved aside: skipped, said once
        self._held: dict[str, set[Path]] = {}  # sid -> its unread mail when it failed before taking it

    def deliver(self, sid: str, *, sender: str, kind: str, text: str, extra: dict | None = None,
                msg_id: str | None = None) -> mail.Message:
        child = extra.get("child") if kind == "result" and extra else None
        # a child's result: noted under the lock it is written in (its parent may take the file at once)
        with self._results_lock if child else contextlib.nullcontext():
            msg = mail.deliver(self.tree.session(sid).mail, sender=sender, to=sid, kind=kind, text=text, extra=extra,
                               msg_id=msg_id)
            if child:
                self._results.setdefault(sid, {}).setdefault(child, []).append(msg)
        self.on_mail(sid)
        self.bell.ring()  # also wakes recv() waiting in that session
        return msg

    def has_new(self, sid: str) -> bool:
        """Unread mail that can be read (bad mail that could not be moved aside does not count, nor mail held
        back: see hold_back)."""
        held = self._held.get(sid, ())
        return any(p not in self._stuck and p not in held for p in mail.new_files(self.tree.session(sid).mail))

    def hold_back(self, sid: str, before: float) -> None:
        """The session failed before it took its unread mail (a file of its own unusable, e.g. a folder where its
        history belongs): the mail written `before` then starts no more turns, or a runner would fail it again and
        again (a core, for ever). It stays in new/; new mail, or a later runner, tries again, and takes it."""
        held = set()
        try:
            for path in mail.new_files(self.tree.session(sid).mail):
                try:
                    if os.lstat(path).st_mtime < before:
                        held.add(path)
                except OSError:
                    pass
        except (OSError, PrimefsError):
            return
        self._held[sid] = held

    # -- reading ----------------------------------------------------------------------------------
    def _claim_all(self, agent, limit: int | None = None) -> list[tuple[mail.Message, Path]]:
        """Claim the session's unread mail (new, and claimed-but-unacknowledged after a crash).

        Bad files go to mail/bad/. A message already in history is only acknowledged again: a
        message never starts two turns.
        """
        s = agent.session
        self._held.pop(s.id, None)
        out = []
        try:
            for name in mail.mend(s.mail):
                self.log(f"warning: {s.id}: {name} was not a folder: kept aside, the folder made again")
        except OSError as exc:
            self.log(f"warning: {s.id}: its mailbox cannot be mended: {exc}")
        # cur/ keeps every message the session ever took: it is listed once (what a runner that died left
        # claimed), then this runner knows what it claimed itself and has not acknowledged
        held = agent.claimed
        if held is None:
            held = agent.claimed = set(mail.unacked(s.mail))
        for path in sorted(held) + mail.new_files(s.mail):
            if limit is not None and len(out) >= limit:
                break
            if path in self._stuck:
                continue
            if path in held and not os.path.lexists(path):  # taken away by hand
                held.discard(path)
                continue
            try:
                claimed = path if path in held else mail.claim(path)
            except OSError as exc:  # e.g. a folder in new/ that cannot be moved
                self._set_aside(agent, path, f"cannot be claimed: {exc}")
                continue
            if claimed is None:
                continue
            held.add(claimed)
            try:
                msg = mail.parse(claimed, to=s.id, root=self.tree.dir.parent)
            except mail.BadMessage as exc:
                held.discard(claimed)
                self._set_aside(agent, claimed, str(exc))
                continue
            if msg.kind == "result":
                self._taken(s.id, msg)
            if msg.id in agent.seen_ids or any(m.id == msg.id for m, _ in out):  # (a result mail sent again)
                self._ack(agent, claimed)
                continue
            out.append((msg, claimed))
        return out

    def _taken(self, sid: str, msg: mail.Message) -> None:
        """A child's result mail taken as mail: wait() no longer needs to know of it (kept, a parent that reads
        its children's results as mail made this grow for the runner's life)."""
        with self._results_lock:
            sent = self._results.get(sid)
            if sent is None or msg.sender not in sent:
                return
            sent[msg.sender] = [m for m in sent[msg.sender] if m.id != msg.id]
            if not sent[msg.sender]:
                del sent[msg.sender]
            if not sent:
                del self._results[sid]

    @staticmethod
    def _ack(agent, claimed: Path) -> None:
        mail.ack(claimed)
        if agent.claimed is not None:
            agent.claimed.discard(claimed)

    def _set_aside(self, agent, path: Path, reason: str) -> None:
        """Bad mail goes to mail/bad/ with its reason, once; if even that fails it is skipped from now on."""
        try:
            mail.quarantine(path, reason)
            where = "moved to mail/bad/"
        except Exception as exc:  # noqa: BLE001 - whatever it is, it is not tried again (no hot loop)
            self._stuck.add(path)
            where = f"left in place (could not be moved: {getattr(exc, 'strerror', None) or exc})"
        agent.record("bad_mail", file=path.name, error=reason)
        self.log(f"warning: {agent.session.id}: bad message {where}: {reason}")

    def _record(self, agent, msg: mail.Message, claimed: Path, read_by: str | None) -> None:
        fields = {"read_by": read_by} if read_by else {}
        agent.record("message", id=msg.id, **{"from": msg.sender}, kind=msg.kind, text=msg.text, **fields)
        self._ack(agent, claimed)

    def take_mail(self, agent) -> int:
        """Show the session's unread mail to the model (as user messages). Returns how many."""
        with agent.mail_lock:
            got = self._claim_all(agent)
            for msg, claimed in got:
                self._record(agent, msg, claimed, None)
        return len(got)

    def read_mail(self, agent, limit: int | None = None, cell: int | None = None) -> list[mail.Message]:
        """inbox()/recv(): unread messages handed to code; recorded, not shown as prompts."""
        with agent.mail_lock:
            check_cell(agent, cell)
            got = self._claim_all(agent, limit=limit)
            for msg, claimed in got:
                self._record(agent, msg, claimed, "code")
        return [m for m, _ in got]

    def consume_results(self, agent, child: str, cell: int | None = None) -> None:
        """wait() returned a child's result: its `kind: result` mail is read, not a reason for a new turn.

        The post office knows which files it delivered, so no mailbox scan is needed; mail already
        claimed (shown to the model before its next call) is left alone."""
        with agent.mail_lock:
            check_cell(agent, cell)
            with self._results_lock:
                sent = self._results.get(agent.session.id, {}).pop(child, [])
                if not self._results.get(agent.session.id, True):
                    del self._results[agent.session.id]
            for msg in sent:
                claimed = mail.claim(msg.path)
                if claimed is not None and agent.claimed is not None:
                    agent.claimed.add(claimed)
                if claimed is not None and msg.id not in agent.seen_ids:
                    self._record(agent, msg, claimed, "wait")

    def wait(self, timeout: float) -> None:
        """Until something is delivered (or anything else rings), at most `timeout` seconds."""
        with self.bell.cond:
            if not self.bell.stopping:
                self.bell.cond.wait(timeout)

    # -- addresses --------------------------------------------------------------------------------
    def resolve(self, sender: str, to: str) -> list[str]:
        """'parent', 'children', 'all' (the sender's whole tree), a child's name or a session id."""
        tree = self.tree
        if to == "parent":
            parent = tree.parent(sender)
            if not parent:
                raise LookupError("this session has no parent")
            return [parent]
        if to == "children":
            kids = tree.children(sender)
            if not kids:
                raise LookupError("this session has no children")
            return kids
        if to == "all":
            return [x for x in tree.subtree(tree.root(sender)) if x != sender]
        named = tree.child_named(sender, to)
        if named:
            return [named]
        if tree.knows(to):
            return [to]
        raise LookupError(f"unknown recipient {to!r}: use a session id, a child's name, "
                          "'parent', 'children' or 'all'")


def check_cell(agent, cell: int | None) -> None:
    if cell is not None and agent.cell_seq != cell:
        raise RuntimeError("the cell that asked has ended (interrupted); this request is void")
