"""Goal files: goals/<name>.md, optional front matter, body = the task. Each is picked up once."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from . import frontmatter
from .errors import PrimefsError
from .fsutil import check_name, write_new
from .goalctl import check_budget, check_end_conditions
from .heartbeat import from_spec
from .tools import check_selection
from .workspace import Workspace, check_limits

GOAL_KEYS = {"model", "name", "context", "limits", "autonomous", "budget", "end_conditions", "heartbeat", "tools"}


@dataclass
class Goal:
    path: Path
    rel: str  # path relative to the workspace: how sessions refer to it
    name: str
    task: str
    model: str
    settings: dict
    context: list[str] = field(default_factory=list)
    limits: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict)
    control: dict = field(default_factory=dict)  # autonomous, budget, end_conditions, heartbeat, tools


def goal_files(ws: Workspace) -> list[Path]:
    if not ws.goals.is_dir():
        return []
    return sorted(p for p in ws.goals.iterdir() if p.suffix == ".md" and not p.name.startswith(".") and p.is_file())


def parse_goal(ws: Workspace, path: Path, conditions: dict | None = None) -> Goal:
    """Read and validate a goal file. Any problem raises PrimefsError naming the file (and line).

    `conditions`: the registered end conditions, to refuse unknown names (None: shape only)."""
    rel = path.relative_to(ws.root).as_posix()
    meta, body = frontmatter.read(path, rel)
    unknown = set(meta) - GOAL_KEYS
    if unknown:
        raise PrimefsError(f"{rel}: unknown front matter key(s): {', '.join(sorted(map(str, unknown)))} "
                           f"(known: {', '.join(sorted(GOAL_KEYS))})")
    task = body.strip()
    if not task:
        raise PrimefsError(f"{rel}: the goal has no task text (the body after the front matter is empty)")
    name = str(meta.get("name") or path.stem)
    check_name(name, f"goal name in {rel}")
    context = meta.get("context") or []
    if isinstance(context, str):
        context = [context]
    if not isinstance(context, list):
        raise PrimefsError(f"{rel}: `context:` must be a file path or a list of file paths")
    context = [check_context_path(ws, str(c), rel) for c in context]
    limits = meta.get("limits") or {}
    if not isinstance(limits, dict):
        raise PrimefsError(f"{rel}: `limits:` must be a mapping")
    check_limits(limits, rel)
    control = {}
    if "autonomous" in meta:
        if not isinstance(meta["autonomous"], bool):
            raise PrimefsError(f"{rel}: `autonomous:` must be true or false")
        control["autonomous"] = meta["autonomous"]
    if meta.get("budget") is not None:
        control["budget"] = check_budget(meta["budget"], rel)
    if meta.get("end_conditions") is not None:
        control["end_conditions"] = check_end_conditions(meta["end_conditions"], rel, conditions)
    if "tools" in meta:
        control["tools"] = check_selection(meta["tools"], rel)
    if meta.get("heartbeat") is not None:
        try:
            from_spec(meta["heartbeat"])
        except PrimefsError as exc:
            raise PrimefsError(f"{rel}: {exc}") from None
        control["heartbeat"] = meta["heartbeat"]
    model = str(meta.get("model") or ws.default_model())
    try:
        settings = ws.resolve_model(model)
    except PrimefsError as exc:
        raise PrimefsError(f"{rel}: {exc}") from None
    return Goal(path=path, rel=rel, name=name, task=task, model=model, settings=settings,
                context=context, limits=dict(limits), meta=dict(meta), control=control)


def check_context_path(ws: Workspace, rel: str, where: str) -> str:
    p = (ws.root / rel).resolve()
    if not p.is_relative_to(ws.root):
        raise PrimefsError(f"{where}: context file {rel!r} is outside the workspace")
    if not p.is_file():
        raise PrimefsError(f"{where}: context file not found: {rel}")
    return p.relative_to(ws.root).as_posix()


def _slug(text: str) -> str:
    words = re.findall(r"[a-z0-9]+", text.lower())[:6]
    return "-".join(words) or "goal"


def write_goal(ws: Workspace, text: str, *, model: str | None = None, name: str | None = None,
               context: list[str] | None = None, extra: dict | None = None) -> Path:
    """`primefs goal`: validate, then write goals/<name>.md atomically (the runner never sees half a goal)."""
    if not text.strip():
        raise PrimefsError("the goal text is empty")
    if name:
        check_name(name, "goal name")
    if model:
        ws.resolve_model(model)
    cwd = Path.cwd().resolve()
    rels = []
    for c in context or []:
        p = (cwd / c).resolve() if not Path(c).is_absolute() else Path(c).resolve()
        if not p.is_file() and (ws.root / c).is_file():
            p = (ws.root / c).resolve()
        if not p.is_file():
            raise PrimefsError(f"context file not found: {c}")
        if not p.is_relative_to(ws.root):
            raise PrimefsError(f"context file {c} is outside the workspace {ws.root}; copy it in first")
        rels.append(p.relative_to(ws.root).as_posix())
    meta: dict = {}
    if name:
        meta["name"] = name
    if model:
        meta["model"] = model
    if rels:
        meta["context"] = rels
    meta.update(extra or {})
    stem = name or f"{datetime.now().strftime('%Y%m%d-%H%M%S')}-{_slug(text)}"
    ws.goals.mkdir(exist_ok=True)
    content = frontmatter.dump(meta, text.strip() + "\n")
    i = 1
    while True:  # link() refuses to replace: two concurrent `primefs goal` never share a file
        path = ws.goals / (f"{stem}.md" if i == 1 else f"{stem}-{i}.md")
        if write_new(path, content):
            break
        i += 1
    return path
