"""What long use and hand edits do to mail, trees and heartbeats: a mail name
used again, mail no one can print, a cycle of parents, a tree stopped without a runner, a heartbeat that
never fires. Real runners, real files, the CLI as a user runs it."""
from __future__ import annotations

import os

from conftest import cli, configure, run_once, session_named

from primefs.store.goals import write_goal
from primefs.store.session import list_sessions


def scripted(ws, rules: str):
    (ws.root / "s.yaml").write_text(rules)
    return configure(ws, model="scripted/s.yaml")


def hand_mail(s, name: str | bytes, text: str):
    """As the docs say: write in tmp/, rename into new/."""
    new, tmp = os.fsencode(s.dir / "mail" / "new"), os.fsencode(s.dir / "mail" / "tmp")
    name = os.fsencode(name)
    with open(os.path.join(tmp, name), "w") as f:
        f.write(text)
    os.rename(os.path.join(tmp, name), os.path.join(new, name))


def test_a_mail_name_used_again_is_a_new_message(ws):
    ws = scripted(ws, "default:\n  - text: ok\n")
    write_goal(ws, "Hello", name="one")
    run_once(ws)
    s = session_named(ws, "one")
    hand_mail(s, "note.md", "first note")
    run_once(ws)
    hand_mail(s, "note.md", "second note")
    run_once(ws)
    texts = [e["text"] for e in s.events("message")]
    assert texts == ["first note", "second note"]
    cur = sorted(os.listdir(s.dir / "mail" / "cur"))
    assert len(cur) == 2 and all(n.startswith("note.md") and n.endswith("!2,S") for n in cur), cur
    assert len(s.events("turn_start")) == 3


def test_mail_no_one_can_print_goes_to_bad_and_later_mail_is_read(ws):
    ws = scripted(ws, "default:\n  - text: ok\n")
    write_goal(ws, "Hello", name="one")
    run_once(ws)
    s = session_named(ws, "one")
    hand_mail(s, "a-surrogate.md", '---\nfrom: "\\ud800"\nkind: message\n---\nhi\n')  # a legal YAML escape
    hand_mail(s, b"b-\xff-not-utf8.md", "bytes in the name\n")
    run_once(ws)
    hand_mail(s, "c-later.md", "later mail")
    lines = run_once(ws)
    s = session_named(ws, "one")
    assert [e["text"] for e in s.events("message")] == ["later mail"]
    assert s.status == "idle" and not s.events("error"), (s.status, s.events("error"))
    bad = sorted(os.listdir(os.fsencode(s.dir / "mail" / "bad")))
    assert len(bad) == 4 and sum(n.endswith(b".reason") for n in bad) == 2, bad
    reasons = [(s.dir / "mail" / "bad" / os.fsdecode(n)).read_text() for n in bad if n.endswith(b".reason")]
    assert any("lone surrogate" in r for r in reasons) and any("not a safe name" in r for r in reasons), reasons
    assert len(s.events("bad_mail")) == 2
    assert not any("error" in line for line in lines), lines


def test_cycles_of_parents_are_broken_sessions_not_hangs(ws):
    ws = scripted(ws, "rules:\n  - match: '^Top'\n    replies:\n      - code: \"rlm('Sub').wait()\"\n"
                      "      - text: top done\ndefault:\n  - text: ok\n")
    write_goal(ws, "Top", name="top")
    write_goal(ws, "Alone", name="alone")
    run_once(ws)
    top, alone = session_named(ws, "top"), session_named(ws, "alone")
    sub = next(s for s in list_sessions(ws.sessions) if s.meta.get("parent") == top.id)

    def set_parent(s, parent):
        path = s.dir / "session.yaml"
        path.write_text(path.read_text().replace("parent: null", f"parent: {parent}")
                        .replace(f"parent: {top.id}", f"parent: {parent}"))

    set_parent(alone, alone.id)  # its own parent
    set_parent(top, sub.id)  # top and sub: each other's parent
    for args in (["usage", alone.id], ["usage", top.id, "--tree"], ["status"], ["status", "--json"], ["logs", "-n", "5"]):
        r = cli(ws, *args, timeout=30)
        assert r.returncode in (0, 1) and "Traceback" not in r.stderr, (args, r.stderr)
    r = cli(ws, "status")
    assert r.stdout.count("cycle of parents") + r.stderr.count("cycle of parents") >= 3, r.stdout + r.stderr
    for s in (alone, sub):
        hand_mail(s, "more.md", "more")
    r = cli(ws, "run", "--once", timeout=60)  # before: result mail went round top <-> sub for ever
    assert r.returncode == 0 and r.stderr.count("cycle of parents") == 3, r.stderr
    set_parent(alone, "null")  # mended by hand: a session again
    path = alone.dir / "session.yaml"
    path.write_text(path.read_text().replace(f"parent: {alone.id}", "parent: null"))
    r = cli(ws, "run", "--once", timeout=60)
    assert "more" in [e["text"] for e in alone.events("message")], r.stderr


