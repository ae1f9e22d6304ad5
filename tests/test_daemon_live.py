"""Long-running control: up/down/runner, tail, attach (through a real pseudo-terminal), agents.

Real processes: `primefs up` starts a detached runner; the tests stop it with `primefs down`
(and, should a test fail half-way, with SIGKILL in the fixture's clean-up).
"""
from __future__ import annotations

import io
import json
import os
import re
import select
import signal
import subprocess
import threading
import time

from conftest import PRIMEFS, answered_under_a_runner, cli, session_named, wait_for
from rich.console import Console

from primefs.cli.daemon import alive
from primefs.store.control import lock_held
from primefs.store.history import HistoryReader
from primefs.cli.live import follow

ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


def test_up_runner_goal_tail_agents_down(ws, scripted, daemon_cleanup):
    ws = scripted('- code: "print(6 * 7)"\n- text: done\n')
    r = cli(ws, "up")
    assert r.returncode == 0, r.stderr
    assert (ws.state / "runner.json").is_file()
    info = json.loads(cli(ws, "runner", "--json").stdout)
    pid = info["pid"]
    assert info["running"] is True and f"pid {pid}" in r.stdout and str(ws.state / "runner.log") in r.stdout
    assert alive(pid) and info["started_iso"] and info["uptime_s"] >= 0
    assert info["memory"]["runner_rss_kb"] > 0
    # a second runner is refused, in one clean line
    again = cli(ws, "up")
    assert again.returncode == 1 and again.stderr.startswith("error: a runner is already running")
    assert "Traceback" not in again.stderr
    # a goal file written by hand is picked up and done by the background runner
    (ws.goals / "sums.md").write_text("compute something\n")
    s = wait_for(lambda: session_named(ws, "sums"), what="session")
    wait_for(lambda: s.read_result() == "done" and s.reload()["status"] == "idle", what="result")
    text = cli(ws, "runner").stdout
    assert f"runner: running, pid {pid}" in text and "memory: runner" in text
    assert all(len(line) <= 80 for line in text.splitlines() if not line.startswith("log: ")), text  # (80 columns)
    # agents --once: one frame with the tree
    frame = cli(ws, "agents", "--once")
    assert frame.returncode == 0, frame.stderr
    assert "sums" in frame.stdout and "idle" in frame.stdout
    assert f"runner pid {pid}" in frame.stdout and "turn_end" in frame.stdout
    rows = json.loads(cli(ws, "agents", "--once", "--json").stdout)
    assert any(r["id"] == s.id and r["name"] == "sums" and r["status"] == "idle" for r in rows)
    # tail: the existing events, then it keeps following until Ctrl-C (SIGINT)
    tail = subprocess.Popen([*PRIMEFS, "tail", "sums", "-w", str(ws.root)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, "COLUMNS": "200"})
    out = b""
    deadline = time.monotonic() + 20
    while b"turn 1 ended" not in out and time.monotonic() < deadline:
        ready, _, _ = select.select([tail.stdout], [], [], 0.5)
        if ready:
            out += os.read(tail.stdout.fileno(), 65536)
    assert b"turn 1 ended" in out and b"print(6 * 7)" in out and b"42" in out
    assert tail.poll() is None  # still following
    tail.send_signal(signal.SIGINT)
    assert tail.wait(10) == 0 and b"Traceback" not in tail.stderr.read()
    kernels = [k["pid"] for k in info["memory"]["kernels"]]
    # down: SIGTERM, the lock is released, the process is gone, the sessions are intact
    r = cli(ws, "down")
    assert r.returncode == 0 and f"runner stopped (pid {pid})" in r.stdout, r.stdout + r.stderr
    assert not lock_held(ws) and not alive(pid)
    assert not (ws.state / "runner.json").exists()
    assert all(not alive(k) for k in kernels)
    assert s.reload()["status"] == "idle" and s.read_result() == "done"
    assert len(s.events("turn_end")) == 1
    assert json.loads(cli(ws, "runner", "--json").stdout)["running"] is False
    assert "goal goals/sums.md" in (ws.state / "runner.log").read_text()


def test_down_and_runner_with_none_running(ws):
    r = cli(ws, "down")
    assert r.returncode == 0 and r.stdout.strip() == "no runner is running"
    assert cli(ws, "runner").stdout.startswith("no runner is running")
    frame = cli(ws, "agents", "--once")
    assert "no runner" in frame.stdout and "no sessions yet" in frame.stdout
    bad = cli(ws, "tail", "nobody")
    assert bad.returncode == 1 and bad.stderr.startswith("error: no session")


