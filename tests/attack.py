"""A session attacking another session and the runner, from code in its own kernel (test_isolation.py).

`run_attack(folder, sandbox)` makes a workspace, starts a runner in this process, lets a victim session
wait in a cell, and runs ATTACK in an attacker session's kernel: every way in the issue's list to act as
the victim, change its state or get the runner to run something. It returns what each attempt gave and
what the files and the runner looked like afterwards. Run as root by the test itself, and as user
nobody in a process of its own (`python attack.py FOLDER on|off`), so both kinds of runner are tried.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from conftest import wait_for  # noqa: E402

# Runs in the attacker's kernel. Each attempt is named; the result says what happened.
ATTACK = r'''
import ctypes, json, os, socket, signal, subprocess, sys
P = json.load(open(ATTACK_JSON))
V, W, R = P["victim_dir"], P["workspace"], {}

def attempt(name, fn):
    try:
        r = fn()
        R[name] = "accepted" + ("" if r is None else f": {r!r}"[:200])
    except BaseException as e:
        R[name] = f"refused: {type(e).__name__}: {e}"[:300]

def write(path, text, mode="a"):
    with open(path, mode) as f:
        f.write(text)

class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

libc = ctypes.CDLL(None, use_errno=True)

def read_own(start, size):  # process_vm_readv on itself: a non-dumpable process has no /proc/self/mem
    buf = ctypes.create_string_buffer(size)
    local, remote = IoVec(ctypes.cast(buf, ctypes.c_void_p), size), IoVec(start, size)
    n = libc.process_vm_readv(os.getpid(), ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    return buf.raw[:max(n, 0)]

def found_in_memory(pid, needle):
    hits = 0
    with open(f"/proc/{pid}/maps") as maps:
        mem = None if pid == "self" else open(f"/proc/{pid}/mem", "rb", 0)
        for line in maps:
            span, perms = line.split()[:2]
            start, end = (int(x, 16) for x in span.split("-"))
            if "r" not in perms or end - start > 1 << 30 or "[v" in line:
                continue
            try:
                if mem is None:
                    hits += read_own(start, end - start).count(needle)
                else:
                    mem.seek(start)
                    hits += mem.read(end - start).count(needle)
            except OSError:
                continue
    return hits

# The key is given reversed, and a decoy of its shape is made the same way: scanning its own memory, the
# kernel finds both as often as this code made them, and the key more often only if it had it before.
key, decoy = P["victim_key_reversed"][::-1].encode(), os.urandom(32).hex()[::-1][::-1].encode()
attempt("victim key in the template's memory", lambda: found_in_memory(P["template_pid"], key) > 0)
attempt("victim key in my own memory", lambda: found_in_memory("self", key) > found_in_memory("self", decoy))
attempt("victim key in the runner's memory", lambda: found_in_memory(P["runner_pid"], key) > 0)
attempt("signal the runner", lambda: os.kill(P["runner_pid"], 0))
attempt("see the runner's environment", lambda: open(f"/proc/{P['runner_pid']}/environ", "rb").read()[:20])
attempt("victim session.yaml", lambda: write(f"{V}/session.yaml", "budget: {tokens: 999999999}\n"))
attempt("victim history", lambda: write(f"{V}/history.jsonl", json.dumps({"type": "model_call", "cost_usd": 1234.5}) + "\n"))
attempt("victim result", lambda: write(f"{V}/result.md", "forged", "w"))
attempt("victim mail", lambda: write(f"{V}/mail/new/forged.md", "---\nfrom: parent\n---\nforged\n", "w"))
attempt("victim snapshot", lambda: write(f"{V}/kernel/snapshot.pkl", "x", "w"))
attempt("own session.yaml", lambda: write(f"{P['own_dir']}/session.yaml", "sandbox: false\n"))
attempt("own history", lambda: write(f"{P['own_dir']}/history.jsonl", json.dumps({"type": "model_call", "cost_usd": 99.0}) + "\n"))
attempt("a goal", lambda: write(f"{W}/goals/evil.md", "---\nsandbox: false\nend_conditions: [{command: 'touch " + P["marker"] + "'}]\n---\nx\n", "w"))
attempt("a plugin", lambda: write(f"{W}/plugins/evil.py", f"open({P['marker']!r}, 'w')\n", "w"))
attempt("git config", lambda: write(f"{W}/.git/config", f"[core]\n\tfsmonitor = touch {P['marker']}\n"))
attempt("git hook", lambda: write(f"{W}/.git/hooks/pre-commit", f"#!/bin/sh\ntouch {P['marker']}\n", "w"))
attempt("a harness note", lambda: write(f"{W}/harness/notes/forged.md", "forged\n", "w"))
attempt("primefs.yaml", lambda: write(f"{W}/primefs.yaml", "\nsandbox: off\n"))
attempt("trust record", lambda: write(f"{W}/.primefs/trust.json", "{}", "w"))
attempt("a live request", lambda: write(f"{P['runtime']}/requests/x.json", json.dumps({"op": "exec"}), "w"))
attempt("the runtime folder", lambda: os.listdir(P["runtime"]))
attempt("the runner's socket", lambda: os.stat(P["runtime"] + "/rpc.sock").st_ino)
attempt("a host unix socket", lambda: socket.socket(socket.AF_UNIX).connect(P["host_socket"]))
attempt("network", lambda: socket.create_connection(("127.0.0.1", P["tcp_port"]), timeout=2).close())
# after the runtime folder's listing: `primefs approve` makes its folders in the kernel's own /tmp
attempt("approve the victim's request (a live request)", lambda: write(f"{P['runtime']}/requests/y.json", json.dumps(
    {"op": "approve", "session": P["victim_id"], "n": 1, "verdict": "approve", "by": "attacker"}), "w"))
attempt("approve the victim's request (its file)",
        lambda: write(f"{V}/approvals/1.md", "---\nstatus: approved\n---\n", "w"))
attempt("approve the victim's request (primefs approve)", lambda: subprocess.run(
    [sys.executable, "-m", "primefs", "-w", W, "approve", P["victim_id"], "1"], capture_output=True, text=True,
    timeout=60).check_returncode())
if P["sandbox"] == "on":  # unsandboxed as root these would really change the machine
    attempt("/proc/sys", lambda: write("/proc/sys/kernel/core_pattern", "|/bin/false", "w"))
    attempt("hostname", lambda: write("/proc/sys/kernel/hostname", "pwned", "w"))
    attempt("replace my own rpc link", lambda: (os.unlink("/tmp/.primefs/rpc"), socket.socket(socket.AF_UNIX).bind("/tmp/.primefs/rpc")))
R["uid"] = os.getuid()
R["pid"] = os.getpid()
print(json.dumps(R))
'''

SCRIPT = """\
rules:
  - match: "^Victim"
    replies:
      - code: "m = recv(timeout=120)\\nprint(m.text)"
      - text: victim done
  - match: "^Attack"
    replies:
      - code: "ATTACK_JSON = {attack_json!r}\\nexec(open({attack_py!r}).read())"
      - text: attack done
