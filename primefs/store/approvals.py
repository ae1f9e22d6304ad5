"""Approvals as files: the policy (`approve:` in primefs.yaml and in goal front matter) and the requests,
`sessions/<id>/approvals/<n>.md` (docs/long-running.md, "Approvals").

Only the runner writes a request file (a sandboxed kernel writes its room, not this folder). The answer is
never a file in the session's folder: `primefs approve/deny`, `primefs attach` and the web view hand it to
the running runner (control.ask_runner), which alone knows which requests wait.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

from primefs.errors import PrimefsError
from primefs.store import frontmatter
from primefs.store.fsutil import write_atomic

KEYS = ("cells", "tools", "children", "cost_usd", "timeout_s", "default")
VERDICTS = ("approve", "deny")
# A name for what is hard to list by hand; any other entry is a regular expression searched in the code.
SHORTHANDS = {
    "network": r"\b(socket|urllib\d?|http\.client|requests|httpx|aiohttp|ftplib|smtplib|websockets?)\b",
    "subprocess": r"\b(subprocess|os\.system|os\.popen|os\.exec\w*|os\.spawn\w*|pty\.spawn)\b",
}
STATES = ("waiting", "approved", "denied", "void")


@dataclass(frozen=True)
class Policy:
    """What needs a person's yes. Empty: nothing does."""
    cells: tuple[str, ...] = ()
    tools: frozenset[str] = frozenset()
    children: int | None = None
    cost_usd: tuple[float, ...] = ()
    timeout_s: float | None = None
    default: str = "deny"

    def cell_rule(self, code: str) -> str | None:
        """The first `cells` entry the code matches, or None."""
        for rule in self.cells:
            if re.search(SHORTHANDS.get(rule, rule), code):
                return rule
        return None

    def __bool__(self) -> bool:
        return bool(self.cells or self.tools or self.children is not None or self.cost_usd)


def check_approve(value, where: str) -> dict:
    """`approve:` well formed; returns it as plain data (lists, numbers). Each error names the setting."""
    if not isinstance(value, dict):
        raise PrimefsError(f"{where}: `approve:` must be a mapping (keys: {', '.join(KEYS)})")
    unknown = sorted(map(str, set(value) - set(KEYS)))
    if unknown:
        raise PrimefsError(f"{where}: approve: unknown key(s) {', '.join(unknown)} (known: {', '.join(KEYS)})")
    out: dict = {}
    for key in ("cells", "tools"):
        items = value.get(key)
        if items is None:
            continue
        items = [items] if isinstance(items, str) else items
        if not isinstance(items, list) or not all(isinstance(i, str) and i.strip() for i in items):
            raise PrimefsError(f"{where}: approve.{key} must be a list of " +
                               ("patterns (regular expressions, or network / subprocess)" if key == "cells"
                                else "tool names"))
        out[key] = [str(i) for i in items]
    for i, rule in enumerate(out.get("cells", [])):
        try:
            re.compile(SHORTHANDS.get(rule, rule))
        except re.error as exc:
            raise PrimefsError(f"{where}: approve.cells[{i}]: {rule!r} is not a regular expression ({exc})") from None
    n = value.get("children")
    if n is not None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise PrimefsError(f"{where}: approve.children must be a whole number of children (0 or more), "
                               f"not {n!r}: spawning more than that many needs a yes")
        out["children"] = n
    marks = value.get("cost_usd")
    if marks is not None:
        marks = marks if isinstance(marks, list) else [marks]
        if not marks or not all(isinstance(m, (int, float)) and not isinstance(m, bool) and m >= 0 for m in marks):
            raise PrimefsError(f"{where}: approve.cost_usd must be a cost in USD (or a list of them), 0 or more")
        out["cost_usd"] = sorted(float(m) for m in marks)
    t = value.get("timeout_s")
    if t is not None:
        if isinstance(t, bool) or not isinstance(t, (int, float)) or t <= 0:
            raise PrimefsError(f"{where}: approve.timeout_s must be a number of seconds above 0, not {t!r}")
        out["timeout_s"] = float(t)
    default = value.get("default", "deny")
    if default not in VERDICTS:
        raise PrimefsError(f"{where}: approve.default (the verdict when timeout_s passes) is approve or deny, "
                           f"not {default!r}")
    out["default"] = default
    return out


