"""runner/watcher.py: what a changed path means to the runner. Real: a workspace (its paths) and meaning();
no runner, no file watch: the paths are given, not seen changing."""
from __future__ import annotations

from primefs.runner.liverequests import requests_dir
from primefs.runner.watcher import meaning


def test_what_a_changed_path_means(ws):
    root, sid = ws.root, "261202-050000000-abc"
    cases = {
        requests_dir(ws) / "x.json": ("request", None),
        root / "goals" / "report.md": ("goal", None),
        root / "goals" / ".report.md.tmp": ("goals", None),
        root / "goals" / "notes.txt": ("goals", None),
        root / "harness" / "skills" / "a" / "SKILL.md": ("harness", None),
        root / "sessions" / sid / "harness" / "notes": ("harness", sid),
        root / "sessions" / sid: ("session", sid),
        root / "sessions" / sid / "mail" / "new" / "m1": ("session", sid),
        root / "sessions" / sid / "stop.request": ("session", sid),
        root / "sessions" / sid / "session.yaml": ("session", sid),
        root / "sessions" / sid / "history.jsonl": ("", None),  # written at every event: never a reason to look
        root / "sessions" / sid / "summary.json": ("", None),
        root / "sessions": ("sessions", None),
        root / "primefs.yaml": ("", None),
        root.parent / "elsewhere": ("", None),
    }
    assert {str(p): meaning(ws, p) for p in cases} == {str(p): want for p, want in cases.items()}
