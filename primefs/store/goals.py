"""Goal files: goals/<name>.md, optional front matter, body = the task. Each is picked up once."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from primefs.errors import PrimefsError
from primefs.store import frontmatter
from primefs.store.fsutil import check_name, write_atomic, write_new
from primefs.store.approvals import check_approve
from primefs.store.heartbeat import from_spec
from primefs.store.settings import (
    check_budget,
    check_end_conditions,
    check_limits,
    check_resources,
    check_sandbox,
    kind_of,
)
from primefs.store.workspace import Workspace
from primefs.store.worktrees import check_repo
from primefs.tools.registry import check_selection

GOAL_KEYS = {"model", "name", "context", "context_data", "limits", "autonomous", "budget", "end_conditions",
             "heartbeat", "tools", "sandbox", "resources", "approve", "worktree"}
MAX_CONTEXT_FILES = 10_000
MAX_PATH_CHARS = 4096


@dataclass
class Goal:
    path: Path
    rel: str  # path relative to the workspace: how sessions refer to it
    name: str
    task: str
    model: str
    settings: dict
    context: list[str] = field(default_factory=list)
    data: str | None = None  # `context_data:`: a file whose text (or JSON data, for .json) is `context`
    limits: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict)
    control: dict = field(default_factory=dict)  # autonomous, budget, end_conditions, heartbeat, tools, resources


def goal_files(ws: Workspace) -> list[Path]:
    return goal_listing(ws)[0]


def goal_listing(ws: Workspace) -> tuple[list[Path], list[str]]:
    """(goal files, what else is in goals/ and is not a goal: said to the user, never a task).
    Names starting with '.' (editors' temporary files) are left alone."""
    if not ws.goals.is_dir():
        return [], []
    files, strays = [], []
    for p in sorted(ws.goals.iterdir()):
        if p.name.startswith("."):
            continue
        if p.suffix == ".md" and p.is_file():
            files.append(p)
        else:
            what = "a folder" if p.is_dir() else "not a .md file" if p.suffix != ".md" else "not a regular file"
            strays.append(f"goals/{p.name}: ignored, {what} (a goal is a goals/<name>.md file)")
    return files, strays


def parse_goal(ws: Workspace, path: Path, conditions: dict | None = None) -> Goal:
    """Read and validate a goal file. Any problem raises PrimefsError naming the file (and line).

    `conditions`: the registered end conditions, to refuse unknown names (None: shape only)."""
    rel = path.relative_to(ws.root).as_posix()
    meta, body = frontmatter.read(path, rel, root=ws.root)  # a link out of the workspace is refused
    unknown = set(meta) - GOAL_KEYS
    if unknown:
        raise PrimefsError(f"{rel}: unknown front matter key(s): {', '.join(sorted(map(str, unknown)))} "
                           f"(known: {', '.join(sorted(GOAL_KEYS))})")
    task = body.strip()
    if not task:
        raise PrimefsError(f"{rel}: the goal has no task text (the body after the front matter is empty)")
    name = meta.get("name") or path.stem
    if not isinstance(name, str):
        raise PrimefsError(f"{rel}: `name:` must be text, not {kind_of(name)}")
    check_name(name, f"goal name in {rel}")
    context = _goal_context(ws, meta, rel)
    data = meta.get("context_data")
    if data is not None:
        if not isinstance(data, str) or context:
            raise PrimefsError(f"{rel}: `context_data:` must be one file path, and not given with `context:`")
        data = check_context_path(ws, data, rel)
    limits = check_limits(meta.get("limits") or {}, rel)
    control = _goal_control(ws, meta, rel, conditions)
    if meta.get("model") is not None and not isinstance(meta["model"], str):
        raise PrimefsError(f"{rel}: `model:` must be text, not {kind_of(meta['model'])}")
    model = str(meta.get("model") or ws.default_model())
    try:
        settings = ws.resolve_model(model)
    except PrimefsError as exc:
        raise PrimefsError(f"{rel}: {exc}") from None
    return Goal(path=path, rel=rel, name=name, task=task, model=model, settings=settings,
                context=context, data=data, limits=dict(limits), meta=dict(meta), control=control)


def _goal_context(ws: Workspace, meta: dict, rel: str) -> list[str]:
    """`context:`: the goal's files, as workspace-relative paths (checked: check_context_path)."""
    context = meta.get("context") or []
    if isinstance(context, str):
        context = [context]
    if not isinstance(context, list) or not all(isinstance(c, str) for c in context):
        raise PrimefsError(f"{rel}: `context:` must be a file path or a list of file paths")
    if len(context) > MAX_CONTEXT_FILES:
        raise PrimefsError(f"{rel}: `context:` names {len(context)} files; at most {MAX_CONTEXT_FILES}")
    return [check_context_path(ws, c, rel) for c in context]


def _goal_control(ws: Workspace, meta: dict, rel: str, conditions: dict | None) -> dict:
    """Goal.control: what the front matter says of how the goal's session runs and ends (autonomous, budget,
    end_conditions, tools, heartbeat, sandbox, resources, approve, worktree), each checked; only the keys given."""
    control = {}
    if "autonomous" in meta:
        if not isinstance(meta["autonomous"], bool):
            raise PrimefsError(f"{rel}: `autonomous:` must be true or false")
        control["autonomous"] = meta["autonomous"]
    if meta.get("budget") is not None:
        control["budget"] = check_budget(meta["budget"], rel)
    if meta.get("end_conditions") is not None:
        control["end_conditions"] = check_end_conditions(meta["end_conditions"], rel, conditions)
        for cond in control["end_conditions"]:  # a condition may check its own argument (judge: its model)
            (name, arg), = cond.items()
            check = getattr((conditions or {}).get(name), "check", None)
            if check is not None:
                check(arg, rel, ws.resolve_model)
    if "tools" in meta:
        control["tools"] = check_selection(meta["tools"], rel)
    if meta.get("heartbeat") is not None:
        try:
            from_spec(meta["heartbeat"])
        except PrimefsError as exc:
            raise PrimefsError(f"{rel}: {exc}") from None
        control["heartbeat"] = meta["heartbeat"]
    if meta.get("sandbox") is not None:
        control["sandbox"] = check_sandbox(meta["sandbox"], rel, ws.root) or False
        from primefs.store import trust

        if trust.lowers(control["sandbox"] or None) and not trust.trusted(ws, rel):
            raise PrimefsError(f"{rel}: its `sandbox:` is weaker than the default (off, network or write grants), "
                               f"which only a goal you trust may ask: run `primefs trust {rel}` if you wrote it")
    if meta.get("resources") is not None:  # what its kernels need from a node (hosts other than local)
        control["resources"] = check_resources(meta["resources"], f"{rel}: resources")
    if meta.get("approve") is not None:  # what needs a person's yes, besides what primefs.yaml names
        control["approve"] = check_approve(meta["approve"], rel)
    if meta.get("worktree") is not None:  # its own git worktree of this repository (made at its first turn)
        control["worktree"] = check_repo(ws, meta["worktree"], f"{rel}: worktree")
    return control


def check_context_path(ws: Workspace, rel: str, where: str) -> str:
    """A context file: a regular file inside the workspace (after following links), by a sane path."""
    shown = rel if len(rel) <= 80 else rel[:77] + "..."
    if "\0" in rel or len(rel) > MAX_PATH_CHARS:
        raise PrimefsError(f"{where}: context path {shown!r} is not a usable path "
                           f"(a NUL byte, or over {MAX_PATH_CHARS} characters)")
    try:
        p = (ws.root / rel).resolve()
        inside = p.is_relative_to(ws.root)
        found = inside and p.is_file()
    except (OSError, ValueError, RuntimeError) as exc:  # ENAMETOOLONG, link loops
        raise PrimefsError(f"{where}: context path {shown!r} cannot be used: {exc}") from None
    if not inside:
        raise PrimefsError(f"{where}: context file {shown!r} is outside the workspace")
    if not found:
        raise PrimefsError(f"{where}: context file not found: {shown}")
    return p.relative_to(ws.root).as_posix()


def _slug(text: str) -> str:
    words = re.findall(r"[a-z0-9]+", text.lower())[:6]
    return "-".join(words) or "goal"


DATA_DIR = ".data"  # goals/.data/: the values programs hand a goal as its context (goal_listing skips it)


def write_goal(ws: Workspace, text: str, *, model: str | None = None, name: str | None = None,
               context: list[str] | None = None, data=None, extra: dict | None = None) -> Path:
    """`primefs goal`: validate, then write goals/<name>.md atomically (the runner never sees half a goal).

    `data`: a value to be the session's `context` (str, or JSON-able data), written once, before the goal,
    to goals/.data/ and named by its `context_data:`; the runner copies it into the session's folder."""
    if not text.strip():
        raise PrimefsError("the goal text is empty")
    if data is not None and context:
        raise PrimefsError("give the context as files or as a value, not both")
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
    if data is not None:
        meta["context_data"] = _write_data(ws, data)
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


def _write_data(ws: Workspace, data) -> str:
    """A goal's context value as a file of goals/.data/ (str -> .txt, data -> .json); its workspace path."""
    import secrets

    from primefs.store.session import context_files

    try:
        [(name, text)] = context_files(data).items()
    except (TypeError, ValueError) as exc:
        raise PrimefsError(f"the context must be text, JSON-able data or file paths: {exc}") from None
    suffix = Path(name).suffix
    folder = ws.goals / DATA_DIR
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{datetime.now():%Y%m%d-%H%M%S}-{secrets.token_hex(4)}{suffix}"
    write_atomic(path, text)  # durable before the goal names it
    return path.relative_to(ws.root).as_posix()
