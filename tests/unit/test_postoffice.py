"""runner/postoffice.py on its own. Real: the workspace's files (Maildir mailboxes, history.jsonl), the
session tree, the bell, each reader's Agent (with no kernel host: nothing starts a kernel). Faked: the
runner's `on_mail` (a list of who got mail) and its log (a list)."""
from __future__ import annotations

import os
import threading

import pytest
from conftest import agent_of, new_session

from primefs.runner.bell import Bell
from primefs.runner.postoffice import PostOffice
from primefs.runner.tree import SessionTree
from primefs.store import mail


@pytest.fixture
def office(ws):
    """A post office as the runner wires it, with one session `a` and its reader."""
    tree, bell, log, told = SessionTree(ws.sessions), Bell(), [], []
    post = PostOffice(tree, bell, log.append, on_mail=told.append)
    a = new_session(ws, tree, "a")
    reader = agent_of(ws, tree, a, post=post, bell=bell)
    return post, tree, bell, log, told, a, reader


def files(folder):
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def test_delivered_mail_waits_in_new_tells_the_runner_and_wakes_waiters(office):
    post, _, bell, _, told, a, _ = office
    waiting, woke = threading.Event(), threading.Event()

    def waiter():
        with bell.cond:  # held until wait() releases it: the ring below cannot come before the wait
            waiting.set()
            post.wait(10)
        woke.set()

    threading.Thread(target=waiter, daemon=True).start()
    assert waiting.wait(5)
    msg = post.deliver(a.id, sender="user", kind="user", text="hello")
    assert woke.wait(5)  # long before the waiter's own 10 s
    assert files(a.mail / "new") == [msg.path.name] and files(a.mail / "tmp") == []
    assert told == [a.id] and post.has_new(a.id)
    assert mail.parse(msg.path).text == "hello"


def test_taken_mail_is_recorded_once_as_the_models_input_and_acknowledged(office):
    post, _, _, _, _, a, reader = office
    first = post.deliver(a.id, sender="user", kind="user", text="one")
    second = post.deliver(a.id, sender="b-session", kind="message", text="two")
    assert post.take_mail(reader) == 2
    events = a.events("message")
    assert [(e["id"], e["from"], e["kind"], e["text"]) for e in events] == [
        (first.id, "user", "user", "one"), (second.id, "b-session", "message", "two")]
    assert all("read_by" not in e for e in events)  # shown to the model, not handed to code
    assert files(a.mail / "new") == [] and all(n.endswith(mail.SEEN) for n in files(a.mail / "cur"))
    assert post.take_mail(reader) == 0 and not post.has_new(a.id)
    assert len(a.events("message")) == 2


def test_after_a_crash_claimed_mail_is_shown_unless_history_already_has_it(office, ws):
    post, tree, bell, _, _, a, reader = office
    shown = post.deliver(a.id, sender="user", kind="user", text="recorded before the crash")
    lost = post.deliver(a.id, sender="user", kind="user", text="claimed, never recorded")
    reader.record("message", id=shown.id, **{"from": "user"}, kind="user", text=shown.text)
    for m in (shown, lost):  # the runner died after claiming both, before acknowledging them
        mail.claim(m.path)
    fresh = agent_of(ws, tree, a, post=post, bell=bell)  # the next runner's reader, from history
    fresh.ensure_conversation()
    assert post.take_mail(fresh) == 1
    assert [e["text"] for e in a.events("message")] == ["recorded before the crash", "claimed, never recorded"]
    assert mail.unacked(a.mail) == []


def test_code_reads_mail_up_to_a_limit_and_a_void_cell_reads_none(office):
    post, _, _, _, _, a, reader = office
    for text in ("m1", "m2", "m3"):
        post.deliver(a.id, sender="user", kind="user", text=text)
    got = post.read_mail(reader, limit=2, cell=reader.cell_seq)
    assert [m.text for m in got] == ["m1", "m2"]
    assert [e["read_by"] for e in a.events("message")] == ["code", "code"]
    with pytest.raises(RuntimeError, match="void"):  # the cell that asked was interrupted meanwhile
        post.read_mail(reader, cell=reader.cell_seq - 1)
    assert len(mail.new_files(a.mail)) == 1  # m3 is still unread


