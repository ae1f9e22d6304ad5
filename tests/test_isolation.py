"""A session's kernel attacking another session and the runner (docs/reliability.md, "Threat model").

Code in an attacker session's kernel tries each attack of the threat model against a victim session and
the runner (tests/attack.py), with a runner running as root and as a normal user (nobody), the sandbox on
and off. With the sandbox on every attack is refused and nothing changed; with it off the kernel has the
user's rights, but it still cannot take another session's identity from the kernel template's memory,
and the runner runs nothing it wrote (an untrusted goal, plugin, git hook or fsmonitor)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
from attack import run_attack
from conftest import BackgroundRunner, cli, configure, run_once, wait_for
from test_sandbox import as_nobody  # noqa: F401 - the fixture

from primefs.store import mail, trust
from primefs.store.goals import write_goal
from primefs.store.session import list_sessions

REFUSED_WITH_A_SANDBOX = [
    "victim session.yaml", "victim history", "victim result", "victim mail", "victim snapshot", "own session.yaml",
    "own history", "a goal", "a plugin", "git config", "git hook", "a harness note", "primefs.yaml", "trust record",
    "a live request", "the runtime folder", "the runner's socket", "a host unix socket", "network", "/proc/sys",
    "hostname", "signal the runner", "see the runner's environment", "victim key in the template's memory",
    "victim key in the runner's memory", "approve the victim's request (a live request)",
    "approve the victim's request (its file)", "approve the victim's request (primefs approve)"]


def assert_sandbox_held(r: dict, uid: int) -> None:
    f = r["findings"]
    accepted = [name for name in REFUSED_WITH_A_SANDBOX if not f[name].startswith("refused")]
    assert accepted == [], {name: f[name] for name in accepted}
    assert f["victim key in my own memory"] == "accepted: False"  # nothing inherited from the template
    assert f["uid"] == uid and f["pid"] == 1  # never root; its own pid namespace
    # its own socket folder: for a root runner the runner's again once the kernel's sockets are made; else
    # the kernel's, where replacing its link cuts off only itself (the runner's socket is unchanged below)
    assert f["replace my own rpc link"].startswith(("accepted", "refused: PermissionError"))
    assert "No such process" in f["signal the runner"]  # another pid namespace
    for write in ("victim session.yaml", "a goal", "own history"):  # an error in the kernel, never a private copy
        assert "Read-only file system" in f[write] or "Permission denied" in f[write], f[write]
    assert_nothing_changed(r)


def assert_nothing_changed(r: dict) -> None:
    assert r["changed"] == [] and r["victim_history_kept"] and r["git_config_kept"] and r["rpc_inode_kept"]
    assert r["victim_messages"] == ["wake up"] and r["victim_cost"] == 0 and r["victim_budget"] is None
    assert r["victim_result"] == "victim done" and not r["marker"] and not r["evil_goal_taken"]
    assert r["sessions"] == ["attacker", "victim"] and r["approved_by"] == []  # no answer but the person's


@pytest.mark.skipif(os.getuid() != 0, reason="the root runner's case")
def test_a_sandboxed_kernel_of_a_root_runner_cannot_reach_past_its_room(tmp_path):
    r = run_attack(tmp_path, "on")
    assert_sandbox_held(r, 65534)


def test_without_a_sandbox_identity_and_the_runner_still_hold(tmp_path):
    """Sandbox off: the kernel has the runner's user's rights (docs), but no other kernel's key is in any
    memory it may read, and what it plants is never run (untrusted goal and plugin, git hooks, fsmonitor)."""
    r = run_attack(tmp_path, "off")
    f = r["findings"]
    assert f["victim key in my own memory"] == "accepted: False"
    assert f["victim key in the template's memory"] in ("accepted: False",) or f[
        "victim key in the template's memory"].startswith("refused")  # root reads it: the key is not there
    assert f["a goal"].startswith("accepted") and f["a plugin"].startswith("accepted")  # it may write them...
    assert not r["marker"] and not r["evil_goal_taken"]  # ...but nothing of it runs
    assert any("goals/evil.md" in ln and "primefs trust" in ln for ln in r["lines"]), r["lines"]


@pytest.mark.skipif(os.getuid() != 0 or not shutil.which("setpriv"), reason="needs root to become another user")
@pytest.mark.parametrize("sandbox", ["on", "off"])
def test_the_same_with_a_runner_of_a_normal_user(as_nobody, sandbox):  # noqa: F811
    out = as_nobody(f"""
        import json, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from attack import run_attack
        print("RESULT", json.dumps(run_attack("attack", {sandbox!r}), default=str))
        """, timeout=300)
    line = next((ln for ln in out.splitlines() if ln.startswith("RESULT ")), None)
    assert line, out
    r = json.loads(line[len("RESULT "):])
    if sandbox == "on":
        assert_sandbox_held(r, 65534)
    else:  # the same user: no sandbox means its rights, but the template and the runner are non-dumpable
        f = r["findings"]
        assert f["victim key in the template's memory"].startswith("refused: PermissionError")
        assert f["victim key in the runner's memory"].startswith("refused: PermissionError")
        assert f["see the runner's environment"].startswith("refused: PermissionError")
        assert not r["marker"] and not r["evil_goal_taken"]


def test_a_command_end_condition_runs_in_the_sessions_sandbox(ws, monkeypatch):
    """A goal's `command` runs as the kernel would: in its room, sandboxed, without the runner's keys."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-runner-key-0123456789abcdef")
    (ws.root / "s.yaml").write_text("- code: \"open('made.txt', 'w').write('x')\"\n- text: done\n")
    ws = configure(ws, model="scripted/s.yaml")
    (ws.goals / "g.md").write_text(textwrap.dedent("""\
        ---
        end_conditions:
        - command: "echo key=$OPENAI_API_KEY; echo x > /usr/escape.txt; test -f made.txt && pwd"
        ---
        Make the file
        """))
    run_once(ws)
    s = list_sessions(ws.sessions)[0]
    report = next(e for e in s.events() if e["type"] == "end_conditions")
    assert report["results"] == [{"name": "command", "passed": True}]
    assert not Path("/usr/escape.txt").exists() and s.meta["status"] == "done"
    out = s.events("end_conditions")[0]
    assert out["report"] == ""  # passed: no report; the command's output is checked below
    code, text = _run_in_room(ws, s, "echo key=$OPENAI_API_KEY; echo x > /usr/escape.txt; pwd")
    assert "key=\n" in text and "Read-only file system" in text and text.rstrip().endswith(f"{s.dir}/work")


