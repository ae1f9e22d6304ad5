"""The Python API (docs/python-api.md) on real workspaces, runners and kernels: `primefs.Workspace`,
`SessionHandle`, the async twins (in a real Jupyter kernel's running loop), the rlms-style `primefs.RLM`."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import cli, configure, use_server

import primefs
from primefs.api import local
from primefs.index.accounting import UsageIndex
from primefs.store.control import lock_held

SPAWN = ('rules:\n'
         '  - match: "count the words"\n'
         '    replies:\n'
         '      - code: "h = rlm(\'count it\', context=context[\'text\'])\\nprint(h.wait(60))"\n'
         '      - text: "two words"\n'
         '  - match: "count it"\n'
         '    replies:\n'
         '      - code: "print(len(context.split()))"\n'
         '      - text: "2"\n'
         'default:\n' + '  - text: ok\n' * 4)


@pytest.fixture
def api(ws, scripted):
    scripted(SPAWN)
    w = primefs.Workspace(ws.root)
    yield w
    w.close()


def test_ask_answers_with_its_tree_usage_and_a_context_value_kept_out_of_prompts(ws, api, server):
    use_server(ws, server)
    server.set_script([{"code": "print(sorted(context))"}, {"text": "the keys are a and text"}])
    secret = "PAYLOAD-" + "x" * 5000
    r = api.ask("name the keys", context={"a": 1, "text": secret}, model="fake")
    assert r.answer == "the keys are a and text" and r.status == "idle" and r.stop_reason == "answered" and r.ok
    s = api.session(r.session_id)
    assert s.name == r.name and s.path.name == r.session_id
    assert json.loads((s.path / "context.json").read_text()) == {"a": 1, "text": secret}  # written once, a file
    assert not any(secret in json.dumps(req) for req in server.requests)  # never in a prompt
    assert "['a', 'text']" in json.dumps(server.requests[-1])  # the kernel had it as `context`
    assert r.usage == UsageIndex(ws.sessions, root=r.session_id).tree(r.session_id) and r.usage["calls"] == 2
    assert r.usage["input_tokens"] == sum(u["prompt_tokens"] for u in server.usages)
    goal = s.session.meta["goal"]
    assert (ws.root / goal).is_file() and "context_data:" in (ws.root / goal).read_text()


def test_events_carry_a_reply_as_it_streams(ws, api, server):
    use_server(ws, server, stream=True)
    server.set_script([{"text": "a streamed answer of several pieces"}])
    server.stall = 0.5  # the reply pauses after its first piece: it is seen while it streams
    h = api.submit("anything", model="fake")
    events = list(h.events())
    deltas = [e for e in events if e["type"] == "delta"]
    [reply] = [e for e in events if e["type"] == "assistant"]
    assert deltas and events.index(deltas[-1]) < events.index(reply)
    assert "".join(d["text"] for d in deltas) in reply["text"] and h.result.answer == reply["text"]


def test_tree_usage_counts_the_children_and_files_are_context(ws, api):
    (ws.root / "notes.txt").write_text("hello world")
    r = api.ask("count the words", context={"text": "hello world"})
    assert r.answer == "two words"
    rows = UsageIndex(ws.sessions)
    [child] = [sid for sid, e in rows.sessions.items() if e.meta.get("parent") == r.session_id]
    assert r.usage["calls"] == 4 == rows.own[r.session_id]["calls"] + rows.own[child]["calls"]
    assert api.session(r.session_id).usage(tree=False)["calls"] == 2
    file_run = api.ask("count it", context=Path("notes.txt"))
    assert file_run.answer == "2" and api.session(file_run.session_id).session.meta["context"] == ["notes.txt"]


def test_submit_events_send_and_stop(ws, api):
    h = api.submit("anything", name="chat")
    assert isinstance(h, primefs.SessionHandle) and h.name == "chat"
    types = [e["type"] for e in h.events()]
    assert types[0] == "task" and types[-1] == "turn_end" and "assistant" in types
    assert h.result.answer == "ok" and h.ended
    follow_up = h.events(from_start=False)  # opened before the mail: the new turn is seen from its start
    h.send("and again")
    later = list(follow_up)
    assert any(e["type"] == "message" and "and again" in e.get("text", "") for e in later)
    assert h.wait(30).answer == "ok" and len([e for e in h.events() if e["type"] == "turn_end"]) == 2
    h.stop()
    assert h.wait(30).status == "stopped"
    assert [s.name for s in api.sessions()] == ["chat"] and api.session("chat").id == h.id


def test_a_resident_runner_does_the_work(ws, api, daemon_cleanup):
    assert cli(ws, "up").returncode == 0
    r = api.ask("anything")
    assert r.answer == "ok" and local.current(api._ws) is None  # no runner was started in this process
    assert cli(ws, "down").returncode == 0


def test_the_async_twins(ws, api):
    async def main():
        r = await api.aask("anything")
        h = await api.asubmit("count the words", context={"text": "a b"})
        types = [e["type"] async for e in h.aevents()]
        return r, h, types, await h.await_result(30)

    r, h, types, result = asyncio.run(main())
    assert r.answer == "ok" and "spawn" in types and result.answer == "two words"


def test_the_async_twins_in_a_jupyter_notebooks_running_loop(ws, api, tmp_path):
    """A real ipykernel (as a notebook runs): top-level await in its running event loop."""
    from jupyter_client import KernelManager

    km = KernelManager(kernel_name="python3")
    km.kernel_cmd = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    km.start_kernel(cwd=str(tmp_path), env={**__import__("os").environ})
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        code = textwrap.dedent(f"""
            import primefs
            ws = primefs.Workspace({str(ws.root)!r})
            r = await ws.aask("anything")
            h = await ws.asubmit("count the words", context={{"text": "a b"}})
            seen = [e["type"] async for e in h.aevents()]
            print("ANSWERS", r.answer, (await h.await_result()).answer, "spawn" in seen)
            ws.close()
        """)
        out = []
        msg_id = kc.execute(code)
        while True:
            msg = kc.get_iopub_msg(timeout=120)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            elif msg["msg_type"] == "error":
                raise AssertionError("\n".join(msg["content"]["traceback"]))
            elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
        assert "ANSWERS ok two words True" in "".join(out)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_bad_input_is_a_clear_exception_and_writes_nothing(ws, api, tmp_path):
    with pytest.raises(primefs.PrimefsError, match="no primefs workspace"):
        primefs.Workspace(tmp_path / "nowhere")
    cases = [
        (dict(context=Path("missing.txt")), "context file not found"),
        (dict(model="no-such-alias"), "unknown model 'no-such-alias'"),
        (dict(budget={"tokens": 0}), "budget tokens must be a positive number"),
        (dict(budget={"dollars": 1}), "unknown budget 'dollars'"),
        (dict(context=b"raw"), "not bytes"),
        (dict(context={"x": object()}), "JSON-able"),
        (dict(limits={"max_steps_per_turn": -1}), "max_steps_per_turn"),
    ]
    for kwargs, message in cases:
        with pytest.raises(primefs.PrimefsError, match=message):
            api.ask("anything", **kwargs)
    with pytest.raises(primefs.PrimefsError, match="the task is empty"):
        api.submit("  ")
    assert not list(ws.goals.glob("*.md")) and not list((ws.goals / ".data").glob("*"))  # nothing half-written
    with pytest.raises(primefs.PrimefsError, match="no session"):
        api.session("nobody")
    api.close()
    with pytest.raises(primefs.PrimefsError, match="is closed"):
        api.ask("anything")


def test_failure_budget_and_timeout_are_exceptions_carrying_the_session(ws, scripted):
    ws = scripted('rules:\n'
                  '  - match: spend\n    replies:\n      - code: "print(1)"\n      - code: "print(2)"\n'
                  '      - text: "done"\n'
                  '  - match: sleep\n    replies:\n      - code: "import time; time.sleep(20)"\n      - text: "late"\n'
                  'default:\n  - text: ok\n')
    ws = configure(ws, limits={"model_retries": 0})
    with primefs.Workspace(ws.root) as api:
        with pytest.raises(primefs.BudgetExceeded, match=r"budget:turns|budget:tokens") as exc:
            api.ask("spend it", budget={"tokens": 10})
        assert exc.value.result.stop_reason.startswith("budget:") and exc.value.result.usage["calls"] >= 1
        with pytest.raises(primefs.SessionFailed, match="script file not found") as failed:
            api.ask("fail now", model="scripted/missing.yaml")
        assert not isinstance(failed.value, primefs.BudgetExceeded) and failed.value.result.status == "failed"
        with pytest.raises(primefs.Timeout) as late:
            api.ask("sleep a while", timeout=3)
        handle = late.value.handle
        assert handle.status == "running"
        handle.stop()
        assert handle.wait(30).status == "stopped"


LEAVES_NOTHING = """
import ctypes, os, subprocess, sys, time
ctypes.CDLL(None).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER: whatever the program leaves behind comes to us
rc = subprocess.run([sys.executable, "-c", sys.argv[1]]).returncode
left = []
deadline = time.monotonic() + 10
while time.monotonic() < deadline:
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        break
    left = [p for p in os.listdir("/proc") if p.isdigit() and open(f"/proc/{p}/stat").read().split(")")[1].split()[1] == str(os.getpid())]
    if not left:
        break
    time.sleep(0.1)