@pytest.mark.parametrize("name, content, why", [
    ("yaml.md", "---\nkind: [unclosed\n---\nbody\n", "yaml.md"),
    ("kind.md", "---\nkind: gossip\n---\nbody\n", "unknown kind 'gossip'"),
    ("id.md", "---\nid: ../../escape\n---\nbody\n", "not a safe name"),
    ("folder", None, ""),
])
def test_bad_mail_goes_to_bad_with_its_reason_and_good_mail_still_arrives(office, name, content, why):
    post, _, _, log, _, a, reader = office
    path = a.mail / "new" / name
    if content is None:
        path.mkdir()  # a folder where a message should be
    else:
        path.write_text(content)
    post.deliver(a.id, sender="user", kind="user", text="good mail")
    assert post.take_mail(reader) == 1
    assert [e["text"] for e in a.events("message")] == ["good mail"]
    assert name in files(a.mail / "bad") and f"{name}.reason" in files(a.mail / "bad")
    assert why in (a.mail / "bad" / f"{name}.reason").read_text()
    [bad] = a.events("bad_mail")
    assert bad["file"].startswith(name) and why in bad["error"]
    assert len(log) == 1 and log[0].startswith(f"warning: {a.id}: bad message moved to mail/bad/")


def test_hand_written_mail_without_front_matter_is_user_mail(office):
    post, _, _, _, _, a, reader = office
    (a.mail / "new" / "note.md").write_text("please also count the blank lines\n")
    assert post.take_mail(reader) == 1
    [e] = a.events("message")
    assert (e["from"], e["kind"], e["text"]) == ("user", "user", "please also count the blank lines\n")


def test_bad_mail_that_cannot_be_moved_aside_is_skipped_from_then_on(office):
    post, _, _, log, _, a, reader = office
    (a.mail / "bad").write_text("a file where mail/bad/ should be")  # so quarantine fails
    (a.mail / "new" / "broken.md").write_text("---\nkind: gossip\n---\nx\n")
    assert post.take_mail(reader) == 0
    assert files(a.mail / "cur") == ["broken.md" + mail.CLAIMED]  # claimed, then left in place
    assert not post.has_new(a.id)
    assert post.take_mail(reader) == 0 and len(log) == 1  # not tried again: no hot loop, said once
    assert "left in place" in log[0] and len(a.events("bad_mail")) == 1


def broken_cur(post, a):
    """Mail waiting, then mail/cur/ replaced by a file (a person or a disk broke the mailbox)."""
    post.deliver(a.id, sender="user", kind="user", text="still arrives")
    os.rmdir(a.mail / "cur")
    (a.mail / "cur").write_text("not a folder")


def test_a_broken_mailbox_folder_is_mended_and_said_once(office):
    post, _, _, log, _, a, reader = office
    broken_cur(post, a)
    assert post.take_mail(reader) == 1 and (a.mail / "cur").is_dir()
    assert [e["text"] for e in a.events("message")] == ["still arrives"]
    assert log == [f"warning: {a.id}: mail/cur was not a folder: kept aside, the folder made again"]


def test_what_was_in_a_mailbox_folders_place_is_kept_in_mail_bad(office):
    post, _, _, _, _, a, reader = office
    broken_cur(post, a)
    post.take_mail(reader)
    assert (a.mail / "bad" / "cur").read_text() == "not a folder"


def test_a_childs_result_read_by_wait_is_no_reason_for_a_turn(office, ws):
    post, tree, _, _, told, parent, reader = office
    kid = new_session(ws, tree, "kid", parent=parent)
    post.deliver(parent.id, sender=kid.id, kind="result", text="42", extra={"child": kid.id})
    post.consume_results(reader, kid.id, cell=reader.cell_seq)
    [e] = parent.events("message")
    assert (e["from"], e["kind"], e["text"], e["read_by"]) == (kid.id, "result", "42", "wait")
    assert not post.has_new(parent.id) and post.take_mail(reader) == 0
    post.consume_results(reader, kid.id)  # nothing left of that child: nothing recorded twice
    assert len(parent.events("message")) == 1 and told == [parent.id]


