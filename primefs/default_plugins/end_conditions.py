"""Built-in end conditions: `command` (a shell command passes on exit 0) and `file_exists`.

In goal front matter each condition is a map with one key, its name:
    end_conditions: [{command: "pytest -q"}, {file_exists: report.md}]
`command` also takes a map: {command: {run: "pytest -q", timeout: 600}}. Both act as the session's kernel
would: a command runs in its sandbox, in its room (`sessions/<id>/work/`), with the kernel's environment
(never the runner's keys); a relative path is a path in its room.
"""
from __future__ import annotations

from pathlib import Path

from primefs import hookimpl

REPORT_CHARS = 4000  # what the model sees of a failing command: the last 4,000 characters


def command(arg, ctx) -> tuple[bool, str]:
    if isinstance(arg, dict):
        cmd, timeout = str(arg.get("run", "")), float(arg.get("timeout", 600))
    else:
        cmd, timeout = str(arg), 600.0
    code, out = ctx["run"](cmd, timeout)
    out = out[-REPORT_CHARS:]
    if code is None:
        return False, f"`{cmd}` timed out after {timeout:g} s\n{out}".rstrip()
    verdict = "passed" if code == 0 else f"failed (exit {code})"
    return code == 0, f"`{cmd}` {verdict}\n{out}".rstrip()


def file_exists(arg, ctx) -> tuple[bool, str]:
    root = Path(ctx["workspace"]).resolve()
    p = (Path(ctx["room"]) / str(arg)).resolve()
    if not p.is_relative_to(root):
        return False, f"{arg}: outside the workspace"
    return (True, f"{arg} exists") if p.exists() else (False, f"{arg} does not exist yet")


@hookimpl
def register_end_conditions(register):
    register("command", command)
    register("file_exists", file_exists)