print("RC", rc, "LEFT", left)
"""


def test_a_program_that_asks_exits_by_itself_and_leaves_no_process(ws, scripted):
    scripted(SPAWN)
    program = (f"import primefs; r = primefs.Workspace({str(ws.root)!r}).ask('count the words', "
               f"context={{'text': 'a b'}}); print('ANSWER', r.answer)")
    out = subprocess.run([sys.executable, "-c", LEAVES_NOTHING, program], capture_output=True, text=True, timeout=120)
    assert "ANSWER two words" in out.stdout and "RC 0 LEFT []" in out.stdout, out.stdout + out.stderr
    assert not lock_held(ws)


def test_the_rlm_facade(ws, scripted, tmp_path):
    scripted(SPAWN)
    rlm = primefs.RLM(workspace=ws.root, max_depth=2, max_iterations=5)
    out = rlm.completion({"text": "hello world"}, root_prompt="count the words")
    assert out.response == "two words" and str(out) == "two words"
    assert out.execution_time > 0 and out.workspace == ws.root
    [(model, m)] = out.usage_summary.model_usage_summaries.items()
    assert model == "scripted/script.yaml" and m.total_calls == 4 and out.usage_summary.total_input_tokens > 0
    assert out.to_dict()["usage_summary"]["model_usage_summaries"][model]["total_calls"] == 4
    meta = primefs.Workspace(ws.root).session(out.session_id).session.meta
    assert meta["limits"] == {"max_steps_per_turn": 5, "max_depth": 1}
    assert primefs.RLM(workspace=ws.root).completion("say ok").response == "ok"  # a lone short prompt: the task
    with pytest.raises(primefs.PrimefsError, match="max_depth"):
        primefs.RLM(max_depth=0)
    with pytest.raises(TypeError, match="unexpected"):
        primefs.RLM(no_such_argument=1)
    with pytest.warns(UserWarning, match="max_errors"):
        primefs.RLM(max_errors=3)


def test_the_rlm_facade_in_a_temporary_workspace(tmp_path, monkeypatch, server):
    """No workspace: a new one per completion, removed after it unless `keep`. (The model: litellm's
    openai provider, pointed at the scripted server by its environment variables.)"""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OPENAI_API_BASE", server.url)
    monkeypatch.setenv("OPENAI_API_KEY", "none")
    server.set_script([{"text": "fine"}])
    temp = primefs.RLM(model="openai/test-model").completion("hello")
    assert temp.response == "fine" and temp.workspace is None and temp.root_model == "openai/test-model"
    assert not list(Path(__import__("tempfile").gettempdir()).glob(f"primefs-rlm-*/workspace/sessions/{temp.session_id}"))
    kept = primefs.RLM(backend="openai", backend_kwargs={"model_name": "test-model"}, keep=True).completion("hello")
    assert kept.workspace is not None and (kept.workspace / "sessions" / kept.session_id / "result.md").is_file()
    assert kept.usage_summary.model_usage_summaries["openai/test-model"].total_calls == 1