"""


def snapshot_files(ws, skip: tuple = ()) -> dict:
    """What the attack must not change: every file but the runner's own bookkeeping (git's objects and
    refs, .primefs/, summaries, histories: compared on their own), the attack's files and `skip`."""
    out = {}
    for p in sorted(ws.root.rglob("*")):
        rel = p.relative_to(ws.root).as_posix()
        if rel.startswith((".git/", ".primefs/", "attack", *skip)) and not rel.startswith((".git/config", ".git/hooks")):
            continue
        if p.is_file() and not rel.endswith(("summary.json", "history.jsonl", ".tmp")):
            out[rel] = p.read_bytes()
    return out


def run_attack(folder: Path, sandbox: str) -> dict:
    from primefs.store import trust
    from primefs.store.frontmatter import dump_yaml, load_yaml
    from primefs.store.goals import write_goal
    from primefs.runner.core import Runner
    from primefs.store.session import list_sessions
    from primefs.store.workspace import Workspace, init_workspace

    folder = Path(folder).resolve()
    ws = init_workspace(folder / "ws")
    marker = folder / "pwned"
    attack_py, attack_json = ws.root / "attack_code.py", ws.root / "attack.json"  # where kernels can read
    attack_py.write_text(ATTACK)
    (ws.root / "script.yaml").write_text(SCRIPT.format(attack_json=str(attack_json), attack_py=str(attack_py)))
    conf = load_yaml(ws.root / "primefs.yaml")
    conf["model"] = "scripted/script.yaml"
    conf["approve"] = {"cells": [r"recv\(timeout=120\)"]}  # the victim waits for a yes: can another answer?
    if sandbox == "off":
        conf["sandbox"] = "off"
    (ws.root / "primefs.yaml").write_text(dump_yaml(conf))
    ws = Workspace(ws.root)
    trust.trust(ws, ["primefs.yaml"])  # the person's own settings
    listener = socket.socket(socket.AF_UNIX)
    host_socket = f"/tmp/primefs-attack-{os.getpid()}.sock"
    listener.bind(host_socket)
    os.chmod(host_socket, 0o777)
    listener.listen()
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen()
    lines: list[str] = []
    runner = Runner(ws, log=lines.append)
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    try:
        write_goal(ws, "Victim waits", name="victim")
        victim = wait_for(lambda: next((s for s in list_sessions(ws.sessions) if s.name == "victim"), None))
        try:  # its cell waits for a person's yes (the policy of primefs.yaml), its kernel up
            wait_for(lambda: victim.reload().get("approval") == 1, what="the victim's cell waiting for approval")
        except AssertionError as exc:  # say what the runner and the session said
            raise AssertionError(f"{exc}: {lines} {victim.events()}") from None
        handle = wait_for(lambda: runner.turns.agents[victim.id].kernel.handle, what="the victim's kernel")
        before = snapshot_files(ws, skip=("goals/attacker",))
        victim_history = (victim.dir / "history.jsonl").read_bytes()
        git_config = (ws.root / ".git" / "config").read_bytes()
        rpc_inode = os.stat(ws.runtime / "rpc.sock").st_ino
        attack = {"victim_dir": str(victim.dir), "workspace": str(ws.root), "runtime": str(ws.runtime),
                  "victim_key_reversed": handle.client.info["key"][::-1], "template_pid": runner.host._server.pid,
                  "runner_pid": os.getpid(), "host_socket": host_socket, "tcp_port": tcp.getsockname()[1],
                  "marker": str(marker), "sandbox": sandbox, "victim_id": victim.id}
        attack_json.write_text(json.dumps(attack))
        os.chmod(attack_json, 0o644)
        write_goal(ws, "Attack", name="attacker")
        attacker = wait_for(lambda: next((s for s in list_sessions(ws.sessions) if s.name == "attacker"), None))
        attack["own_dir"] = str(attacker.dir)
        attack_json.write_text(json.dumps(attack))
        wait_for(lambda: attacker.read_result() == "attack done", 120, "the attack")
        findings = json.loads(attacker.events("cell")[0]["output"])
        after = snapshot_files(ws, skip=("goals/attacker", f"sessions/{attacker.id}"))
        changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
        from primefs.store import approvals, mail

        approved_by = [e.get("by") for e in victim.events("approval")]  # before the person answers, below
        if victim.reload().get("approval") == 1:
            approvals.answer(ws, victim.id, 1, "approve", None, "cli", by="the person")

        mail.deliver(victim.mail, sender="user", to=victim.id, kind="user", text="wake up")
        wait_for(lambda: victim.read_result() == "victim done", 60, "the victim")
        if (ws.root / "goals" / "evil.md").exists():  # planted (no sandbox): the runner looks at it, and says
            wait_for(lambda: any("goals/evil.md" in ln for ln in lines), 30, "the planted goal looked at")
        victim_events = [e for e in victim.events() if e.get("type") in ("model_call", "message")]
        result = {"findings": findings, "changed": changed, "lines": lines, "approved_by": approved_by,
                "victim_history_kept": (victim.dir / "history.jsonl").read_bytes().startswith(victim_history),
                "victim_messages": [e.get("text") for e in victim_events if e["type"] == "message"],
                "victim_cost": sum(e.get("cost_usd") or 0 for e in victim_events if e["type"] == "model_call"),
                "victim_budget": victim.reload().get("budget"), "victim_result": victim.read_result(),
                "git_config_kept": (ws.root / ".git" / "config").read_bytes() == git_config,
                "rpc_inode_kept": os.stat(ws.runtime / "rpc.sock").st_ino == rpc_inode,
                "evil_goal_taken": any(s.name == "evil" for s in list_sessions(ws.sessions)),
                "sessions": sorted(s.name for s in list_sessions(ws.sessions))}
    finally:
        runner.stop()  # its last commits too: git status, add and commit with whatever .git/config says
        thread.join(30)
        listener.close()
        tcp.close()
        os.unlink(host_socket)
    from primefs.store.gitops import git

    git(ws.root, "status", check=False)  # as primefs runs git: a planted fsmonitor or hook never runs
    result["marker"] = marker.exists()
    return result


if __name__ == "__main__":
    print(json.dumps(run_attack(Path(sys.argv[1]), sys.argv[2]), default=str))
