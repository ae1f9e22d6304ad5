"""The agent loop end to end: goal file -> runner -> litellm over HTTP -> real kernel -> files."""
from __future__ import annotations

import json
import subprocess

import pytest
from conftest import configure, run_once, use_server

from primefs.store.goals import write_goal
from primefs.store.session import list_sessions


def only_session(ws):
    sessions = list_sessions(ws.sessions)
    assert len(sessions) == 1
    return sessions[0]


@pytest.mark.parametrize("stream", [False, True])
def test_native_tool_calls_run_in_a_persistent_kernel(ws, server, stream):
    server.set_script([{"code": "x = 6 * 7\nprint('x is', x)"}, {"code": "x + 1"}, {"text": "The answer is 43."}])
    ws = use_server(ws, server, stream=stream)
    write_goal(ws, "Compute something", name="calc")
    run_once(ws)
    s = only_session(ws)
    assert s.meta["name"] == "calc" and s.meta["goal"] == "goals/calc.md"
    assert s.status == "idle"
    assert s.read_result() == "The answer is 43."
    cells = s.events("cell")
    assert [c["output"] for c in cells] == ["x is 42\n", "43\n"]  # the variable survived between cells
    # the model saw the outputs as tool messages answering its calls
    last = server.requests[-1]["messages"]
    tool_msgs = [m for m in last if m["role"] == "tool"]
    assert [m["content"] for m in tool_msgs] == ["x is 42\n", "43\n"]
    assert last[0]["role"] == "system" and last[1] == {"role": "user", "content": "Compute something"}
    assert server.requests[0]["tools"][0]["function"]["name"] == "python"
    # every call recorded with the usage the server reported
    calls = s.events("model_call")
    assert [(c["input_tokens"], c["output_tokens"]) for c in calls] == \
        [(u["prompt_tokens"], u["completion_tokens"]) for u in server.usages]
    assert all(c["cost_usd"] == 0 and not c["cost_known"] for c in calls)  # litellm has no price for test-model
    types = [e["type"] for e in s.events()]
    assert types[:3] == ["task", "status", "turn_start"]
    assert "result" in types and types[-1] == "turn_end"


def test_fenced_mode_runs_python_fences(ws, server):
    server.set_script([{"text": "Let me look.", "code": "print(sum(range(10)))"}, {"text": "45"}])
    ws = use_server(ws, server, tool_mode="fenced")
    write_goal(ws, "Sum 0..9", name="sum")
    run_once(ws)
    s = only_session(ws)
    assert s.read_result() == "45"
    assert "tools" not in server.requests[0]
    second = server.requests[1]["messages"]
    assert second[-2]["role"] == "assistant" and "```python" in second[-2]["content"]
    assert second[-1] == {"role": "user", "content": "Output:\n45\n"}


def test_context_files_are_variables_never_prompt_text(ws, server):
    (ws.root / "data").mkdir()
    (ws.root / "data" / "a.txt").write_text("SECRET-NEEDLE " * 1000)
    (ws.root / "data" / "b.txt").write_text("bee")
    server.set_script({"rules": [
        {"match": "one file", "replies": [{"code": "print(type(context).__name__, len(context))"}, {"text": "ok"}]},
        {"match": "two files", "replies": [{"code": "print(sorted(context), context['data/b.txt'])"},
                                           {"text": "ok"}]},
        {"match": "no file", "replies": [{"code": "print(context)"}, {"text": "ok"}]}]})
    ws = use_server(ws, server)
    write_goal(ws, "one file", name="one", context=[str(ws.root / "data/a.txt")])
    write_goal(ws, "two files", name="two", context=[str(ws.root / "data/a.txt"), str(ws.root / "data/b.txt")])
    write_goal(ws, "no file", name="none")
    run_once(ws)
    outputs = {s.name: s.events("cell")[0]["output"] for s in list_sessions(ws.sessions)}
    assert outputs == {"one": "str 14000\n", "two": "['data/a.txt', 'data/b.txt'] bee\n", "none": "None\n"}
    for req in server.requests:
        assert "SECRET-NEEDLE" not in json.dumps(req)
    systems = {r["messages"][1]["content"]: r["messages"][0]["content"] for r in server.requests}
    assert "str of about 14,000 characters" in systems["one file"]
    assert "dict of 2 files" in systems["two files"] and "None: this task has no input data" in systems["no file"]


