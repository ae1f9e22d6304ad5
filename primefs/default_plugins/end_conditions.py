"""Built-in end conditions: `command` (a shell command passes on exit 0), `file_exists` and `judge` (a
model reads the evidence against a rubric and says whether the goal is met, and why).

In goal front matter each condition is a map with one key, its name:
    end_conditions: [{command: "pytest -q"}, {file_exists: report.md}]
`command` also takes a map: {command: {run: "pytest -q", timeout: 600}}. Both act as the session's kernel
would: a command runs in its sandbox, in its room (`sessions/<id>/work/`), with the kernel's environment
(never the runner's keys); a relative path is a path in its room.
"""
from __future__ import annotations

import re
from pathlib import Path

from primefs import hookimpl
from primefs.store.fsutil import read_regular

REPORT_CHARS = 4000  # what the model sees of a failing command: the last 4,000 characters
EVIDENCE_CHARS = 20_000  # of each piece of evidence shown to a judge (head and tail kept)
JUDGE_PROMPT = """You judge whether an agent's goal is met. Read the goal, the rubric and the evidence, then
reply with one line `VERDICT: pass` or `VERDICT: fail`, and after it, in a few sentences, why.

# Goal
{goal}

# Rubric
{rubric}

# Evidence
{evidence}"""


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


def judge(arg, ctx) -> tuple[bool, str]:
    """{model, rubric, show: {answer: bool (default true), files: [paths in the room], command: str}}."""
    parts = []
    show = arg.get("show") or {}
    if show.get("answer", True):
        parts.append(("the answer", ctx.get("answer") or "(no answer yet)"))
    for rel in show.get("files") or []:
        root = Path(ctx["workspace"]).resolve()
        p = (Path(ctx["room"]) / str(rel)).resolve()
        try:
            text = read_regular(p) if p.is_relative_to(root) else "(outside the workspace)"  # (a FIFO: refused)
        except OSError as exc:
            text = f"(cannot be read: {exc.strerror or exc})"
        parts.append((f"file {rel}", text))
    if show.get("command"):
        code, out = ctx["run"](str(show["command"]), 600.0)
        parts.append((f"`{show['command']}` (exit {code})", out))
    evidence = "\n\n".join(f"## {title}\n{_cut(text)}" for title, text in parts) or "(none)"
    reply = ctx["complete"](str(arg["model"]), JUDGE_PROMPT.format(goal=ctx["goal"], rubric=arg["rubric"],
                                                                    evidence=evidence))
    found = re.search(r"VERDICT:\s*(pass|fail)", reply or "", re.IGNORECASE)
    passed = bool(found) and found.group(1).lower() == "pass"
    reason = (reply[found.end():] if found else reply or "").strip()[:REPORT_CHARS]
    if not found:
        reason = f"the judge's reply has no `VERDICT: pass|fail` line: {reason[:500]}"
    ctx["record"]("judge", model=str(arg["model"]), passed=passed, reason=reason)
    return passed, f"judge {arg['model']}: {'passed' if passed else 'not met'}: {reason}"


def check_judge(arg, where: str, resolve_model) -> None:
    """A judge's settings, checked when the goal is read: its model must resolve (an alias, an id)."""
    from primefs.errors import PrimefsError

    if not isinstance(arg, dict) or not isinstance(arg.get("model"), str) or not isinstance(arg.get("rubric"), str) \
            or not arg["rubric"].strip():
        raise PrimefsError(f"{where}: judge: needs {{model: <alias or id>, rubric: <text>, show: {{answer, files, "
                           f"command}}}}")
    extra = set(arg) - {"model", "rubric", "show"}
    show = arg.get("show") or {}
    if extra or not isinstance(show, dict) or set(show) - {"answer", "files", "command"}:
        raise PrimefsError(f"{where}: judge: unknown key(s) (known: model, rubric, show: answer, files, command)")
    if not isinstance(show.get("files") or [], list) or not isinstance(show.get("answer", True), bool):
        raise PrimefsError(f"{where}: judge: show.files is a list of paths, show.answer true or false")
    try:
        resolve_model(arg["model"])
    except PrimefsError as exc:
        raise PrimefsError(f"{where}: judge: {exc}") from None


judge.check = check_judge  # what parse_goal asks of a condition's argument, where a condition has it


def _cut(text: str) -> str:
    if len(text) <= EVIDENCE_CHARS:
        return text
    half = EVIDENCE_CHARS // 2
    return f"{text[:half]}\n[... {len(text) - EVIDENCE_CHARS:,} characters cut ...]\n{text[-half:]}"


@hookimpl
def register_end_conditions(register):
    register("command", command)
    register("file_exists", file_exists)
    register("judge", judge)
