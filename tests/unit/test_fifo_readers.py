"""Files a kernel may name or put in its room are read without ever blocking: a FIFO in their place held a
runner thread for ever (a judge's evidence file), or every session's scripted model call (a script file
named as a model: `llm(model='scripted/<its room>/fifo.yaml')`), found by an attack."""
from __future__ import annotations

import os
import threading

import pytest

from primefs.default_plugins.end_conditions import judge
from primefs.providers.base import ModelError
from primefs.providers.scripted import ScriptedProvider


def within(seconds: float, fn):
    """fn() in a thread; its result, or a failure if it is still running after `seconds`."""
    out: list = []
    t = threading.Thread(target=lambda: out.append(_call(fn)), daemon=True)
    t.start()
    t.join(seconds)
    assert out, f"still blocked after {seconds} s"
    if isinstance(out[0], BaseException):
        raise out[0]
    return out[0]


def _call(fn):
    try:
        return fn()
    except BaseException as exc:  # noqa: BLE001 - raised again in the test's thread
        return exc


def test_a_judges_evidence_file_that_is_a_fifo(tmp_path):
    room = tmp_path / "sessions" / "s" / "work"
    room.mkdir(parents=True)
    os.mkfifo(room / "report.md")
    asked = []
    ctx = {"workspace": str(tmp_path), "room": str(room), "goal": "write a report", "answer": "done",
           "complete": lambda model, prompt: asked.append(prompt) or "VERDICT: fail\nno report",
           "record": lambda *a, **k: None, "run": None}
    passed, report = within(10, lambda: judge({"model": "m", "rubric": "r", "show": {"files": ["report.md"]}}, ctx))
    assert not passed and "cannot be read" in asked[0]


def test_a_script_file_that_is_a_fifo_holds_no_other_call(tmp_path):
    os.mkfifo(tmp_path / "fifo.yaml")
    (tmp_path / "ok.yaml").write_text("default:\n  - text: fine\n")
    provider = ScriptedProvider()
    msgs = [{"role": "user", "content": "hi"}]
    with pytest.raises(ModelError, match="bad script file"):
        within(10, lambda: provider.complete(msgs, None, {"model": "scripted/fifo.yaml", "workspace": str(tmp_path)}))
    reply = within(10, lambda: provider.complete(msgs, None, {"model": "scripted/ok.yaml", "workspace": str(tmp_path)}))
    assert reply.text == "fine"


def test_a_script_in_a_sessions_folder_is_no_model(tmp_path):
    """A subagent spec (or llm()) naming `scripted/sessions/<its room>/evil.yaml` made a model of what a
    kernel wrote: its children in another session's tree ran the kernel's script (found by an attack)."""
    room = tmp_path / "sessions" / "s" / "work"
    room.mkdir(parents=True)
    (room / "evil.yaml").write_text("default:\n  - text: forged\n")
    with pytest.raises(ModelError, match="in a session's folder"):
        ScriptedProvider().complete([{"role": "user", "content": "hi"}], None,
                                    {"model": "scripted/sessions/s/work/evil.yaml", "workspace": str(tmp_path)})