def test_done_ends_the_loop_without_another_model_call(ws, server):
    server.set_script([{"code": "done('forty-two')"}, {"text": "never asked"}])
    ws = use_server(ws, server)
    write_goal(ws, "finish", name="fin")
    run_once(ws)
    s = only_session(ws)
    assert s.status == "done" and s.read_result() == "forty-two"
    assert len(server.requests) == 1


def test_llm_helper_is_a_sub_call_accounted_to_the_session(ws, server):
    server.set_script({"rules": [
        {"match": "^Classify", "replies": [{"text": "positive", "usage": {"input_tokens": 11, "output_tokens": 3}}]},
        {"replies": [{"code": "r = llm('Classify: I love it')\nprint(r)"}, {"text": "done"}]}]})
    ws = use_server(ws, server)
    write_goal(ws, "use llm", name="sub")
    run_once(ws)
    s = only_session(ws)
    assert s.events("cell")[0]["output"] == "positive\n"
    calls = s.events("model_call")
    assert [c["purpose"] for c in calls] == ["turn", "llm", "turn"]
    assert calls[1]["input_tokens"] == 11 and calls[1]["output_tokens"] == 3
    sub_request = server.requests[1]
    assert sub_request["messages"] == [{"role": "user", "content": "Classify: I love it"}]
    assert "tools" not in sub_request


def test_long_output_is_cut_keeping_head_and_tail(ws, server):
    server.set_script([{"code": "print('A' * 5000 + 'B' * 5000)"}, {"text": "ok"}])
    ws = use_server(ws, server, limits={"output_chars": 1000})
    write_goal(ws, "print a lot", name="big")
    run_once(ws)
    shown = only_session(ws).events("cell")[0]["shown"]
    assert shown.startswith("A" * 600) and shown.rstrip().endswith("B" * 300)
    assert "[9001 characters cut]" in shown
    assert len(shown) < 1100


def test_cell_timeout_interrupts_and_kernel_stays_usable(ws, server):
    server.set_script([{"code": "y = 5\nimport time\ntime.sleep(30)"}, {"code": "print(y)"}, {"text": "ok"}])
    ws = use_server(ws, server, limits={"cell_timeout_s": 1})
    write_goal(ws, "sleep", name="slow")
    run_once(ws)
    first, second = only_session(ws).events("cell")
    assert first["timed_out"] and "interrupted" in first["shown"] and "KeyboardInterrupt" in first["shown"]
    assert second["output"] == "5\n" and not second["timed_out"]


def test_dead_kernel_is_restarted_and_the_model_is_told(ws, server):
    server.set_script([{"code": "z = 1"}, {"code": "import os\nos._exit(3)"}, {"code": "print('z' in dir())"},
                       {"text": "ok"}])
    ws = use_server(ws, server)
    write_goal(ws, "crash", name="crash")
    run_once(ws)
    s = only_session(ws)
    cells = s.events("cell")
    assert cells[1]["restarted"] and "variables are gone" in cells[1]["shown"]
    assert cells[2]["output"] == "False\n"
    assert s.read_result() == "ok"


def test_model_errors_are_retried_then_fail_the_session(ws, server):
    server.set_script([{"text": "fine"}])
    ws = use_server(ws, server, limits={"model_retries": 2})
    server.fail_next(2, 503)
    write_goal(ws, "flaky", name="flaky")
    run_once(ws)
    s = only_session(ws)
    assert s.read_result() == "fine" and len(s.events("model_error")) == 2
    server.fail_next(3, 500)
    write_goal(ws, "broken", name="broken")
    run_once(ws)
    broken = [x for x in list_sessions(ws.sessions) if x.name == "broken"][0]
    assert broken.status == "failed" and broken.meta["stop_reason"] == "error"
    assert "500" in broken.meta["error"] or "InternalServerError" in broken.meta["error"]
    assert len(broken.events("model_error")) == 3 and broken.events("error")


def test_connection_refused_fails_with_the_error(ws):
    ws = configure(ws, model="dead", models={"dead": {"model": "openai/x", "api_base": "http://127.0.0.1:9/v1",
                                                      "api_key": "k"}},
                   limits={"model_retries": 1, "model_retry_backoff_s": 0.01})
    write_goal(ws, "anything", name="dead")
    run_once(ws)
    s = only_session(ws)
    assert s.status == "failed" and "Connection" in s.meta["error"]