def _run_in_room(ws, s, command: str):
    from primefs.runner.core import Runner

    r = Runner(ws)
    from primefs.runner.agent import Agent

    agent = Agent(s, ws=ws, tree=r.tree, gateway=r.gateway, post=r.post, host=None, bell=r.bell)
    return agent.run_command(command, 30)


def test_a_fifo_or_a_link_in_a_session_folder_blocks_nothing(ws, scripted):
    """A FIFO planted as a session's history, links in a room to /etc/shadow, /dev/zero and nowhere, a
    FIFO in a room: status, log, usage, send and archive all finish, and no zip holds what a link names."""
    ws = scripted("- code: |\n    import os\n    os.symlink('/etc/shadow', 'shadow')\n    os.symlink('/dev/zero', 'zero')\n"
                  "    os.symlink('/nowhere', 'dangling')\n    os.mkfifo('fifo')\n- text: done\n")
    write_goal(ws, "Plant links", name="links")
    write_goal(ws, "Be planted on", name="other")
    run_once(ws)
    by = {s.name: s for s in list_sessions(ws.sessions)}
    other = by["other"]
    (other.dir / "history.jsonl").rename(other.dir / "history.bak")
    os.mkfifo(other.dir / "history.jsonl")
    (other.dir / "summary.json").unlink(missing_ok=True)
    for args in (["status"], ["status", "--json"], ["log", "other"], ["usage", "other"], ["send", "other", "hi"],
                 ["logs", "-n", "5"]):
        r = cli(ws, *args, timeout=30)
        assert "Traceback" not in r.stderr, (args, r.stderr)
    os.unlink(other.dir / "history.jsonl")
    (other.dir / "history.bak").rename(other.dir / "history.jsonl")
    r = cli(ws, "archive", "--status", "idle,done", "--json", timeout=60)
    assert r.returncode == 0, r.stderr
    import zipfile

    zips = list((ws.root / "archive").glob("*.zip"))
    assert (ws.root / "archive" / f"{by['links'].id}.zip") in zips, r.stdout
    for z in zips:
        with zipfile.ZipFile(z) as zf:
            for info in zf.infolist():
                data = zf.read(info)
                assert b"root:" not in data and len(data) < 10_000_000, info.filename
            names = {i.filename.rsplit("/", 1)[-1]: i for i in zf.infolist()}
            if "shadow" in names:
                assert zf.read(names["shadow"]) == b"/etc/shadow" and "fifo" not in names


