"""`primefs.testing`, the pytest plugin for plugin authors: used as an author would, from a test file of
their own run by pytest in a process of its own (the plugin found through its `pytest11` entry point)."""
from __future__ import annotations

import os
import subprocess
import sys

AUTHORS_TEST = '''
from pathlib import Path

PLUGIN = """
from pathlib import Path
from primefs import hookimpl

@hookimpl
def register_end_conditions(register):
    register("says_hi", lambda arg, ctx: ((Path(ctx["room"]) / arg).read_text() == "hi", f"{arg} checked"))
"""


def test_my_end_condition(primefs_workspace, primefs_run):
    (primefs_workspace.plugins / "mine.py").write_text(PLUGIN)
    s = primefs_run("Write x.txt", [{"code": "open('x.txt', 'w').write('hi')"}, {"text": "written"}],
                    end_conditions=[{"says_hi": "x.txt"}])
    assert s.status == "done", primefs_run.log
    assert s.read_result() == "written"
    assert [e["results"] for e in s.events("end_conditions")] == [[{"name": "says_hi", "passed": True}]]


def test_a_condition_that_fails_keeps_the_goal_going(primefs_run):
    s = primefs_run("Never", [{"text": "no"}] * 3, end_conditions=[{"file_exists": "nothing.txt"}],
                    autonomous=True, budget={"turns": 2})
    assert s.status == "stopped" and s.meta["stop_reason"] == "budget:turns"
    assert len(s.events("end_conditions")) == 2
'''


def test_an_authors_tests_use_the_fixtures(tmp_path):
    (tmp_path / "test_mine.py").write_text(AUTHORS_TEST)
    env = {**os.environ, "PRIMEFS_LOAD_PLUGINS": "1"}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                       cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 passed" in r.stdout