def policy(*values) -> Policy:
    """The policy of checked `approve:` values together (the workspace's, the goal's): every rule of each
    holds; of the children limits and timeouts the smaller, of the default verdicts deny if one says it."""
    parts = [v for v in values if v]
    if not parts:
        return Policy()
    children = [p["children"] for p in parts if p.get("children") is not None]
    timeouts = [p["timeout_s"] for p in parts if p.get("timeout_s") is not None]
    return Policy(cells=tuple(dict.fromkeys(r for p in parts for r in p.get("cells", []))),
                  tools=frozenset(t for p in parts for t in p.get("tools", [])),
                  children=min(children) if children else None,
                  cost_usd=tuple(sorted({m for p in parts for m in p.get("cost_usd", [])})),
                  timeout_s=min(timeouts) if timeouts else None,
                  default="deny" if any(p.get("default", "deny") == "deny" for p in parts) else "approve")


# -- request files --------------------------------------------------------------------------------------
def folder(session_dir: Path) -> Path:
    return Path(session_dir) / "approvals"


def path_of(session_dir: Path, n: int) -> Path:
    return folder(session_dir) / f"{n}.md"


def numbers(session_dir: Path) -> list[int]:
    try:
        names = [p.stem for p in folder(session_dir).iterdir() if p.suffix == ".md"]
    except OSError:
        return []
    return sorted(int(s) for s in names if s.isdigit())


def write(session_dir: Path, n: int, meta: dict, body: str) -> Path:
    folder(session_dir).mkdir(exist_ok=True)
    path = path_of(session_dir, n)
    write_atomic(path, frontmatter.dump(meta, body))
    return path


def read(session_dir: Path, n: int) -> tuple[dict, str]:
    """A request's front matter and text; raises FileProblem (naming the file) if it cannot be read."""
    meta, body = frontmatter.read(path_of(session_dir, n), f"sessions/{Path(session_dir).name}/approvals/{n}.md",
                                  safe=True)
    return dict(meta), body


def code_of(body: str) -> str | None:
    """The code a request shows (the cell's, a tool call's arguments, a child's task), from its text."""
    found = re.search(r"^```python\n(.*?)\n```$", body, re.S | re.M)
    return found.group(1) if found else None


def listing(session_dir: Path, waiting_only: bool = False) -> list[dict]:
    """The session's requests (their front matter and `path`), oldest first; an unreadable one as
    `{"n", "status": "broken", "problem"}`."""
    out = []
    for n in numbers(session_dir):
        try:
            meta, _ = read(session_dir, n)
            if meta.get("status") not in STATES:
                raise PrimefsError(f"sessions/{Path(session_dir).name}/approvals/{n}.md: no status of "
                                   f"{', '.join(STATES)} (changed by hand?)")
        except PrimefsError as exc:
            meta = {"n": n, "status": "broken", "problem": str(exc)}
        if not waiting_only or meta.get("status") == "waiting":
            out.append({**meta, "n": n, "path": str(path_of(session_dir, n))})
    return out


def answered(session_dir: Path, n: int, status: str, **fields) -> None:
    """Mark request n approved, denied or void (with who answered, how and why), in its file."""
    assert status in STATES, status
    try:
        meta, body = read(session_dir, n)
    except PrimefsError:
        meta, body = {"n": n}, ""
    meta.update(status=status, answered=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                **{k: v for k, v in fields.items() if v is not None})
    who = f" by {fields['by']}" if fields.get("by") else ""
    why = f": {fields['reason']}" if fields.get("reason") else ""
    write(session_dir, n, meta, body.rstrip("\n") + f"\n\n## Answer\n\n{status}{who}{why}\n")


def answer(ws, sid: str, n: int | None, verdict: str, reason: str | None, via: str, by: str | None = None) -> dict:
    """A person's answer to request n of session sid (None: its only waiting one), handed to the running
    runner: `{"session", "approval", "verdict"}`. Raises PrimefsError saying why it cannot be given."""
    import getpass

    from primefs.store.control import ask_runner, lock_held

    if not lock_held(ws):  # requests wait only under a runner: one a stopped runner left is void
        left = [m["n"] for m in listing(ws.sessions / sid, waiting_only=True) if n in (None, m["n"])]
        raise PrimefsError(f"approval {left[0]} of {sid} no longer waits: the runner that asked it stopped (the "
                           "session asks again when it runs)" if left else f"session {sid} waits for no approval"
                           + ("" if n is None else f" {n}") + " (no runner is running)")
    return ask_runner(ws, {"op": "approve", "session": sid, "n": n, "verdict": verdict, "reason": reason,
                           "by": by or getpass.getuser(), "via": via}, 30)