def test_a_tree_stopped_without_a_runner_can_be_archived(ws):
    ws = scripted(ws, "rules:\n  - match: '^Top'\n    replies:\n      - code: \"h = rlm('Sub')\"\n"
                      "      - text: waiting\n  - match: '^Sub'\n    replies:\n      - code: \"import time\"\n"
                      "      - text: sub done\n")
    write_goal(ws, "Top", name="top")
    run_once(ws)
    top = session_named(ws, "top")
    r = cli(ws, "stop", "top", "--tree")
    assert r.returncode == 0, r.stderr
    r = cli(ws, "archive", "--status", "stopped,idle,done")
    assert r.returncode == 0 and "archived 1 tree(s)" in r.stdout, r.stdout + r.stderr
    assert not top.dir.exists()
    r = cli(ws, "log", "top")  # still there for reading, mail and all
    assert r.returncode == 0 and "stopped" in r.stdout, r.stdout


def test_a_heartbeat_that_never_fires_is_refused_once(ws):
    ws = scripted(ws, "default:\n  - text: ok\n")
    write_goal(ws, "Beat", name="beat", extra={"heartbeat": {"cron": "0 0 31 2 *"}})
    r = cli(ws, "run", "--once", timeout=60)
    assert "goals/beat.md: heartbeat schedule '0 0 31 2 *' never fires" in r.stderr, r.stderr
    assert r.returncode == 3 and "Traceback" not in r.stderr, r.stderr  # 3: a goal was rejected
    (ws.root / "goals" / "beat.md").unlink()
    write_goal(ws, "Hello", name="one")
    run_once(ws)
    s = session_named(ws, "one")
    (s.dir / "heartbeats").mkdir()
    (s.dir / "heartbeats" / "hb-abc123.yaml").write_text(  # by hand, due long ago
        "id: hb-abc123\nschedule: 0 0 31 2 *\nprompt: wake\npaused: false\nnext_due: 1000\nlast_fired: null\n")
    r = cli(ws, "run", "--once", timeout=60)
    assert r.returncode == 0 and r.stderr.count("never fires") == 1, r.stderr  # said once, not 4 times a second
    assert "heartbeats/hb-abc123.yaml: heartbeat schedule" in r.stderr, r.stderr
    r = cli(ws, "heartbeat", "list", "one")
    assert "never fires" in r.stdout + r.stderr, r.stdout + r.stderr


