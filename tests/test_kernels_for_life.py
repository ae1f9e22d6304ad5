"""One kernel per session for life, variables that survive its shutdown, identity that cannot be stolen."""
from __future__ import annotations

import subprocess

from conftest import BackgroundRunner, configure, run_once, sigkill_runner_when, wait_for

from primefs.store import mail
from primefs.store.goals import write_goal
from primefs.store.session import list_sessions

SET_THEN_READ = """\
- code: "x = 41\\nimport math\\ndef f(a):\\n    return a + 1\\nimport socket\\nsock = socket.socket()"
- text: set
- code: "print(x + 1, f(1), math.pi > 3, 'sock' in dir())"
- text: done
"""


def scripted(ws, script: str, **limits):
    (ws.root / "s.yaml").write_text(script)
    return configure(ws, model="scripted/s.yaml", limits=limits) if limits else configure(ws, model="scripted/s.yaml")


def named(ws, name):
    return next(s for s in list_sessions(ws.sessions) if s.meta.get("name") == name)


def notices(s):
    return [e["text"] for e in s.events("notice")]


def test_variables_survive_an_idle_shutdown_of_the_kernel(ws):
    ws = scripted(ws, SET_THEN_READ, max_idle_kernels=0, snapshot="idle")
    write_goal(ws, "Remember", name="mem")
    with BackgroundRunner(ws) as br:
        s = wait_for(lambda: next(iter(list_sessions(ws.sessions)), None))
        wait_for(lambda: s.read_result() == "set", what="first turn")
        agent = wait_for(lambda: br.runner.turns.agents.get(s.id))
        wait_for(lambda: agent.kernel.handle is None, what="the idle kernel shut down")
        mail.deliver(s.mail, sender="user", to=s.id, kind="user", text="go on")
        wait_for(lambda: s.read_result() == "done", what="second turn")
    assert s.events("cell")[1]["output"] == "42 2 True False\n"
    told = notices(s)[-1]
    assert "shut down while the session was idle" in told and "restored from the snapshot" in told
    assert "x" in told and "math (module)" in told and "sock (TypeError" in told
    kernels = s.events("kernel")
    assert [k["event"] for k in kernels][:3] == ["started", "stopped", "restarted"] and kernels[0]["pid"] != kernels[2]["pid"]


def test_variables_survive_a_runner_stop(ws):
    ws = scripted(ws, SET_THEN_READ)
    write_goal(ws, "Remember", name="mem")
    run_once(ws)  # the runner exits after the first turn: its kernel is gone
    s = named(ws, "mem")
    assert (s.dir / "kernel" / "manifest.json").is_file()
    mail.deliver(s.mail, sender="user", to=s.id, kind="user", text="go on")
    run_once(ws)
    assert s.read_result() == "done" and s.events("cell")[1]["output"] == "42 2 True False\n"
    assert "the runner restarted" in notices(s)[-1] and "restored" in notices(s)[-1]
    # snapshots are runtime files: never committed, the tree stays clean
    tracked = subprocess.run(["git", "-C", str(ws.root), "ls-files", "sessions"], capture_output=True, text=True).stdout
    assert "/kernel/" not in tracked
    status = subprocess.run(["git", "-C", str(ws.root), "status", "--porcelain", "sessions"], capture_output=True,
                            text=True).stdout
    assert status == ""


def test_after_a_sigkill_the_last_snapshot_comes_back(ws):
    ws = scripted(ws, """\
- code: "x = 41"
- text: first
- code: "y = 2\\nimport time\\ntime.sleep(60)"
- code: "print(x, 'y' in dir())"
- text: recovered
""")
    write_goal(ws, "Long job", name="long")
    run_once(ws)
    s = named(ws, "long")
    mail.deliver(s.mail, sender="user", to=s.id, kind="user", text="go on")
    sigkill_runner_when(ws, lambda: len(s.events("assistant")) == 3, what="the long cell")  # turn 1 had 2
    run_once(ws)
    assert s.read_result() == "recovered"
    assert s.events("cell")[-1]["output"] == "41 False\n"  # the turn-end snapshot, not the cut-off turn
    told = " ".join(notices(s))
    assert "runner restarted" in told and "restored from the snapshot" in told
    # a resumed turn is not a new turn
    starts = s.events("turn_start")
    assert [e["turn"] for e in starts] == [1, 2, 2] and starts[-1].get("resumed") is True


def test_a_dead_kernel_comes_back_from_the_last_snapshot(ws):
    ws = scripted(ws, """\
- code: "x = 41"
- text: first
- code: "z = 1\\nimport os\\nos._exit(3)"
- code: "print(x, 'z' in dir())"
- text: ok
""")
    write_goal(ws, "Crash", name="crash")
    run_once(ws)
    s = named(ws, "crash")
    with BackgroundRunner(ws):
        mail.deliver(s.mail, sender="user", to=s.id, kind="user", text="go on")
        wait_for(lambda: s.read_result() == "ok")
    cells = s.events("cell")
    assert cells[1]["restarted"] and "variables are gone, except what its last snapshot restored" in cells[1]["shown"]
    assert "x" in cells[1]["shown"] and cells[2]["output"] == "41 False\n"


def test_snapshots_off_means_nothing_comes_back(ws):
    ws = scripted(ws, SET_THEN_READ.replace("print(x + 1, f(1), math.pi > 3, 'sock' in dir())",
                                            "print('x' in dir())"), snapshot="off")
    write_goal(ws, "Forget", name="f")
    run_once(ws)
    s = named(ws, "f")
    mail.deliver(s.mail, sender="user", to=s.id, kind="user", text="go on")
    run_once(ws)
    assert s.events("cell")[1]["output"] == "False\n" and not (s.dir / "kernel" / "manifest.json").exists()
    assert "variables you made are gone" in notices(s)[-1]


