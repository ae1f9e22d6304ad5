"""`primefs harness ...` and `primefs refine` as an operator runs them: real processes, real git."""
from __future__ import annotations

import json
import subprocess

import pytest
from test_cli import assert_clean_error, cli


def git(root, *args) -> str:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True).stdout


@pytest.fixture
def home(tmp_path):
    assert cli("init", "w", cwd=tmp_path).returncode == 0
    return tmp_path / "w"


def put(home, *args, body=None):
    r = cli("harness", "put", *args, *(("--body", "-") if body is not None else ()), cwd=home, input=body)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_put_unchanged_says_no_change_and_commits_nothing(home):
    sha = put(home, "note", "units", "-d", "Units to use", body="Prefer metric units.\n")
    assert len(sha) == 40 and git(home, "rev-parse", "HEAD").strip() == sha
    text = (home / "harness/notes/units.md").read_text()
    assert put(home, "note", "units", "-d", "Units to use", body="Prefer metric units.\n") == "no change"
    assert put(home, "note", "units") == "no change"
    assert git(home, "rev-parse", "HEAD").strip() == sha and (home / "harness/notes/units.md").read_text() == text
    same = json.loads(put(home, "note", "units", "--json", body="Prefer metric units.\n"))
    assert same == {"commit": None, "changed": False, "kind": "note", "name": "units", "scope": "global",
                    "session": None, "path": "harness/notes/units.md"}
    new = json.loads(put(home, "note", "units", "--json", body="Prefer imperial units.\n"))
    assert new["changed"] and new["commit"] == git(home, "rev-parse", "HEAD").strip() != sha
    gone = cli("harness", "rm", "note", "units", "--json", cwd=home)
    assert json.loads(gone.stdout) == {"commit": git(home, "rev-parse", "HEAD").strip(), "changed": True,
                                       "kind": "note", "name": "units", "scope": "global", "session": None}
    assert not (home / "harness/notes/units.md").exists()


def test_log_shows_a_plain_git_revert_and_revert_refuses_it_twice(home):
    put(home, "note", "units", "-d", "Units to use", body="Prefer metric units.\n")
    change = put(home, "note", "units", "-d", "Units to use", body="Prefer imperial units.\n")
    git(home, "revert", "--no-edit", change)
    plain = git(home, "rev-parse", "HEAD").strip()
    rows = json.loads(cli("harness", "log", "--json", cwd=home).stdout)
    assert [(r["sha"], r["reverts"], r["reverted_by"]) for r in rows[:2]] == [(plain, change, None), (change, None, plain)]
    table = cli("harness", "log", cwd=home, env={"COLUMNS": "200"}).stdout
    lines = {ln.split()[0]: ln for ln in table.splitlines()[1:]}
    assert f"revert of {change[:10]} (update - Units to use)" in lines[plain[:10]] and " git " in lines[plain[:10]]
    assert f"reverted by {plain[:10]}" in lines[change[:10]]
    # reverting it again is refused with one line, the tree untouched
    assert_clean_error(cli("harness", "revert", change, cwd=home), f"already reverted by {plain[:10]}", change[:10])
    assert git(home, "rev-parse", "HEAD").strip() == plain and git(home, "status", "--porcelain") == ""
    # the plain revert is a harness change: reverting it brings the change back
    r = cli("harness", "revert", plain[:10], "--json", cwd=home)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out == {"commit": git(home, "rev-parse", "HEAD").strip(), "reverts": plain, "kind": "note", "name": "units",
                   "path": "harness/notes/units.md"}
    assert "Prefer imperial units." in (home / "harness/notes/units.md").read_text()
    table = cli("harness", "log", cwd=home, env={"COLUMNS": "200"}).stdout
    assert f"revert of {plain[:10]} (which reverted {change[:10]})" in table


def test_revert_reports_git_failures_whole(home):
    sha = put(home, "note", "tip", body="Use code.\n")
    git(home, "config", "commit.gpgsign", "true")  # git revert then fails writing its commit
    git(home, "config", "gpg.program", "false")
    r = cli("harness", "revert", sha, cwd=home)
    assert_clean_error(r, "git revert failed:", "gpg failed to sign the data", "failed to write commit object")
    assert len(r.stderr.strip().splitlines()) == 1
    assert git(home, "rev-parse", "HEAD").strip() == sha and git(home, "status", "--porcelain") == ""


def refine_workspace(home, reply: str) -> str:
    """A session that ran one turn, and a scripted model whose refine reply is `reply`."""
    (home / "script.yaml").write_text(
        "rules:\n  - match: '^You refine'\n    replies:\n      - text: " + json.dumps(reply) + "\n"
        "default:\n  - text: done\n")
    assert cli("goal", "Say done", "--name", "demo", "--model", "scripted/script.yaml", cwd=home).returncode == 0
    assert cli("run", "--once", cwd=home).returncode == 0
    return json.loads(cli("status", "--json", cwd=home).stdout)[0]["id"]


def test_refine_error_is_one_line_printed_once(home):
    refine_workspace(home, "no JSON here")
    r = cli("refine", "demo", cwd=home)
    assert_clean_error(r, "refine failed: the refine reply holds no JSON object")
    assert r.stderr.strip().splitlines() == ["error: refine failed: the refine reply holds no JSON object"]
    assert "PrimefsError" not in r.stderr + r.stdout and r.stdout == ""
    assert_clean_error(cli("refine", "nobody", cwd=home), "no session")
    assert_clean_error(cli("refine", "demo", "-m", "no-such-alias", cwd=home), "unknown model")


def test_refine_json(home):
    edits = {"edits": [{"op": "create", "kind": "note", "name": "tip", "body": "Use code.", "expected_effect": "fewer steps"},
                       {"op": "create", "kind": "base", "name": "x", "body": "x", "expected_effect": "e"}]}
    sid = refine_workspace(home, json.dumps(edits))
    r = cli("refine", "demo", "--json", cwd=home)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["session"] == sid and out["name"] == "demo" and out["requested"] is False and out["outcomes"] == []
    [applied] = out["applied"]
    assert applied["op"] == "create" and applied["name"] == "tip" and applied["commit"] == git(home, "rev-parse", "HEAD").strip()
    assert [x["edit"]["kind"] for x in out["rejected"]] == ["base"] and "base prompt" in out["rejected"][0]["reason"]
    text = cli("refine", "demo", cwd=home)  # the same reply again: the note exists now
    assert "rejected {'op': 'create', 'kind': 'note', 'name': 'tip'}: note/tip exists already" in text.stdout


def test_refine_json_with_a_runner_running(home):
    import fcntl

    sid = refine_workspace(home, "{}")
    with open(home / ".primefs" / "runner.lock", "a+") as f:  # as a running runner holds it
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        r = cli("refine", "demo", "-i", "be brief", "--json", cwd=home)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"session": sid, "name": "demo", "requested": True}
    assert json.loads((home / "sessions" / sid / "refine.request").read_text())["instructions"] == "be brief"
