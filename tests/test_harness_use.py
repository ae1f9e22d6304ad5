"""The continual harness in use: agents write entries, prompts use them, git records and reverts them."""
from __future__ import annotations

import json
import subprocess

from conftest import by_name, cli, run_once, use_server

from primefs.store.goals import write_goal
from primefs.harness.entries import Harness
from primefs.store.session import list_sessions


def system_prompt_of(server, task):
    reqs = [r for r in server.requests if len(r["messages"]) > 1 and r["messages"][1]["content"] == task]
    return reqs[-1]["messages"][0]["content"]


def trailers(ws, sha):
    msg = subprocess.run(["git", "-C", str(ws.root), "log", "-1", "--format=%B", sha], capture_output=True,
                         text=True).stdout
    parsed = subprocess.run(["git", "interpret-trailers", "--parse"], input=msg, capture_output=True, text=True).stdout
    return dict(line.split(": ", 1) for line in parsed.splitlines())


def test_agent_put_commit_prompt_revert(ws, server):
    server.set_script({"rules": [
        {"match": "^Learn", "replies": [
            {"code": "for _ in range(2):\n    print(harness.put('memory', 'sky-color', 'The sky here is green.', "
                     "description='sky fact'))"},
            {"text": "learned"}]},
        {"match": "^Ask", "replies": [{"text": "asked"}]}]})
    ws = use_server(ws, server)
    write_goal(ws, "Learn a fact", name="learn")
    run_once(ws)
    learn = by_name(ws)["learn"]
    sha, again = learn.events("cell")[0]["output"].split()
    assert again == "None"  # the same content again: no commit (only the timestamp would change)
    assert [e["commit"] for e in learn.events("harness")] == [sha, None]
    assert (ws.root / "harness/memory/sky-color.md").read_text().count("The sky here is green.") == 1
    t = trailers(ws, sha)
    assert t["Primefs-Session"] == learn.id and t["Primefs-Kind"] == "memory" and t["Primefs-Source"] == "agent"
    files = subprocess.run(["git", "-C", str(ws.root), "show", "--name-only", "--format=", sha], capture_output=True,
                           text=True).stdout.split()
    assert files == ["harness/memory/sky-color.md"]  # the commit touches only that file
    # the next session's prompt contains it
    write_goal(ws, "Ask about the sky", name="ask1")
    run_once(ws)
    assert "The sky here is green." in system_prompt_of(server, "Ask about the sky")
    # revert through the CLI; the next prompt no longer has it
    log = json.loads(cli(ws, "harness", "log", "--json").stdout)
    assert log[0]["sha"] == sha and log[0]["source"] == "agent" and log[0]["session"] == learn.id
    r = cli(ws, "harness", "revert", sha)
    assert r.returncode == 0, r.stderr
    assert not (ws.root / "harness/memory/sky-color.md").exists()
    write_goal(ws, "Ask about the sky again", name="ask2")
    run_once(ws)
    assert "The sky here is green." not in system_prompt_of(server, "Ask about the sky again")
    # refusals: not a harness commit
    first = subprocess.run(["git", "-C", str(ws.root), "rev-list", "--max-parents=0", "HEAD"], capture_output=True,
                           text=True).stdout.strip()
    bad = cli(ws, "harness", "revert", first)
    assert bad.returncode == 1 and "not a harness change" in bad.stderr


def test_hand_written_note_is_used_next_turn_and_committed_as_user(ws, server):
    server.set_script({"rules": [{"match": "^Hello", "replies": [{"text": "one"}, {"text": "two"}]}]})
    ws = use_server(ws, server)
    write_goal(ws, "Hello", name="h")
    run_once(ws)
    (ws.root / "harness/notes/style.md").write_text("---\nname: style\ndescription: how to answer\n---\n"
                                                    "Always answer in haiku.\n")
    cli(ws, "send", "h", "again")
    run_once(ws)
    assert "Always answer in haiku." in server.requests[-1]["messages"][0]["content"]
    log = json.loads(cli(ws, "harness", "log", "--json").stdout)
    assert log[0]["kind"] == "note" and log[0]["name"] == "style" and log[0]["source"] == "user"


