"""What a person has trusted: the things in a workspace that make the runner run something or lower a
sandbox. A file appearing is never enough.

- workspace plugins (`plugins/*.py`): imported by the runner and the CLI;
- in primefs.yaml, `mcp_servers:` (commands the runner starts) and a `sandbox:` that lowers the default
  (off, `network: true`, `write:` grants);
- a goal whose `sandbox:` lowers the default;
- for a kernel without the default sandbox, a skill that a kernel wrote (through the harness API: its
  SKILL.md says `primefs: {source: agent}` or `refine`): sandboxed kernels may import any skill, but code
  that another session's model wrote runs with more rights only once a person trusts it.

`primefs trust PATH...` records the content hash of each (for primefs.yaml, of those sections only, so
other edits need no new trust) in `.primefs/trust.json`: runtime, git-ignored (a cloned or copied
workspace carries no trust) and read-only to sandboxed kernels. `primefs init` trusts what it creates. A
changed file is untrusted again until trusted anew. Without a sandbox a kernel can write this file too:
that is what "no sandbox" means (docs/reliability.md).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from primefs.errors import PrimefsError
from primefs.store.fsutil import walk_tree, write_atomic

FILE = "trust.json"
CONFIG = "primefs.yaml"


def lowers(box: dict | None) -> bool:
    """A sandbox setting weaker than the default: none at all, network, or writes beyond the room."""
    return box is None or bool(box.get("network")) or bool(box.get("write"))


def config_sections(config: dict) -> dict:
    """What in primefs.yaml needs trust (empty: nothing does)."""
    from primefs.store.settings import check_sandbox

    out = {}
    if config.get("mcp_servers"):
        out["mcp_servers"] = config["mcp_servers"]
    if config.get("hooks"):
        out["hooks"] = config["hooks"]
    if "sandbox" in config and lowers(check_sandbox(config["sandbox"], CONFIG)):
        out["sandbox"] = config["sandbox"]
    return out


def _digest(data) -> str:
    if not isinstance(data, bytes):
        data = json.dumps(data, sort_keys=True, default=str).encode()
    return hashlib.sha256(data).hexdigest()


def _path(ws) -> Path:
    return ws.state / FILE


def records(ws) -> dict:
    """path -> sha256 of what was trusted (workspace-relative paths; primefs.yaml: its sections)."""
    try:
        data = json.loads(_path(ws).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str)} if isinstance(data, dict) else {}


def current(ws, rel: str) -> str | None:
    """The hash of what `rel` holds now: a file's bytes, a folder's files (a skill), primefs.yaml's
    sections (None: no such file)."""
    if rel == CONFIG:
        return _digest(config_sections(ws.config))
    path = ws.root / rel
    try:
        if path.is_dir() and not path.is_symlink():
            parts = []
            for name, kind, _st, value in walk_tree(path, deep="raise"):  # (too deep: not trusted)
                if kind == "file":
                    with value() as f:
                        parts.append([name, hashlib.sha256(f.read()).hexdigest()])
                elif kind == "link":
                    parts.append([name, "-> " + value])
            return _digest(parts)
        return _digest(path.read_bytes())
    except OSError:
        return None


def trusted(ws, rel: str) -> bool:
    if rel == CONFIG and not config_sections(ws.config):
        return True
    digest = current(ws, rel)
    return digest is not None and records(ws).get(rel) == digest


def trust(ws, paths: list[str]) -> list[str]:
    """Record these files as trusted as they are now; returns their workspace-relative paths."""
    recs = records(ws)
    done = []
    for p in paths:
        rel = relative(ws, p)
        digest = current(ws, rel)
        if digest is None:
            raise PrimefsError(f"no such file in the workspace: {p}")
        recs[rel] = digest
        done.append(rel)
    ws.state.mkdir(exist_ok=True)
    write_atomic(_path(ws), json.dumps(recs, indent=1, sort_keys=True), durable=True)
    return done


def revoke(ws, paths: list[str]) -> list[str]:
    recs = records(ws)
    gone = [rel for rel in (relative(ws, p) for p in paths) if recs.pop(rel, None) is not None]
    write_atomic(_path(ws), json.dumps(recs, indent=1, sort_keys=True), durable=True)
    return gone


def relative(ws, p: str) -> str:
    """A path given on a command line: absolute, or relative to the current folder, else to the
    workspace (`primefs trust plugins/x.py` from anywhere in it)."""
    path = Path(p)
    if path.is_absolute():
        path = path.resolve()
    else:
        here = (Path.cwd() / path).resolve()
        path = here if here.exists() and here.is_relative_to(ws.root) else (ws.root / p).resolve()
    if not path.is_relative_to(ws.root):
        raise PrimefsError(f"{p} is not in the workspace {ws.root}")
    return path.relative_to(ws.root).as_posix()


def needing_trust(ws) -> list[dict]:
    """Everything that would be used only once trusted: {path, what, trusted}."""
    from primefs.store.goals import goal_listing

    out = []
    if config_sections(ws.config):
        out.append({"path": CONFIG, "what": ", ".join(config_sections(ws.config)), "trusted": trusted(ws, CONFIG)})
    for p in sorted(ws.plugins.glob("*.py")):
        rel = p.relative_to(ws.root).as_posix()
        out.append({"path": rel, "what": "workspace plugin", "trusted": trusted(ws, rel)})
    files, _ = goal_listing(ws)
    for p in files:
        rel = p.relative_to(ws.root).as_posix()
        if goal_lowers_sandbox(ws, p):
            out.append({"path": rel, "what": "goal with a weaker sandbox", "trusted": trusted(ws, rel)})
    for folder in sorted(skills_refused(ws, [str(ws.harness / "skills")])):
        rel = Path(folder).relative_to(ws.root).as_posix()
        out.append({"path": rel, "what": "skill a kernel wrote (for kernels without a sandbox)", "trusted": False})
    return out


WRITTEN_BY_KERNELS = ("agent", "refine")  # harness.put's `source` for what a kernel or a refinement wrote


def skills_refused(ws, skill_dirs: list[str]) -> dict[str, str]:
    """skill folder -> why a kernel without the default sandbox does not load it: written by a kernel, and
    not trusted since."""
    from primefs.store import frontmatter

    out = {}
    for parent in skill_dirs:
        for folder in sorted(Path(parent).iterdir()) if Path(parent).is_dir() else []:
            try:
                meta, _ = frontmatter.read(folder / "SKILL.md", str(folder), root=ws.root)
            except PrimefsError:
                continue
            pf = meta.get("primefs") if isinstance(meta.get("primefs"), dict) else {}
            rel = folder.relative_to(ws.root).as_posix()
            if pf.get("source") in WRITTEN_BY_KERNELS and not trusted(ws, rel):
                out[str(folder)] = (f"skill {folder.name!r} was written by a session's kernel ({pf.get('session') or '?'}); "
                                    "this session has no sandbox, so it loads it only once a person trusts it: "
                                    f"`primefs trust {rel}`")
    return out


def goal_lowers_sandbox(ws, path: Path) -> bool:
    from primefs.store import frontmatter
    from primefs.store.settings import check_sandbox

    try:
        meta, _ = frontmatter.read(path, path.name, root=ws.root)
        return "sandbox" in meta and lowers(check_sandbox(meta["sandbox"], path.name, ws.root))
    except PrimefsError:
        return False


def trust_new_workspace(ws) -> None:
    """`primefs init`: the person made it, from the template or a source they chose."""
    trust(ws, [CONFIG, *(str(p) for p in sorted(ws.plugins.glob("*.py")))])


def untrusted_note(rel: str, what: str) -> str:
    return f"{rel}: {what} not used: it is not trusted (new, or changed since). Run `primefs trust {rel}` if you wrote it"