def test_a_result_the_model_already_saw_is_not_recorded_again_by_wait(office, ws):
    post, tree, _, _, _, parent, reader = office
    kid = new_session(ws, tree, "kid", parent=parent)
    post.deliver(parent.id, sender=kid.id, kind="result", text="42", extra={"child": kid.id})
    assert post.take_mail(reader) == 1  # shown before the model's next call
    post.consume_results(reader, kid.id)
    assert [e.get("read_by") for e in parent.events("message")] == [None]


def test_addresses_resolve_through_the_tree(office, ws):
    post, tree, _, _, _, a, _ = office
    b = new_session(ws, tree, "b", parent=a)
    c = new_session(ws, tree, "c", parent=a)
    grandchild = new_session(ws, tree, "g", parent=b)
    other = new_session(ws, tree, "other")
    assert post.resolve(b.id, "parent") == [a.id]
    assert post.resolve(a.id, "children") == [b.id, c.id]
    assert sorted(post.resolve(b.id, "all")) == sorted([a.id, c.id, grandchild.id])  # its whole tree, not itself
    assert post.resolve(a.id, "c") == [c.id]  # a child's name
    assert post.resolve(a.id, other.id) == [other.id]  # any session by id
    for sender, to, said in ((a.id, "parent", "no parent"), (c.id, "children", "no children"),
                             (a.id, "nobody", "unknown recipient 'nobody'")):
        with pytest.raises(LookupError, match=said):
            post.resolve(sender, to)


def test_cur_is_listed_once_per_reader_and_a_claim_not_recorded_is_taken_again(office, monkeypatch):
    """mail/cur/ keeps every message a session ever took (months of them): a reader lists it once, for what
    a runner that died left claimed, not at every turn. A message it claimed and could not record is taken
    at the next turn all the same."""
    post, _, _, _, _, a, reader = office
    listed = []
    real = os.listdir
    monkeypatch.setattr(os, "listdir", lambda p=".": (listed.append(str(p)) if str(p).endswith("cur") else None) or real(p))
    for i in range(3):
        post.deliver(a.id, sender="user", kind="user", text=f"m{i}")
        assert post.take_mail(reader) == 1
    record, failed = reader.record, []

    def full_disk(type, **fields):
        if type == "message" and not failed:
            failed.append(fields["text"])
            raise OSError(28, "No space left on device")
        return record(type, **fields)

    monkeypatch.setattr(reader, "record", full_disk)
    post.deliver(a.id, sender="user", kind="user", text="m3")
    with pytest.raises(OSError):
        post.take_mail(reader)
    assert failed == ["m3"] and post.take_mail(reader) == 1
    assert [e["text"] for e in a.events("message")] == ["m0", "m1", "m2", "m3"]
    assert listed == [str(a.mail / "cur")] and mail.unacked(a.mail) == [] and reader.claimed == set()


def test_a_result_sent_again_with_its_id_is_shown_once(office):
    """A runner that ends a turn another runner's stop cut off (turns.py) sends the turn's result mail again,
    with the same id (`result-<child>-<turn>`): the parent shows it once, whether both arrive together or
    the second after the first was recorded."""
    post, _, _, _, _, a, reader = office
    for _ in range(2):
        post.deliver(a.id, sender="kid", kind="result", text="42", msg_id="result-kid-1")
    assert post.take_mail(reader) == 1
    post.deliver(a.id, sender="kid", kind="result", text="42", msg_id="result-kid-1")
    assert post.take_mail(reader) == 0
    assert [e["id"] for e in a.events("message")] == ["result-kid-1"]
    assert files(a.mail / "new") == [] and files(a.mail / "tmp") == []