def test_step_limit_ends_the_turn_without_claiming_success(ws, server):
    server.set_script([{"code": "1"}] * 10)
    ws = use_server(ws, server, limits={"max_steps_per_turn": 3})
    write_goal(ws, "loop forever", name="loop")
    run_once(ws)
    s = only_session(ws)
    assert len(server.requests) == 3
    assert s.meta["stop_reason"] == "max_steps" and s.read_result() is None


def test_scripted_provider_without_http(ws):
    (ws.root / "script.yaml").write_text("- code: print('hi')\n- text: bye\n")
    ws = configure(ws, model="scripted/script.yaml")
    write_goal(ws, "hello", name="s")
    run_once(ws)
    s = only_session(ws)
    assert s.read_result() == "bye" and s.events("cell")[0]["output"] == "hi\n"
    assert s.events("model_call")[0]["input_tokens"] > 0


def test_turn_boundaries_are_committed(ws, server):
    server.set_script([{"text": "ok"}])
    ws = use_server(ws, server)
    write_goal(ws, "commit me", name="c")
    run_once(ws)
    s = only_session(ws)
    tracked = subprocess.run(["git", "-C", str(ws.root), "ls-files"], capture_output=True, text=True).stdout
    assert f"sessions/{s.id}/history.jsonl" in tracked and f"sessions/{s.id}/result.md" in tracked
    assert "goals/c.md" in tracked
    status = subprocess.run(["git", "-C", str(ws.root), "status", "--porcelain", "sessions"],
                            capture_output=True, text=True).stdout
    assert status == ""
    # the subject names the session (name, id's tail) and its goal; the body has a line per path
    subject, _, body = subprocess.run(["git", "-C", str(ws.root), "log", "-1", "--format=%B"], capture_output=True,
                                      text=True).stdout.partition("\n\n")
    assert subject == f"turn 1 idle: c ({s.id.rsplit('-', 1)[-1]}), goal c"
    assert body.split("\n")[:2] == [f"goals/c.md: session {s.id} (c): turn 1 idle",
                                     f"sessions/{s.id}: session {s.id} (c): turn 1 idle"]


def test_coalesced_turn_commits_name_their_sessions(ws):
    import time

    from primefs.store.gitops import Committer, Mark, commit_lock, subject_for

    def subjects(n):
        return subprocess.run(["git", "-C", str(ws.root), "log", f"-{n}", "--format=%s"], capture_output=True,
                              text=True).stdout.splitlines()

    names = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"]
    committer = Committer(ws.root)
    with commit_lock(ws.root):  # the committer waits for it: what comes meanwhile is one commit
        for i, name in enumerate(["first", *names]):
            (ws.sessions / f"s-{i}").mkdir()
            (ws.sessions / f"s-{i}" / "f.txt").write_text(name)
            committer.request(f"sessions/s-{i}", f"session s-{i} ({name}): turn 1 idle",
                              Mark(f"s-{i}", name, "turn 1 idle", f"goals/{name}.md"))
            if i == 0:
                while committer._pending:  # taken: "first" is committed alone, once the lock is free
                    time.sleep(0.01)
    committer.close()
    many, one = subjects(2)
    assert one == "turn 1 idle: first (0), goal first"
    assert many.startswith("turn 1 idle: 10 sessions: alpha, beta, delta, ") and many.endswith(" more")
    assert len(many) <= 72 and int(many.split("+")[1].split()[0]) == 10 - many.count(",") - 1
    # different outcomes: "turn end"; a name too long for the subject is cut
    assert subject_for([Mark("x-a", "a", "turn 1 idle"), Mark("x-b", "b", "turn 2 failed")], []) == \
        "turn end: 2 sessions: a, b"
    long = subject_for([Mark("x-abc", "n" * 64, "turn 12 interrupted", "goals/" + "g" * 64 + ".md")], [])
    assert len(long) == 72 and long.startswith("turn 12 interrupted: nnn") and long.endswith("...")
    assert subject_for([Mark("x-abc", "demo", "direct call")], []) == "direct call: demo (abc)"


