"""A pytest plugin for people who write primefs plugins: a workspace in a temporary folder, and goals run
to their end on scripted model replies, with the plugins under test loaded as the runner loads them.

Installed with primefs (entry point `pytest11`), so in any test of a plugin:

    def test_my_end_condition(primefs_workspace, primefs_run):
        (primefs_workspace.plugins / "mine.py").write_text(PLUGIN)      # or an installed package
        s = primefs_run("Write x.txt", [{"code": "open('x.txt', 'w').write('hi')"}, {"text": "done"}],
                        end_conditions=[{"mine": "x.txt"}])
        assert s.status == "done" and s.read_result() == "done"

`primefs_run(task, replies, **front_matter)` writes the replies as a script for the scripted provider
(providers/script.py has the format: `{"text": ...}`, `{"code": ...}`, ...), the task as a goal with that
front matter (model: the script, unless given), trusts the workspace's plugins/*.py (the test wrote them,
as a person would), runs the runner until nothing is left to do (`primefs run --once`) and returns the
goal's session. The runner's log is in `primefs_run.log`.
"""
from __future__ import annotations

import pytest


@pytest.fixture
def primefs_workspace(tmp_path, monkeypatch):
    """A new workspace (`primefs init`: the default files, a git repository) in a temporary folder."""
    from primefs.store.workspace import init_workspace

    monkeypatch.delenv("PRIMEFS_WORKSPACE", raising=False)
    monkeypatch.delenv("PRIMEFS_MODEL", raising=False)
    return init_workspace(tmp_path / "workspace")


class GoalRun:
    def __init__(self, ws):
        self.ws = ws
        self.log: list[str] = []
        self.count = 0

    def __call__(self, task: str, replies: list[dict], **front_matter):
        from primefs.runner.core import Runner
        from primefs.store import trust
        from primefs.store.frontmatter import dump, dump_yaml
        from primefs.store.session import list_sessions
        from primefs.store.workspace import Workspace

        self.count += 1
        script = f"script-{self.count}.yaml"
        (self.ws.root / script).write_text(dump_yaml(list(replies)))
        name = front_matter.setdefault("name", f"test-{self.count}")
        front_matter.setdefault("model", f"scripted/{script}")
        (self.ws.goals / f"{name}.md").write_text(dump(front_matter, task.rstrip() + "\n"))
        trust.trust(self.ws, [p.relative_to(self.ws.root).as_posix() for p in sorted(self.ws.plugins.glob("*.py"))])
        Runner(Workspace(self.ws.root), log=self.log.append).run(once=True)
        found = [s for s in list_sessions(self.ws.sessions) if s.meta.get("name") == name and not s.meta.get("parent")]
        if not found:
            raise AssertionError(f"goal {name!r} was not taken; the runner said:\n" + "\n".join(self.log))
        return found[-1]


@pytest.fixture
def primefs_run(primefs_workspace):
    """run(task, replies, **front_matter) -> Session: a goal run to its end on scripted replies."""
    return GoalRun(primefs_workspace)
