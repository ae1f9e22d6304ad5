"""Bad input a person writes (goal files, session.yaml, mail, limits, alias and session names, harness links,
script paths): each is reported once, by name, and the healthy sessions go on."""
from __future__ import annotations

import os
import time

import pytest
from conftest import by_name, cli, configure, run_once

from primefs.store import mail
from primefs.errors import PrimefsError
from primefs.store.goals import write_goal
from primefs.harness.entries import Harness
from primefs.store.workspace import Workspace


def scripted(ws):
    (ws.root / "s.yaml").write_text("default:\n" + "  - text: fine\n" * 20)
    return configure(ws, model="scripted/s.yaml")


def test_bad_goal_files_are_reported_once_and_healthy_goals_run(ws):
    ws = scripted(ws)
    (ws.goals / "nul.md").write_text("---\ncontext: \"a\\0b\"\n---\ntask\n")
    (ws.goals / "long.md").write_text(f"---\ncontext: {'x' * 5000}\n---\ntask\n")
    (ws.goals / "deep.md").write_text("---\nbudget: " + "[" * 3000 + "]" * 3000 + "\n---\ntask\n")
    (ws.goals / "deeper.md").write_text("---\n" + "".join("  " * i + f"k{i}:\n" for i in range(60)) + "---\ntask\n")
    outside = ws.root.parent / "outside.md"
    outside.write_text("a task from outside the workspace\n")
    os.symlink(outside, ws.goals / "link.md")
    (ws.goals / "notes.txt").write_text("not a goal\n")
    write_goal(ws, "healthy", name="healthy")
    started = time.monotonic()
    lines = run_once(ws)
    assert time.monotonic() - started < 60
    text = "\n".join(lines)
    assert "goals/nul.md: context path 'a\\x00b' is not a usable path" in text
    assert "goals/long.md: context path 'xxxx" in text and "is not a usable path" in text
    assert "goals/deep.md: nested deeper than 32 levels" in text and "goals/deeper.md: nested deeper" in text
    assert "goals/link.md: a symbolic link to" in text and "outside the workspace" in text
    assert "goals/notes.txt: ignored, not a .md file" in text
    assert list(by_name(ws)) == ["healthy"] and by_name(ws)["healthy"].read_result() == "fine"
    again = run_once(ws)  # a second runner says each once too; no session was made of them
    assert sum("goals/nul.md" in line for line in again) == 1 and list(by_name(ws)) == ["healthy"]


def test_a_hand_edited_session_yaml_does_not_stop_the_runner(ws):
    ws = scripted(ws)
    write_goal(ws, "one", name="one")
    write_goal(ws, "two", name="two")
    run_once(ws)
    one, two = by_name(ws)["one"], by_name(ws)["two"]
    text = (one.dir / "session.yaml").read_text()
    (one.dir / "session.yaml").write_text(text.replace("model: scripted/s.yaml", "model: [a, list]"))
    mail.deliver(two.mail, sender="user", to=two.id, kind="user", text="again")
    lines = run_once(ws)
    assert any(f"session {one.id} skipped: sessions/{one.id}/session.yaml: model must be text" in x for x in lines)
    assert len(two.events("turn_start")) == 2
    status = cli(ws, "status")
    assert status.returncode == 0 and "broken" in status.stdout and "Traceback" not in status.stderr
    log = cli(ws, "log", one.id)
    assert log.returncode == 0 and "broken" in log.stdout and "one" in log.stdout