def two_timed_commits(ws, monkeypatch, first_takes_s: float = 0.0) -> list[tuple[float, float]]:
    """Two sessions' turns committed by a Committer one after the other: (start, end) of each commit
    (the first made `first_takes_s` slower, as git is in a big workspace)."""
    import threading
    import time

    from primefs.store import gitops

    calls, committed = [], [threading.Event(), threading.Event()]
    real = gitops.commit_paths

    def timed(root, paths, message):
        start = time.monotonic()
        if not calls:
            time.sleep(first_takes_s)
        result = real(root, paths, message)
        calls.append((start, time.monotonic()))
        committed[len(calls) - 1].set()
        return result

    monkeypatch.setattr(gitops, "commit_paths", timed)
    committer = gitops.Committer(ws.root)
    for i in range(2):
        (ws.sessions / f"s-{i}").mkdir()
        (ws.sessions / f"s-{i}" / "f.txt").write_text("x")
        committer.request(f"sessions/s-{i}", f"session s-{i}: turn 1 idle")
        assert committed[i].wait(30)
    committer.close()
    return calls


def test_the_next_commit_waits_longer_after_a_slow_one(ws, monkeypatch):
    """In a big workspace a commit is slow (every git process reads the whole index): the committer then
    waits SHARE times as long as it took before the next, so git takes a part of a core, not all of it."""
    from primefs.store import gitops

    (first_start, first_end), (second_start, _) = two_timed_commits(ws, monkeypatch, first_takes_s=0.3)
    assert second_start - first_end >= gitops.Committer.SHARE * (first_end - first_start) - 0.01


def test_gits_upkeep_is_not_paced_like_a_commit(ws, monkeypatch):
    """Packing loose objects (every GC_EVERY commits) can take minutes: it delays the next commit by its own
    time, not SHARE times it (a 14-minute repack held commits 42 minutes more)."""
    import time

    from primefs.store import gitops

    packs = []

    def slow_pack(root):
        start = time.monotonic()
        time.sleep(2)  # as a repack of a big history takes
        packs.append((start, time.monotonic()))

    monkeypatch.setattr(gitops, "pack_loose", slow_pack)
    monkeypatch.setattr(gitops.Committer, "GC_EVERY", 1)
    (first_start, first_end), (second_start, _) = two_timed_commits(ws, monkeypatch)
    pack_start, pack_end = packs[0]
    assert first_end <= pack_start and pack_end <= second_start
    wait = second_start - pack_end  # SHARE times the commit's time (or EVERY_S), not times the pack's
    assert wait <= max(gitops.Committer.EVERY_S, gitops.Committer.SHARE * (first_end - first_start)) + 1, wait


def test_a_turn_going_round_in_circles_is_told_then_stopped(ws, server):
    """The same cell again and again (loop_repeat 4): a notice at the 4th, the stop 2 cells later, saying
    what repeated; the model saw the notice; an autonomous goal takes no more turns."""
    ws = use_server(ws, server)
    server.set_script([{"code": "print('still nothing')"}] * 10 + [{"text": "never"}])
    write_goal(ws, "Spin", extra={"autonomous": True})
    run_once(ws)
    s = only_session(ws)
    meta = s.reload()
    assert meta["status"] == "idle" and meta["stop_reason"] == "loop"
    assert "stopped as a loop: the same cell ran 6 times in a row" in meta["error"]
    types = [e["type"] for e in s.events()]
    assert types.count("cell") == 6 and types.count("turn_start") == 1 and s.read_result() is None
    [notice] = [e for e in s.events("notice")]
    assert "the same cell ran 4 times in a row" in notice["text"]
    assert "the same cell ran 4 times in a row" in json.dumps(server.requests[4])  # told before its 5th call
    assert [e["outcome"] for e in s.events("turn_end")] == ["loop"]


def test_loop_limits_are_settings_and_zero_turns_them_off(ws, server):
    ws = use_server(ws, server, limits={"loop_repeat": 0, "loop_window": 0})
    server.set_script([{"code": "x = 1"}] * 20 + [{"text": "fine"}])
    write_goal(ws, "Spin on")
    run_once(ws)
    s = only_session(ws)
    assert s.read_result() == "fine" and not s.events("notice")