def test_up_reports_a_runner_that_dies_at_start(ws):
    (ws.root / "primefs.yaml").write_text("limits: [not, a, mapping\n")  # the runner cannot start
    r = cli(ws, "up")
    assert r.returncode == 1 and "the runner exited at start" in r.stderr and "Traceback" not in r.stderr[-300:]
    assert not lock_held(ws)


def test_follow_streams_appends_and_waits_for_torn_lines(ws, scripted):
    from primefs.store.session import create_session

    s = create_session(ws.sessions, task="t", name="f", model="scripted/x")
    s.history.append("notice", text="first")
    out = io.StringIO()
    console = Console(file=out, width=120, highlight=False, color_system=None)
    stop = threading.Event()
    t = threading.Thread(target=follow, args=(s, console, stop), kwargs={"poll": 0.02})
    t.start()
    wait_for(lambda: "first" in out.getvalue(), 5, "existing event")
    line = json.dumps({"ts": time.time(), "type": "notice", "n": 1, "text": "second"}) + "\n"
    with open(s.dir / "history.jsonl", "a") as f:  # a writer caught mid-line
        f.write(line[:20])
        f.flush()
        time.sleep(0.2)
        assert "second" not in out.getvalue()
        f.write(line[20:])
    wait_for(lambda: "second" in out.getvalue(), 5, "completed line")
    s.history.append("notice", text="third")
    wait_for(lambda: "third" in out.getvalue(), 5, "new event")
    stop.set()
    t.join(5)
    text = out.getvalue()
    assert text.count(s.id) == 1  # the header once, not per batch
    assert text.index("first") < text.index("second") < text.index("third")
    # a reader starting at the end skips what is there, and a shrunk file is read on from its end
    r = HistoryReader(s.dir / "history.jsonl")
    r.seek_end()
    assert r.read() == []
    s.history.append("notice", text="fourth")
    assert [e["text"] for e in r.read()] == ["fourth"]


