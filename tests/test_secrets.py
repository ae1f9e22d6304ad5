"""Known secrets and key shapes never reach history, results, mail, session files or a commit."""
from __future__ import annotations

import subprocess

from conftest import configure, run_once

from primefs.store import mail
from primefs.store.goals import write_goal
from primefs.store.session import list_sessions

STANDARD = "sk-test-abcdefghijklmnopqrstuvwxyz0123"  # a litellm standard variable's value
ALIAS = "alias-secret-98765"                          # in the file an alias's api_key_file names
NAMED = "my-env-secret-4242"                          # the variable an alias's api_key_env names
SHAPE = "ghp_" + "A1" * 18                            # a GitHub token nobody declared


def test_secrets_are_redacted_everywhere(ws, monkeypatch, tmp_path):
    monkeypatch.setenv("OPENAI_API_KEY", STANDARD)
    (tmp_path / "key.txt").write_text(ALIAS + "\n")
    monkeypatch.setenv("MY_KEY_VAR", NAMED)
    (ws.root / "s.yaml").write_text(f"""\
- code: "print('{STANDARD}', '{ALIAS}', '{NAMED}', '{SHAPE}')"
- code: "harness.put('note', 'keys', 'remember {ALIAS} and {SHAPE}', description='key {NAMED}')"
- text: "the keys were {STANDARD} and {ALIAS}"
- text: "done"
""")
    ws = configure(ws, model="leaky", models={"leaky": {"model": "scripted/s.yaml", "api_key_env": "MY_KEY_VAR"},
                                              "other": {"model": "openai/x", "api_key_file": str(tmp_path / "key.txt")}})
    write_goal(ws, "Leak everything", name="leak")
    run_once(ws)
    s = list_sessions(ws.sessions)[0]
    mail.deliver(s.mail, sender="user", to=s.id, kind="user", text=f"here is {NAMED}")
    run_once(ws)
    files = [p for p in ws.root.rglob("*") if p.is_file() and ".git" not in p.parts
             and p.name != "s.yaml"]  # the script the test itself wrote
    leaked = [(str(p.relative_to(ws.root)), secret) for p in files for secret in (STANDARD, ALIAS, NAMED, SHAPE)
              if secret in p.read_text(errors="replace")]
    assert leaked == []
    history = (s.dir / "history.jsonl").read_text()
    assert history.count("[redacted]") >= 8 and "the keys were [redacted] and [redacted]" in history
    assert s.read_result() == "done"
    log = subprocess.run(["git", "-C", str(ws.root), "log", "-p", "--all", "--", ".", ":(exclude)s.yaml"],
                         capture_output=True, text=True).stdout
    assert log and not any(secret in log for secret in (STANDARD, ALIAS, NAMED, SHAPE))
    note = (ws.root / "harness" / "notes" / "keys.md").read_text()
    assert "remember [redacted] and [redacted]" in note and "description: key [redacted]" in note


def test_short_values_and_ordinary_text_are_left_alone():
    from primefs.store.redact import Redactor

    r = Redactor({"short", "a-long-enough-secret"})
    assert r.text("short words and a-long-enough-secret") == "short words and [redacted]"
    assert r.text("sk-123 is not a key, nor is sky") == "sk-123 is not a key, nor is sky"
    assert r.value({"k": ["a-long-enough-secret", 3]}) == {"k": ["[redacted]", 3]}
