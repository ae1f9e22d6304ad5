"""Built-in end conditions: `command` (a shell command passes on exit 0) and `file_exists`.

In goal front matter each condition is a map with one key, its name:
    end_conditions: [{command: "pytest -q"}, {file_exists: report.md}]
`command` also takes a map: {command: {run: "pytest -q", timeout: 600}}.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

from . import hookimpl

REPORT_CHARS = 4000  # what the model sees of a failing command: the last 4,000 characters


def command(arg, ctx) -> tuple[bool, str]:
    if isinstance(arg, dict):
        cmd, timeout = str(arg.get("run", "")), float(arg.get("timeout", 600))
    else:
        cmd, timeout = str(arg), 600.0
    try:
        r = subprocess.run(cmd, shell=True, cwd=ctx["workspace"], capture_output=True, text=True,
                           timeout=timeout, errors="replace")
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or "") + (exc.stderr or "") if isinstance(exc.stdout, str) else ""
        return False, f"`{cmd}` timed out after {timeout:g} s\n{out[-REPORT_CHARS:]}"
    out = (r.stdout + r.stderr)[-REPORT_CHARS:]
    verdict = "passed" if r.returncode == 0 else f"failed (exit {r.returncode})"
    return r.returncode == 0, f"`{cmd}` {verdict}\n{out}".rstrip()


def file_exists(arg, ctx) -> tuple[bool, str]:
    root = Path(ctx["workspace"]).resolve()
    p = (root / str(arg)).resolve()
    if not p.is_relative_to(root):
        return False, f"{arg}: outside the workspace"
    return (True, f"{arg} exists") if p.exists() else (False, f"{arg} does not exist yet")


class BuiltinEndConditions:
    @hookimpl
    def register_end_conditions(self, register):
        register("command", command)
        register("file_exists", file_exists)