def test_no_key_reaches_a_workspace_file_or_git(ws, monkeypatch):
    """A model that echoes the runner's key and passes it to children, contexts and heartbeats: no file of
    the workspace and nothing in `git log -p` holds it; kernels got it redacted (llm(), rlm() results)."""
    key = "sk-proj-runnerkey0123456789abcdefghij"
    monkeypatch.setenv("OPENAI_API_KEY", key)
    (ws.root / "s.yaml").write_text(textwrap.dedent(f"""\
        rules:
          - match: "^child"
            replies:
              - text: "child saw {key}"
          - match: "^Leak"
            replies:
              - code: |
                  h = rlm("child {key}", context="context {key}")
                  heartbeat(every="1h", prompt="beat {key}")
                  got = llm("say it")
                  open("out.txt", "w").write(got + h.wait())
                  print(got)
              - text: "the key is {key}"
          - match: "^say it"
            replies:
              - text: "llm echoes {key}"
        """))
    ws = configure(ws, model="scripted/s.yaml")
    assert cli(ws, "goal", f"Leak {key}", "--name", "leak").returncode == 0
    run_once(ws)
    leak = next(s for s in list_sessions(ws.sessions) if s.name == "leak")
    assert leak.events("cell")[0]["output"] == "llm echoes [redacted]\n"
    files = [p for p in ws.root.rglob("*") if p.is_file() and ".git" not in p.parts and p.name != "s.yaml"]
    assert files and [str(p) for p in files if key.encode() in p.read_bytes()] == []
    log = subprocess.run(["git", "-C", str(ws.root), "log", "-p", "--all", "--", ".", ":(exclude)s.yaml"],
                         capture_output=True, text=True).stdout
    assert "child [redacted]" in log and key not in log
    for p in ws.runtime.rglob("*"):  # kernel logs and the like
        if p.is_file():
            assert key.encode() not in p.read_bytes(), p


def test_a_key_written_in_primefs_yaml_is_refused_and_a_key_file_must_lie_outside(ws, tmp_path):
    (ws.root / "primefs.yaml").write_text("models:\n  gpt:\n    model: openai/gpt-4o-mini\n    api_key: sk-abcdefgh12345678\n")
    r = cli(ws, "models")
    assert r.returncode == 1 and "models.gpt.api_key: a key written in primefs.yaml can be read by every kernel" in r.stderr
    (ws.root / "key.txt").write_text("sk-abcdefgh12345678\n")
    (ws.root / "primefs.yaml").write_text(f"models:\n  gpt:\n    model: openai/x\n    api_key_file: {ws.root / 'key.txt'}\n")
    assert "api_key_file must be outside the workspace" in cli(ws, "models").stderr
    (tmp_path / "key.txt").write_text("sk-abcdefgh12345678\n")
    (ws.root / "primefs.yaml").write_text(f"models:\n  gpt:\n    model: openai/x\n    api_key: none\n"
                                          f"  other:\n    model: openai/y\n    api_key_file: {tmp_path / 'key.txt'}\n")
    rows = {m["name"]: m for m in json.loads(cli(ws, "models", "--json").stdout)}
    assert rows["other"]["key"] == f"in {tmp_path / 'key.txt'}" and rows["gpt"]["key"] == "in primefs.yaml"