def test_a_runner_killed_in_a_turn_commit_has_it_committed_at_the_next_start(ws, tmp_path):
    """SIGKILL in the window between commit_paths' `git add` and its commit (a `git` on PATH that holds
    `commit-tree` until killed): the turn's files were staged in the user's index, never committed."""
    import signal
    import subprocess
    import sys

    from conftest import wait_for

    ws = scripted(ws, "default:\n  - text: ok\n")
    write_goal(ws, "Hello", name="one")
    run_once(ws)
    real_git = subprocess.run(["sh", "-c", "command -v git"], capture_output=True, text=True).stdout.strip()
    slow = tmp_path / "bin"
    slow.mkdir()
    mark = tmp_path / "in-commit-tree"
    (slow / "git").write_text(f'#!/bin/sh\nif [ "$3" = commit-tree ]; then touch {mark}; sleep 61; fi\n'
                              f'exec {real_git} "$@"\n')
    (slow / "git").chmod(0o755)
    s = session_named(ws, "one")
    hand_mail(s, "more.md", "more")
    env = {**os.environ, "PATH": f"{slow}:{os.environ['PATH']}"}
    proc = subprocess.Popen([sys.executable, "-m", "primefs", "-w", str(ws.root), "run", "-q"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(mark.exists, what="the turn's commit")
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    subprocess.run(["pkill", "-f", "sleep 61"], check=False)  # the held git, if still there

    def staged():
        return subprocess.run(["git", "-C", str(ws.root), "diff", "--cached", "--name-only", "HEAD"],
                              capture_output=True, text=True).stdout.split()

    assert any(p.startswith(f"sessions/{s.id}/") for p in staged())  # what the kill left
    r = cli(ws, "run", "--once")
    assert r.returncode == 0 and "staged but not committed" in r.stderr, r.stderr
    assert staged() == []
    log = subprocess.run(["git", "-C", str(ws.root), "log", "--format=%s"], capture_output=True, text=True).stdout
    assert "recovered: 1 session(s) staged by a runner stopped before its commit" in log, log
    assert "more" in [e["text"] for e in s.events("message")]


def test_two_archive_commands_at_once_without_a_runner(ws):
    """The second waits for the first (it holds the runner lock without being a runner), then finds
    nothing left: before, it took the first for a runner and said the runner had stopped."""
    import subprocess
    import sys

    ws = scripted(ws, "default:\n  - text: ok\n")
    for i in range(6):
        write_goal(ws, f"Tree {i}", name=f"t{i}")
    run_once(ws)
    cmd = [sys.executable, "-m", "primefs", "-w", str(ws.root), "archive", "--status", "idle"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert not any("the runner stopped" in err for _, err in outs), outs
    archived = sorted(int(out.split()[1]) for out, _ in outs)
    assert sum(archived) == 6, outs


def test_a_session_with_a_long_life_wakes_from_the_end_of_its_history(ws, monkeypatch):
    """A runner that wakes a session (a new runner, or one that let it go) reads its history from the end,
    only as far back as it needs: the conversation since the last compaction, the last turn's number, the
    next event's. Reading all of it cost time and memory in proportion to the session's life (bench/wake.py:
    200,000 events, a peak of 156 MiB)."""
    import sys
    from pathlib import Path

    from primefs.index.db import Index
    from primefs.runner.core import Runner
    from primefs.store import history, mail

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from wake import grow

    ws = scripted(ws, "default:\n" + "  - text: fine\n" * 5)
    write_goal(ws, "Talk", name="talk")
    run_once(ws)
    s = session_named(ws, "talk")
    first = len(s.events())
    mail.deliver(s.mail, sender="user", to=s.id, kind="user", text="hello")
    run_once(ws)
    grow(s.history.path, s.events()[first:], 20_000)
    before = s.events()
    with Index(ws.root) as index:  # what a live index does as events come (not counted below)
        index.sync(meta_only=True)
    mail.deliver(s.mail, sender="user", to=s.id, kind="user", text="and now")
    parsed = []
    real = history.parse_event
    monkeypatch.setattr(history, "parse_event", lambda line: parsed.append(1) or real(line))
    runner = Runner(ws, log=lambda line: None)
    runner.run(once=True)
    monkeypatch.undo()
    assert len(parsed) < 500, len(parsed)  # of 20,000 events
    new = s.events()[len(before):]
    assert [e["n"] for e in new] == list(range(before[-1]["n"] + 1, before[-1]["n"] + 1 + len(new)))
    assert [e["turn"] for e in new if e["type"] == "turn_start"] == [before[-1]["turn"] + 1]
    agent = runner.turns.agents[s.id]
    assert agent.messages[0]["content"].startswith("[primefs] Earlier work was compacted")
    assert len(agent.messages) < 20 and len(agent.seen_ids) < 10  # what the last compaction kept, and since


def test_a_session_remembers_the_ids_its_conversation_holds_not_its_whole_life(ws):
    """The ids that keep a message from being shown twice grow with the conversation, not with the
    session's life: a compaction lets go of those it summarized (an id comes again only soon after a
    crash: runner/postoffice.py)."""
    from conftest import BackgroundRunner, wait_for

    from primefs.store import mail

    ws = scripted(ws, "default:\n" + "  - text: fine\n" * 100)
    ws = configure(ws, limits={"compact_at_tokens": 600})
    write_goal(ws, "Talk", name="talk")
    with BackgroundRunner(ws) as br:
        s = wait_for(lambda: session_named(ws, "talk"), what="the session")
        for i in range(8):
            answers = len(s.events("assistant"))
            mail.deliver(s.mail, sender="user", to=s.id, kind="user", text=f"message {i} " + "words " * 100)
            wait_for(lambda: len(s.events("assistant")) > answers and s.reload()["status"] == "idle",
                     what=f"the answer to message {i}")
        seen = set(br.runner.turns.agents[s.id].seen_ids)
    last = s.events("compaction")[-1]
    assert seen == {e["id"] for e in s.events("message") if e["n"] > last["upto_n"]}
    assert 0 < len(seen) < 8


def test_a_session_whose_history_cannot_be_written_fails_once_and_keeps_its_mail(ws):
    """A folder put where a session's history belongs: its mail failed it at once, the failure could not be
    written either, so the session was never failed and `run --once` took its mail again and again (a core,
    for ever). Now it is failed with the reason, the mail stays in new/, and only new mail tries again."""
    import shutil
    import subprocess
    import sys

    from primefs.store import mail

    ws = scripted(ws, "default:\n" + "  - text: fine\n" * 5)
    write_goal(ws, "Talk", name="talk")
    run_once(ws)
    s = session_named(ws, "talk")
    (s.dir / "history.jsonl").unlink()
    (s.dir / "history.jsonl").mkdir()
    mail.deliver(s.mail, sender="user", to=s.id, kind="user", text="hello")
    r = subprocess.run([sys.executable, "-m", "primefs", "-w", str(ws.root), "run", "--once"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 3 and "Is a directory" in r.stderr and "Traceback" not in r.stderr, r.stderr
    meta = s.reload()
    assert meta["status"] == "failed" and "Is a directory" in meta["error"]
    assert len(mail.new_files(s.mail)) == 1  # not lost: taken once the history is back
    shutil.rmtree(s.dir / "history.jsonl")
    (s.dir / "history.jsonl").write_text("")
    run_once(ws)
    assert [e["text"] for e in s.events("message")] == ["hello"] and s.read_result() == "fine"


def test_results_a_parent_reads_as_mail_are_not_kept_by_the_runner(ws):
    """The post office keeps each child's result mail until wait() marks it read. A parent that never waits
    reads it as mail, and the runner kept the message (its whole text) for its life."""
    from conftest import BackgroundRunner, wait_for

    from primefs.store import mail

    ws = scripted(ws, "rules:\n  - match: '^Parent'\n    replies:\n      - code: \"rlm('Child task')\"\n"
                      "      - text: spawned\n      - text: got it\n      - code: \"print(rlm('Child task').wait())\"\n"
                      "      - text: waited\n"
                      "  - match: '^Child'\n    replies:\n      - text: child result\n")
    write_goal(ws, "Parent job", name="parent")
    with BackgroundRunner(ws) as br:
        parent = wait_for(lambda: session_named(ws, "parent"), what="the parent")
        wait_for(lambda: parent.read_result() == "got it", what="the parent's turn on its child's result mail")
        assert br.runner.post._results == {}
        mail.deliver(parent.mail, sender="user", to=parent.id, kind="user", text="again, and wait")
        wait_for(lambda: parent.read_result() == "waited", what="the parent's wait()")
        assert br.runner.post._results == {}
    assert [e.get("read_by") for e in parent.events("message") if e["kind"] == "result"] == [None, "wait"]
