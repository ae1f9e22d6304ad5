"""Shell hooks (`hooks:` in primefs.yaml, docs/long-running.md "Hooks"): run by the runner outside every
kernel with the event as JSON on stdin, with a timeout, only from a primefs.yaml the person trusts."""
from __future__ import annotations

import json

from conftest import cli, configure, run_once, wait_for

from primefs.store.frontmatter import dump_yaml, load_yaml
from primefs.store.goals import write_goal
from primefs.store.session import list_sessions
from primefs.store.workspace import Workspace

SCRIPT = '- code: "print(6 * 7)"\n- text: "42"\n'


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_hooks_get_the_event_on_stdin(ws, scripted, tmp_path):
    ws = scripted('- code: "print(6 * 7)"\n- code: "done(\'42\')"\n')
    out = tmp_path / "out"
    out.mkdir()
    ws = configure(ws, hooks={"before_cell": f"cat >> {out}/before.jsonl; echo >> {out}/before.jsonl",
                              "turn_end": [f"cat >> {out}/turn.jsonl; echo >> {out}/turn.jsonl"],
                              "session_end": {"command": f"cat > {out}/end.json", "timeout_s": 5}})
    write_goal(ws, "Compute", name="hooked")
    run_once(ws)
    [s] = list_sessions(ws.sessions)
    assert s.read_result() == "42"
    before = lines(out / "before.jsonl")
    assert [b["event"]["code"] for b in before] == ["print(6 * 7)", "done('42')"]
    assert before[0]["hook"] == "before_cell" and before[0]["name"] == "hooked"
    [turn] = wait_for(lambda: lines(out / "turn.jsonl"), 30, "the turn_end hook")
    assert turn["event"]["type"] == "turn_end" and turn["session"] == s.id and turn["workspace"] == str(ws.root)
    end = wait_for(lambda: (out / "end.json").exists() and json.loads((out / "end.json").read_text()), 30, "end")
    assert end["hook"] == "session_end" and end["status"] == "done"


def test_a_hook_that_fails_or_hangs_is_a_warning_never_a_stuck_session(ws, scripted):
    ws = scripted(SCRIPT)
    ws = configure(ws, hooks={"before_cell": {"command": "sleep 60", "timeout_s": 1},
                              "turn_end": "echo broken >&2; exit 3"})
    write_goal(ws, "Compute")
    run_once(ws)
    [s] = list_sessions(ws.sessions)
    assert s.read_result() == "42"
    [cell] = s.events("cell")
    def hook_warnings():  # (not what this machine's sandbox lacks, said as a warning too where it does)
        return [e["text"] for e in s.events("warning") if e["text"].startswith("hooks.")]

    texts = wait_for(lambda: hook_warnings() if len(hook_warnings()) == 2 else None, 30, "two warnings")
    assert any("hooks.before_cell: 'sleep 60': killed after its timeout (1 s)" in t for t in texts)
    assert any("hooks.turn_end: 'echo broken >&2; exit 3': exit status 3: broken" in t for t in texts)


def test_hooks_run_only_from_a_trusted_primefs_yaml(ws, scripted, tmp_path):
    ws = scripted(SCRIPT)
    mark = tmp_path / "ran"
    ws = configure(ws, hooks={"turn_end": f"touch {mark}"})
    cfg = ws.root / "primefs.yaml"
    cfg.write_text(cfg.read_text().replace(f"touch {mark}", f"touch {mark}; echo changed"))  # not trusted again
    ws = Workspace(ws.root)
    write_goal(ws, "Compute")
    logs = run_once(ws)
    assert [s.read_result() for s in list_sessions(ws.sessions)] == ["42"] and not mark.exists()
    assert any("hooks.turn_end: not run: primefs.yaml changed since you trusted it" in line for line in logs)
    assert "hooks" in cli(ws, "trust", "--json").stdout


def test_bad_hook_settings_name_the_setting(ws):
    cfg = ws.root / "primefs.yaml"
    for hooks, words in (({"on_lunch": "x"}, "unknown hook 'on_lunch'"),
                         ({"turn_end": 5}, "hooks.turn_end: each hook is a command"),
                         ({"turn_end": {"command": "x", "timeout_s": 0}}, "timeout_s must be a number of seconds"),
                         ({"turn_end": {"command": "x", "when": 1}}, "unknown key(s) when")):
        cfg.write_text(dump_yaml({**load_yaml(cfg), "hooks": hooks}))
        r = cli(ws, "run", "--once")
        assert r.returncode == 1 and words in r.stderr, r.stderr