def test_mail_that_is_a_folder_or_nested_goes_to_bad_without_a_hot_loop(ws):
    ws = scripted(ws)
    write_goal(ws, "inbox", name="inbox")
    run_once(ws)
    s = by_name(ws)["inbox"]
    (s.mail / "new" / "folder.md").mkdir()
    (s.mail / "new" / "nested.md").write_text("---\nkind: " + "[" * 5000 + "]" * 5000 + "\n---\nx\n")
    (s.mail / "new" / "ok.md").write_text("hello\n")
    started = time.monotonic()
    run_once(ws)
    assert time.monotonic() - started < 30
    bad = sorted(p.name for p in (s.mail / "bad").iterdir())
    assert bad == ["folder.md", "folder.md.reason", "nested.md", "nested.md.reason"]
    assert "not a regular file" in (s.mail / "bad" / "folder.md.reason").read_text()
    assert len(s.events("bad_mail")) == 2 and len(s.events("error")) == 0
    assert [m["text"] for m in s.events("message")] == ["hello\n"]


@pytest.mark.parametrize("limits, said", [
    ("[1]", "`limits:` must be a mapping of limit: value, not a list"),
    ("{max_concurrent_sessions: .nan}", "limit max_concurrent_sessions must be a finite number, not nan"),
    ("{cell_timeout_s: .inf}", "limit cell_timeout_s must be a finite number, not inf"),
    ("{max_idle_kernels: 1e9}", "limit max_idle_kernels must be between 0 and 10000, not 1000000000"),
    ("{max_steps_per_turn: 2.5}", "limit max_steps_per_turn must be a whole number, not 2.5"),
    ("{max_steps_per_turn: 1e99}", "limit max_steps_per_turn must be between 1 and 100000, not 1e+99"),
])
def test_bad_limits_are_one_line_naming_key_and_range(ws, limits, said):
    text = (ws.root / "primefs.yaml").read_text()
    start = text.index("limits:")
    (ws.root / "primefs.yaml").write_text(text[:start] + f"limits: {limits}\n")
    r = cli(ws, "run", "--once")
    assert r.returncode == 1 and r.stderr.strip() == f"error: primefs.yaml: {said}", r.stderr
    with pytest.raises(PrimefsError):
        Workspace(ws.root).limits()


def test_an_unknown_top_level_key_of_primefs_yaml_is_an_error_naming_it(ws):
    with (ws.root / "primefs.yaml").open("a") as f:
        f.write("modle: gpt\n")  # misspelt: not silently a default model never set
    r = cli(ws, "run", "--once")
    assert r.returncode == 1 and "primefs.yaml: unknown key(s) modle (known: model, models," in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_alias_names_are_one_printable_line(ws):
    from primefs.store.settings import check_config

    for name in ("\n", "two\nlines", " ", "tab\there"):  # found by the fuzz test: a two-line error message
        with pytest.raises(PrimefsError) as info:
            check_config({"models": {name: None}})
        assert "\n" not in str(info.value) and "a model alias name must be printable text on one line" in str(info.value)
    check_config({"models": {"my-gpt 4": {"model": "openai/gpt-4o-mini"}}})


def test_names_ending_in_a_newline_are_refused(ws):
    with pytest.raises(PrimefsError, match="invalid harness name"):
        Harness(ws).put("note", "nl\n", "x")
    with pytest.raises(PrimefsError, match="invalid goal name"):
        write_goal(ws, "x", name="nl\n")
    assert not (ws.harness / "notes" / "nl\n.md").exists()


def test_a_harness_file_linked_out_of_the_workspace_is_skipped(ws):
    outside = ws.root.parent / "secret-note.md"
    outside.write_text("---\nname: leak\n---\nsecret\n")
    os.symlink(outside, ws.harness / "notes" / "leak.md")
    entry = next(e for e in Harness(ws).list() if e.name == "leak")
    assert entry.problem and "outside the workspace" in entry.problem and entry.body == ""


def test_a_script_file_outside_the_workspace_is_refused(ws):
    outside = ws.root.parent / "s.yaml"
    outside.write_text("- text: from outside\n")
    ws = configure(ws, model=f"scripted/{outside}", limits={"model_retries": 0})
    write_goal(ws, "hello", name="out")
    run_once(ws)
    s = by_name(ws)["out"]
    assert s.status == "failed" and "is outside the workspace" in s.meta["error"]