def test_skill_import_and_call(ws, server):
    Harness(ws).put("skill", "word-count", "Count words in a text: `count(text)`.", description="count words",
                    files={"word_count.py": "def count(text):\n    return len(text.split())\n"}, source="user")
    server.set_script([{"code": "from skills import word_count\nprint(word_count.count('a b c d'))"},
                       {"text": "done"}])
    ws = use_server(ws, server)
    write_goal(ws, "Use the skill", name="sk")
    run_once(ws)
    s = by_name(ws)["sk"]
    assert s.events("cell")[0]["output"] == "4\n"
    system = system_prompt_of(server, "Use the skill")
    assert "word-count: count words" in system and "Count words in a text" not in system  # description only


def test_subagent_spec_drives_rlm(ws, server):
    Harness(ws).put("agent", "critic", "You are a harsh critic. Find one flaw.", description="finds flaws",
                    source="user", model="inherit")
    server.set_script({"rules": [
        {"match": "^Review", "replies": [
            {"code": "h = rlm('Critique this plan', agent='critic')\nprint(h.wait())\n"
                     "try:\n    rlm('x', agent='nobody')\nexcept Exception as e:\n    print('refused:', e)"},
            {"text": "reviewed"}]},
        {"match": "^Critique", "replies": [{"text": "flaw found"}]}]})
    ws = use_server(ws, server)
    write_goal(ws, "Review the plan", name="rev")
    run_once(ws)
    out = by_name(ws)["rev"].events("cell")[0]["output"]
    assert out.startswith("flaw found\nrefused: rlm(agent='nobody'): no such subagent spec")
    child_system = system_prompt_of(server, "Critique this plan")
    assert "## Your role\nYou are a harsh critic. Find one flaw." in child_system
    child = next(s for s in list_sessions(ws.sessions) if s.meta.get("agent") == "critic")
    assert child.meta["model"] == "fake"  # inherit: the parent's model


def test_refine_applies_valid_edits_and_rejects_invalid_ones(ws, server):
    edits = {"edits": [
        {"op": "create", "kind": "memory", "name": "answer-style", "description": "style",
         "body": "Answer with one word.", "evidence": [0], "rationale": "r", "expected_effect": "shorter answers"},
        {"op": "create", "kind": "prompt", "name": "base", "body": "x", "expected_effect": "e"},
        {"op": "update", "kind": "note", "name": "AGENTS-md", "body": "x", "expected_effect": "e"},
        {"op": "create", "kind": "memory", "name": "../escape", "body": "x", "expected_effect": "e"},
        {"op": "update", "kind": "note", "name": "missing", "body": "x", "expected_effect": "e"},
        {"op": "create", "kind": "memory", "name": "no-intent", "body": "x"},
        {"op": "create", "kind": "gadget", "name": "thing", "body": "x", "expected_effect": "e"}]}
    server.set_script({"rules": [
        {"match": "^You refine the harness", "replies": [{"text": json.dumps(edits)}]},
        {"match": "^Work", "replies": [{"code": "print(refine('be brief'))"}, {"text": "worked"}]}]})
    ws = use_server(ws, server)
    write_goal(ws, "Work on something", name="w")
    run_once(ws)
    s = by_name(ws)["w"]
    ev = s.events("refine")[0]
    assert [a["name"] for a in ev["applied"]] == ["answer-style"]
    reasons = [r["reason"] for r in ev["rejected"]]
    assert len(reasons) == 6
    assert "base prompt" in reasons[0] and "base prompt" in reasons[1] and "invalid harness name" in reasons[2]
    assert "does not exist" in reasons[3] and "expected_effect" in reasons[4] and "unknown harness kind" in reasons[5]
    t = trailers(ws, ev["applied"][0]["commit"])
    assert t["Primefs-Source"] == "refine" and t["Primefs-Intent"] == "shorter answers"
    assert t["Primefs-Evidence"] == f"{s.id}#0"
    refine_request = next(r for r in server.requests if r["messages"][0]["content"].startswith("You refine"))
    assert "Instructions: be brief" in refine_request["messages"][0]["content"]
    assert [c["purpose"] for c in s.events("model_call")].count("refine") == 1