def test_a_rooms_files_are_committed_read_safely(ws, scripted):
    """What a kernel writes in its room is in the turn's commit (files, links as links, executables); its
    folders are read through descriptors, so a folder swapped for a link is never followed by git."""
    ws = scripted("- code: |\n    import os\n    os.makedirs('d', exist_ok=True)\n    open('d/out.txt', 'w').write('result')\n"
                  "    os.symlink('/etc/passwd', 'pw')\n    open('run.sh', 'w').write('echo')\n    os.chmod('run.sh', 0o755)\n"
                  "- text: done\n")
    write_goal(ws, "Write", name="w")
    run_once(ws)
    s = list_sessions(ws.sessions)[0]
    show = lambda path: subprocess.run(["git", "-C", str(ws.root), "show", f"HEAD:sessions/{s.id}/work/{path}"],
                                       capture_output=True, text=True).stdout  # noqa: E731
    assert show("d/out.txt") == "result" and show("pw") == "/etc/passwd"
    tree = subprocess.run(["git", "-C", str(ws.root), "ls-tree", "-r", "HEAD", f"sessions/{s.id}/work"],
                          capture_output=True, text=True).stdout
    assert "120000" in tree and "100755" in tree
    # the kernel swaps a folder for a link to one only root may read: the next commit keeps a link
    secret = Path(f"/root/primefs-test-secret-{os.getpid()}") if os.getuid() == 0 else None
    if secret is not None:
        secret.mkdir(mode=0o700)
        (secret / "out.txt").write_text("root only")
        try:
            shutil.rmtree(s.dir / "work" / "d")
            os.symlink(secret, s.dir / "work" / "d")
            from primefs.store.gitops import commit_paths

            commit_paths(ws.root, [f"sessions/{s.id}"], "after the swap")
            assert show("d") == str(secret) and "root only" not in show("d/out.txt")
            log = subprocess.run(["git", "-C", str(ws.root), "log", "-p", "--all"], capture_output=True, text=True).stdout
            assert "root only" not in log
        finally:
            shutil.rmtree(secret)


def test_a_skill_a_kernel_wrote_runs_with_more_rights_only_once_trusted(ws, scripted):
    """A sandboxed session writes a global skill through the harness API; a trusted session without a
    sandbox does not import it until a person trusts it. A subagent spec it writes gives no extra tools."""
    ws = scripted(textwrap.dedent("""\
        rules:
          - match: "^Write"
            replies:
              - code: |
                  harness.put("skill", "helper", "Say hi.", description="says hi", files={"helper.py": "X = 'hi'\\n"})
              - text: written
          - match: "^(Use|again)"
            replies:
              - code: |
                  try:
                      from skills import helper
                      print("imported", helper.X)
                  except Exception as e:
                      print("refused:", e)
              - text: used
              - code: "from skills import helper\\nprint('imported', helper.X)"
              - text: used again
        """))
    write_goal(ws, "Write a skill", name="writer")
    run_once(ws)
    (ws.goals / "free.md").write_text("---\nsandbox: off\n---\nUse the skill\n")
    trust.trust(ws, ["goals/free.md"])
    run_once(ws)
    free = next(s for s in list_sessions(ws.sessions) if s.name == "free")
    out = free.events("cell")[0]["output"]
    assert out.startswith("refused: skill 'helper' was written by a session's kernel") and \
        "primefs trust harness/skills/helper" in out, out
    assert {"path": "harness/skills/helper", "what": "skill a kernel wrote (for kernels without a sandbox)",
            "trusted": False} in json.loads(cli(ws, "trust", "--json").stdout)
    assert cli(ws, "trust", "harness/skills/helper").returncode == 0
    mail.deliver(free.mail, sender="user", to=free.id, kind="user", text="again")
    run_once(ws)
    assert free.events("cell")[-1]["output"] == "imported hi\n"