class Pty:
    """A process on a real pseudo-terminal; read() collects its output (ANSI codes removed)."""

    def __init__(self, argv, env):
        self.master, slave = os.openpty()
        self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env,
                                     start_new_session=True, close_fds=True)
        os.close(slave)
        self.out = b""

    def expect(self, needle: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = ANSI.sub(b"", self.out).decode("utf-8", "replace")
            if needle in text:
                return text
            ready, _, _ = select.select([self.master], [], [], 0.2)
            if ready:
                try:
                    self.out += os.read(self.master, 65536)
                except OSError:  # EIO: the process closed the terminal
                    time.sleep(0.05)
        raise AssertionError(f"{needle!r} not seen; output so far:\n{ANSI.sub(b'', self.out).decode(errors='replace')}")

    def drain(self) -> str:
        """Everything written so far, once the process has exited."""
        while True:
            ready, _, _ = select.select([self.master], [], [], 0.2)
            if not ready:
                break
            try:
                chunk = os.read(self.master, 65536)
            except OSError:
                break
            if not chunk:
                break
            self.out += chunk
        return ANSI.sub(b"", self.out).decode("utf-8", "replace")

    def send(self, data: bytes) -> None:
        os.write(self.master, data)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        os.close(self.master)


def test_attach_through_a_terminal(ws, scripted, daemon_cleanup):
    ws = scripted('- text: "first answer"\n- code: "print(6 * 7)"\n- text: "second answer"\n')
    s = answered_under_a_runner(ws, "talk", "hello\n", "first answer")
    env = {**os.environ, "COLUMNS": "120", "TERM": "xterm"}
    env.pop("PRIMEFS_WORKSPACE", None)
    term = Pty([*PRIMEFS, "attach", "talk", "-w", str(ws.root)], env)
    try:
        term.expect("Ctrl-D or Ctrl-C detaches")
        term.expect("first answer")  # recent history first
        term.send(b"please continue\n")
        text = term.expect("second answer")  # the new turn streams back to the terminal
        assert "user from user" in text and "42" in text
        msgs = s.events("message")
        assert [(m["from"], m["kind"], m["text"]) for m in msgs] == [("user", "user", "please continue")]
        assert os.listdir(s.mail / "new") == [] and len(os.listdir(s.mail / "cur")) == 1
        wait_for(lambda: s.reload()["status"] == "idle", what="the turn ended")  # what detach then says
        term.send(b"\x04")  # Ctrl-D on an empty line: end of input
        term.expect("detached; talk is idle; a message (primefs send) starts its next turn", 10)
        assert term.proc.wait(10) == 0
    finally:
        term.close()
    wait_for(lambda: s.reload()["status"] == "idle", what="idle again")
    # (a turn's status is set before its turn_end is appended: the event records it)
    wait_for(lambda: len(s.events("turn_end")) == 2, what="the second turn's end")
    assert s.read_result() == "second answer"
    assert cli(ws, "down").returncode == 0
    assert not lock_held(ws)


def test_attach_without_runner_and_ctrl_c_and_live_agents(ws, scripted):
    from primefs.store.session import create_session

    ws = scripted("- text: hi\n")
    s = create_session(ws.sessions, task="t", name="quiet", model="scripted/script.yaml")
    env = {**os.environ, "COLUMNS": "120", "TERM": "xterm"}
    env.pop("PRIMEFS_WORKSPACE", None)
    term = Pty([*PRIMEFS, "attach", "quiet", "-w", str(ws.root)], env)
    try:
        term.expect("no runner is running")
        term.send(b"kept for later\n")
        wait_for(lambda: os.listdir(s.mail / "new"), 10, "mail delivered")
        term.proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
        term.expect("detached; quiet is pending; no runner is running (primefs up starts one)", 10)
        assert term.proc.wait(10) == 0
        assert "Traceback" not in term.drain()
    finally:
        term.close()
    [path] = (s.mail / "new").iterdir()
    assert "kind: user" in path.read_text() and "kept for later" in path.read_text()
    # the live agents view refreshes until Ctrl-C
    term = Pty([*PRIMEFS, "agents", "--interval", "0.2", "-w", str(ws.root)], env)
    try:
        term.expect("quiet")
        term.proc.send_signal(signal.SIGINT)
        assert term.proc.wait(10) == 0
        assert "Traceback" not in term.drain()
    finally:
        term.close()


def test_the_runners_log_is_kept_small_while_it_runs_for_months(ws, monkeypatch):
    """A runner started by `up` writes its output to .primefs/runner.log, a line or two a turn for as long
    as it runs: past LOG_MAX_BYTES the file becomes runner.log.1 and a new one is begun, no line lost
    between the two. Here a real process whose output is runner.log, with a small limit, writing its lines
    as the runner does (its console: a line in one write; print()'s text and newline are two writes with
    PYTHONUNBUFFERED, which `up` sets, and a rotation between them would cut the line)."""
    import sys

    from primefs.cli import daemon

    script = (f"import time\nfrom primefs.cli import daemon\nfrom primefs.store.workspace import Workspace\n"
              "from primefs.views.console import err\n"
              f"daemon.LOG_MAX_BYTES, daemon.LOG_LOOK_S = 20_000, 0.02\n"
              f"assert daemon.keep_log_small(Workspace({str(ws.root)!r}))\n"
              "log = err()\n"
              "for i in range(5000):\n    log.print(f'line {i}', soft_wrap=True)\n"
              "    time.sleep(0.0005 if i % 50 else 0.03)\n"
              "time.sleep(0.2)\n")
    ws.state.mkdir(exist_ok=True)
    log = daemon.log_path(ws)
    with open(log, "ab") as f:
        subprocess.run([sys.executable, "-c", script], stdout=f, stderr=subprocess.STDOUT, check=True, timeout=120)
    old, new = log.with_name("runner.log.1").read_text().splitlines(), log.read_text().splitlines()
    assert old and new and len(old) + len(new) < 5000  # rotated more than once: the oldest lines dropped
    assert log.stat().st_size < 20_000 + 5_000 and new[-1] == "line 4999"
    first = int(old[0].split()[1])
    assert old + new == [f"line {i}" for i in range(first, 5000)]
    # a process whose output is something else (this one's) leaves runner.log alone; `up` rotates it first
    assert not daemon.keep_log_small(ws)
    monkeypatch.setattr(daemon, "LOG_MAX_BYTES", 10)
    assert daemon.rotate_log(ws) and not log.exists() and log.with_name("runner.log.1").read_text().endswith("line 4999\n")