def test_refine_rejects_entries_changed_since_planning(ws, server):
    h = Harness(ws)
    h.put("note", "tone", "Be polite.", source="user")
    edits = {"edits": [{"op": "update", "kind": "note", "name": "tone", "body": "Be rude.", "expected_effect": "e"}]}
    server.set_script({"rules": [{"match": "^You refine", "replies": [{"text": json.dumps(edits)}]},
                                 {"match": "^Chat", "replies": [{"text": "hi"}]}]})
    ws = use_server(ws, server)
    write_goal(ws, "Chat", name="c")
    run_once(ws)
    # a person edits the note while the refine call is being planned: simulate by editing in the complete hook
    from primefs.runner.core import Runner

    r = Runner(ws, log=lambda m: None)
    real = r.gateway.complete

    def complete_and_edit(*a, **kw):
        (ws.root / "harness/notes/tone.md").write_text("---\nname: tone\n---\nBe very polite.\n")
        return real(*a, **kw)

    r.gateway.complete = complete_and_edit
    result = r.refine(by_name(ws)["c"].id)
    assert result["applied"] == [] and "changed since the refinement was planned" in result["rejected"][0]["reason"]
    assert "Be very polite." in (ws.root / "harness/notes/tone.md").read_text()


def test_cli_refine_and_outcome_and_broken_files(ws, server):
    edits = {"edits": [{"op": "create", "kind": "note", "name": "tip", "body": "Use code.", "expected_effect": "fewer steps"}]}
    server.set_script({"rules": [{"match": "^You refine", "replies": [{"text": json.dumps(edits)}]},
                                 {"match": "^Task", "replies": [{"text": "ok"}]}]})
    ws = use_server(ws, server)
    write_goal(ws, "Task", name="t")
    run_once(ws)
    r = cli(ws, "refine", "t", "--instructions", "keep it short")
    assert r.returncode == 0 and "applied create note/tip" in r.stdout, r.stdout + r.stderr
    sha = r.stdout.split(": ")[-1].strip()
    judged = cli(ws, "harness", "outcome", sha, "good", "--note", "it helped", "--json")
    assert json.loads(judged.stdout) == {"commit": sha, "outcome": "good", "note": "it helped"}
    log = json.loads(cli(ws, "harness", "log", "--json").stdout)
    assert log[0]["outcome"] == "good" and log[0]["outcome_note"] == "it helped"
    assert "Use code." in cli(ws, "harness", "show", "note", "tip").stdout
    # a broken harness file: skipped with file and line, never crashing a turn
    (ws.root / "harness/memory/broken.md").write_text("---\nname: [oops\n---\nbody\n")
    cli(ws, "send", "t", "more")
    run_once(ws)
    s = by_name(ws)["t"]
    assert s.status == "idle"
    assert "harness/memory/broken.md:2" in server.requests[-1]["messages"][0]["content"]
    listing = cli(ws, "harness", "list").stdout
    assert "broken.md:2" in listing
    assert "harness file skipped: harness/memory/broken.md:2" in cli(ws, "log", "t").stdout
    assert "harness/memory/broken.md:2" in cli(ws, "status").stderr
    assert cli(ws, "harness", "put", "memory", "../x").returncode != 0


def test_a_later_refine_judges_an_earlier_refinement(ws, server):
    first = {"edits": [{"op": "create", "kind": "note", "name": "short", "body": "Be short.",
                        "expected_effect": "shorter answers"}]}
    server.set_script({"rules": [{"match": "^You refine", "replies": [{"text": json.dumps(first)}]},
                                 {"match": "^Task", "replies": [{"text": "ok"}, {"text": "ok again"}]}]})
    ws = use_server(ws, server)
    write_goal(ws, "Task", name="t")
    run_once(ws)
    assert cli(ws, "refine", "t").returncode == 0
    sha = json.loads(cli(ws, "harness", "log", "--json").stdout)[0]["sha"]
    judged = {"edits": [], "outcomes": [{"commit": sha, "outcome": "good", "note": "answers got shorter"},
                                        {"commit": "0" * 40, "outcome": "bad"}]}
    server.set_script({"rules": [{"match": "^You refine", "replies": [{"text": json.dumps(judged)}]},
                                 {"match": "^Task", "replies": [{"text": "ok"}, {"text": "ok again"}]}]})
    r = cli(ws, "refine", "t")
    assert r.returncode == 0
    refine_prompt = [q for q in server.requests if q["messages"][0]["content"].startswith("You refine")][-1]
    assert f"{sha}: note/short: shorter answers" in refine_prompt["messages"][0]["content"]
    row = json.loads(cli(ws, "harness", "log", "--json").stdout)[0]
    assert row["sha"] == sha and row["outcome"] == "good" and row["outcome_note"] == "answers got shorter"