def test_a_kernel_cannot_hold_the_commit_lock(ws, scripted):
    """A kernel that flock()ed .primefs/commit.lock (an open file can be locked, a read-only one too)
    stopped every commit of the workspace, and a person's `harness put` with them (found by an attack).
    Sandboxed kernels now see an empty file in its place, and only its owner may open it."""
    ws = scripted("- code: |\n    import fcntl, os\n    try:\n        HELD = open('../../../.primefs/commit.lock', 'rb')\n"
                  "        fcntl.flock(HELD, fcntl.LOCK_EX | fcntl.LOCK_NB)\n        print('locked', os.fstat("
                  "HELD.fileno()).st_size)\n    except OSError as exc:\n        print('refused', type(exc).__name__)\n"
                  "- text: holding it\n")
    write_goal(ws, "Hold the lock", name="holder")
    (ws.root / ".primefs" / "commit.lock").touch()  # (as after any commit: an earlier primefs made it 0644)

    def log() -> str:
        return subprocess.run(["git", "-C", str(ws.root), "log", "--format=%s"], capture_output=True, text=True).stdout

    with BackgroundRunner(ws):  # its kernel lives on, idle, holding what it could lock
        s = wait_for(lambda: next(iter(list_sessions(ws.sessions)), None))
        wait_for(lambda: s.read_result() == "holding it", what="the turn")
        wait_for(lambda: "turn 1 idle: holder" in log(), timeout=20, what="the turn's commit, the kernel alive")
    out = s.events("cell")[0]["output"]
    assert out.startswith(("locked 0", "refused")), out  # /dev/null in its place, or not to be opened at all
    assert (ws.root / ".primefs" / "commit.lock").stat().st_mode & 0o777 == 0o600


def test_a_kernel_cannot_take_over_another_sessions_name(ws, scripted):
    """`rlm(task, name='victim')` made a child that `primefs send victim`, `exec` and `result` reached
    instead of the person's session of that name (the newest of a name wins). Now a child may not take a
    name another tree has; names within its own tree are its own."""
    ws = scripted("rules:\n  - match: '^Victim'\n    replies:\n      - text: victim here\n"
                  "  - match: '^Take'\n    replies:\n      - code: |\n"
                  "          try:\n              rlm('x', name='victim')\n"
                  "          except Exception as exc:\n              print(type(exc).__name__, exc)\n"
                  "          h = rlm('y', name='mine')\n          print(h.wait())\n      - text: tried\n"
                  "  - match: '^[xy]'\n    replies:\n      - text: child here\n")
    write_goal(ws, "Victim job", name="victim")
    run_once(ws)
    write_goal(ws, "Take its name", name="taker")
    run_once(ws)
    by = {}
    for s in list_sessions(ws.sessions):
        by.setdefault(s.name, []).append(s)
    out = by["taker"][0].events("cell")[0]["output"]
    assert "a session of another tree has that name" in out and "child here" in out, out
    assert len(by["victim"]) == 1 and len(by["mine"]) == 1
    r = cli(ws, "result", "victim")
    assert r.stdout.strip() == "victim here", r.stdout


def test_what_a_session_wrote_cannot_drive_the_persons_terminal(ws, scripted):
    """A reply or a cell's output (a prompt injection may write them) with terminal escapes: OSC 52 sets the
    clipboard, CSI 2J clears the screen. At a terminal every command shows them as symbols (ESC as ␛); piped
    output keeps the files' text. A mail file's name cannot forge a line of the runner's log."""
    import re

    ws = scripted('- code: "print(\'out \\\\x1b[2J\')"\n- text: "reply \\e]52;c;ZXZpbA==\\a \\e[2J done"\n')
    write_goal(ws, "Say something", name="talker")
    run_once(ws)
    s = next(x for x in list_sessions(ws.sessions) if x.name == "talker")
    assert "\x1b]52;" in s.read_result() and "\x1b[2J" in s.events("cell")[0]["output"]  # the files hold them
    term = {"COLUMNS": "100", "FORCE_COLOR": "1"}  # (as on a terminal)
    own_escapes = re.compile(r"\x1b\[[0-9;]*m")  # rich's colours: the only escapes allowed through
    for args in (["result", "talker"], ["log", "talker"], ["logs", "-n", "0"], ["status", "-a"]):
        shown = cli(ws, *args, env=term).stdout
        assert "\x1b" not in own_escapes.sub("", shown), (args, shown)
    assert "␛]52;c;ZXZpbA==" in cli(ws, "result", "talker", env=term).stdout
    assert "␛[2J" in cli(ws, "log", "talker", env=term).stdout
    assert "\x1b]52;" in cli(ws, "result", "talker", env={"FORCE_COLOR": ""}).stdout  # piped: the text as it is
    # a mail name with a newline: one line in the runner's log, not a forged second one
    hand = s.mail / "tmp" / "evil\nwarning: forged line"
    hand.write_text("---\nfrom: [\n---\nbad front matter\n")
    os.rename(hand, s.mail / "new" / hand.name)
    lines = run_once(ws)
    assert not any(line.startswith("warning: forged") for line in lines), lines
    assert any("evil␤warning: forged line" in line for line in lines), lines