def test_sessions_never_share_a_kernel_process(ws):
    ws = scripted(ws, """\
rules:
  - match: "^Leave"
    replies:
      - code: "import threading, time\\nthreading.Thread(target=time.sleep, args=(60,), name='spy', daemon=True).start()"
      - text: left
  - match: "^Look"
    replies:
      - code: "import threading\\nprint([t.name for t in threading.enumerate()].count('spy'))"
      - text: looked
""", max_idle_kernels=8)
    write_goal(ws, "Leave a thread behind", name="a")
    run_once(ws)
    write_goal(ws, "Look for threads", name="b")
    run_once(ws)
    a, b = named(ws, "a"), named(ws, "b")
    assert b.events("cell")[0]["output"] == "0\n"
    assert a.events("kernel")[0]["pid"] != b.events("kernel")[0]["pid"]


def test_a_token_stolen_from_another_session_is_refused(ws):
    ws = scripted(ws, """\
rules:
  - match: "^Victim"
    replies:
      - code: "m = recv(timeout=60)\\nprint(m.text)"
      - text: victim done
  - match: "^Thief"
    replies:
      - code: |
          import os
          from primefs.kernels.inside.rpc import call
          sock, tok = open('../../../stolen.txt').read().split()  # from the room: sessions/<id>/work/
          sock = sock if os.path.exists(sock) else '/tmp/.primefs/rpc'  # a sandboxed kernel's view of it
          for op, args in [('send', {'to': 'parent', 'text': 'x'}),
                           ('harness_put', {'kind': 'note', 'name': 'forged', 'body': 'b', 'scope': 'global'})]:
              try:
                  call(sock, tok, op, args)
                  print(op, 'accepted')
              except Exception as e:
                  print(op, 'refused:', e)
      - text: thief done
""")
    write_goal(ws, "Victim waits", name="victim")
    with BackgroundRunner(ws) as br:
        victim = wait_for(lambda: next(iter(list_sessions(ws.sessions)), None))
        wait_for(lambda: victim.events("assistant"), what="the victim's cell")
        handle = wait_for(lambda: br.runner.turns.agents[victim.id].kernel.handle)
        (ws.root / "stolen.txt").write_text(f"{ws.runtime / 'rpc.sock'} {handle.token}")
        write_goal(ws, "Thief acts", name="thief")
        thief = wait_for(lambda: next((s for s in list_sessions(ws.sessions) if s.name == "thief"), None))
        wait_for(lambda: thief.read_result() == "thief done", what="the thief")
        mail.deliver(victim.mail, sender="user", to=victim.id, kind="user", text="wake up")
        wait_for(lambda: victim.read_result() == "victim done", what="the victim")
    out = thief.events("cell")[0]["output"]
    assert out.count("refused: request refused: the caller is not a process of the kernel") == 2, out
    assert not (ws.root / "harness/notes/forged.md").exists() and not victim.events("sent")
    log = subprocess.run(["git", "-C", str(ws.root), "log", "--format=%B"], capture_output=True, text=True).stdout
    assert f"Primefs-Session: {victim.id}" not in log


def test_a_runner_lets_go_of_sessions_it_has_not_used_for_a_while(ws, monkeypatch):
    """A runner that runs for months must not keep every session it ever ran (an Agent of ~20 KB, an open
    history file each): beyond KEEP_AGENTS, idle ones without a kernel are let go, read again if they wake."""
    from primefs.runner import turns

    monkeypatch.setattr(turns, "KEEP_AGENTS", 2)
    ws = scripted(ws, SET_THEN_READ, max_idle_kernels=0, snapshot="idle")
    names = [f"mem{i}" for i in range(6)]
    for name in names:  # (a budget each: the runner keeps their usage as they spend it)
        write_goal(ws, "Remember", name=name, extra={"budget": {"tokens": 10**9}})
    with BackgroundRunner(ws) as br:
        wait_for(lambda: sorted(s.meta.get("name") for s in list_sessions(ws.sessions) if s.read_result() == "set")
                 == names, what="every first turn")
        wait_for(lambda: len(br.runner.turns.agents) <= 2, what="the runner let go of the others")
        wait_for(lambda: open_histories(ws) <= 2, what="their history files closed")
        assert len(br.runner.tree._sessions) <= 2  # their Session objects (session.yaml, history) too
        assert 0 < len(br.runner.goals._own) <= 2  # and their usage
        first = named(ws, "mem0")  # long let go: its conversation and kernel come back from its files
        assert first.id not in br.runner.turns.agents
        mail.deliver(first.mail, sender="user", to=first.id, kind="user", text="go on")
        wait_for(lambda: first.read_result() == "done", what="its second turn")
    assert first.events("cell")[1]["output"] == "42 2 True False\n"
    told = notices(first)[-1]
    assert "shut down while the session was idle" in told and "restored from the snapshot" in told
    assert [k["event"] for k in first.events("kernel")][:3] == ["started", "stopped", "restarted"]
    # the conversation was read again whole: the model saw its first turn before the new mail
    assert first.events("turn_start")[-1]["n"] > first.events("result")[0]["n"]


def open_histories(ws) -> int:
    """history.jsonl files of this workspace this process holds open."""
    import os

    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        n += target.startswith(str(ws.sessions)) and target.endswith("history.jsonl")
    return n