def test_lone_surrogates_from_a_kernel_reach_no_file_and_fail_nothing(ws, scripted):
    """A document's broken bytes read with surrogateescape are lone surrogates, which no file, YAML or model
    request can hold: a done() answer with one failed its session, a heartbeat's prompt was refused with an
    encoder's error. The runner takes them as U+FFFD."""
    ws = scripted('- code: |\n'
                  '    open("doc.txt", "wb").write(b"caf\\xe9 \\xff")\n'
                  '    text = open("doc.txt", errors="surrogateescape").read()\n'
                  '    print(heartbeat(prompt=text, every="1h")["id"][:3])\n'
                  '    done("answer: " + text)\n'
                  '- text: fine\n')
    write_goal(ws, "Read it", name="reader")
    run_once(ws)
    s = next(x for x in list_sessions(ws.sessions) if x.name == "reader")
    assert s.status == "done" and s.read_result() == "answer: caf\ufffd \ufffd", (s.status, s.meta.get("error"))
    assert s.events("cell")[0]["output"].startswith("hb-")
    beat = next((s.dir / "heartbeats").glob("hb-*.yaml")).read_text()
    assert "caf\ufffd \ufffd" in beat, beat


FLOOD = """\
import gc, socket, time
link = next(o for o in gc.get_objects() if type(o).__name__ == "_Link")
held = []
for _ in range(300):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(link.sock)
    try:
        s.sendall(b'{"token": ')
    except OSError:  # past its share: refused at once, maybe closed before this
        pass
    held.append(s)
open("holding", "w").close()
time.sleep(20)
print("held", len(held))
"""


def test_a_kernel_that_floods_the_runners_socket_does_not_stop_other_sessions(ws, scripted):
    """Requests a kernel leaves half sent hold the runner's reading of requests (at most 256 at once). One
    kernel holding them all made every other kernel's requests fail, the hello of a kernel starting too, for
    as long as it kept at it. Now each session tree has a share (rpc.MAX_READING_EACH)."""
    import time

    flood = "\n".join("          " + line for line in FLOOD.splitlines())
    ws = scripted("rules:\n  - match: '^Flood'\n    replies:\n      - code: |\n" + flood + "\n      - text: flooded\n"
                  "  - match: '^Victim'\n    replies:\n      - code: print(llm('say hi'))\n      - text: victim done\n"
                  "  - match: '^say hi'\n    replies:\n      - text: hi there\n")
    with BackgroundRunner(ws):
        write_goal(ws, "Flood the socket", name="flood")
        attacker = wait_for(lambda: next((s for s in list_sessions(ws.sessions) if s.name == "flood"), None))
        wait_for(lambda: (attacker.dir / "work" / "holding").exists(), 60, "the attacker holding its connections")
        write_goal(ws, "Victim job", name="victim")
        victim = wait_for(lambda: next((s for s in list_sessions(ws.sessions) if s.name == "victim"
                                        and s.read_result()), None), 60, "the victim's answer")
        answered = time.time()
        wait_for(lambda: attacker.read_result() == "flooded", 60, "the attacker's end")
    assert victim.events("cell")[0]["output"] == "hi there\n", victim.events("cell")
    assert victim.read_result() == "victim done"
    held = attacker.events("cell")[0]
    assert held["output"] == "held 300\n" and held["ts"] > answered  # the victim was served while it held
