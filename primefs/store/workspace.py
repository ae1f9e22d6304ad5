"""The workspace: a git-versioned folder of plain files. Finding it, creating it, its config."""
from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import stat
import subprocess
import tempfile
from functools import cached_property
from importlib.util import find_spec
from pathlib import Path

from primefs.errors import PrimefsError
from primefs.store.frontmatter import load_yaml
from primefs.store.settings import TOOL_MODES, Limits, check_config, check_limits

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"
CONFIG = "primefs.yaml"


def find_workspace(explicit: str | None = None) -> "Workspace":
    """-w DIR, else $PRIMEFS_WORKSPACE, else the current folder or the nearest parent with primefs.yaml."""
    start = explicit or os.environ.get("PRIMEFS_WORKSPACE")
    if start:
        root = Path(start).expanduser().resolve()
        if not (root / CONFIG).is_file():
            raise PrimefsError(f"no primefs workspace at {root} (no {CONFIG}); create one with `primefs init {start}`")
        return Workspace(root)
    here = Path.cwd().resolve()
    for d in (here, *here.parents):
        if (d / CONFIG).is_file():
            return Workspace(d)
    raise PrimefsError("not inside a primefs workspace (no primefs.yaml here or above); "
                       "run `primefs init DIR`, or pass -w DIR / set PRIMEFS_WORKSPACE")


def init_workspace(target: Path, source: Path | None = None) -> "Workspace":
    """Create a workspace from templates/ (or from `source`, e.g. example_workspace/), then git init + commit."""
    target = Path(target).expanduser().resolve()
    if (target / CONFIG).exists():
        raise PrimefsError(f"{target} is already a primefs workspace; refusing to overwrite it")
    if target.exists() and any(p.name != ".git" for p in target.iterdir()):
        raise PrimefsError(f"{target} exists and is not empty; choose a new or empty folder")
    src = Path(source) if source else TEMPLATES
    if not (src / CONFIG).is_file():
        raise PrimefsError(f"{src} is not a workspace template (no {CONFIG})")
    try:
        shutil.copytree(src, target, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns(".git", "__pycache__", ".primefs"))
    except OSError as exc:
        raise PrimefsError(f"cannot create the workspace at {target}: {exc.strerror or exc}") from None
    ws = Workspace(target)
    for d in ("goals", "sessions", "plugins", "harness/notes", "harness/memory", "harness/skills", "harness/agents"):
        (target / d).mkdir(parents=True, exist_ok=True)
    git = ["git", "-C", str(target)]
    if not (target / ".git").exists():
        subprocess.run([*git, "init", "-q"], check=True, env=git_env())
        # index version 4 and the untracked cache: `git status` of 10,000 sessions 0.16 s instead of 0.45 s
        subprocess.run([*git, "config", "feature.manyFiles", "true"], check=True, env=git_env())
    env = git_env()
    subprocess.run([*git, "add", "-A"], check=True, env=env)
    subprocess.run([*git, "commit", "-q", "-m", "primefs: new workspace"], check=True, env=env)
    from primefs.store.trust import trust_new_workspace

    trust_new_workspace(ws)
    return ws


# Every git primefs runs: no hooks and no fsmonitor, whatever a repository says (a file a kernel could have
# written must never make the runner run a command). Kernels' files get no clean filter (gitops.ROOM_ATTRIBUTES).
GIT_SAFE = (("core.hooksPath", "/dev/null"), ("core.fsmonitor", "false"))


def git_env() -> dict:
    """The environment of every git command primefs runs: an identity unless the user has one (git
    refuses to commit without), and GIT_SAFE's settings over any the repository has."""
    env = dict(os.environ)
    for key, value in (("GIT_AUTHOR_NAME", "primefs"), ("GIT_AUTHOR_EMAIL", "primefs@localhost"),
                       ("GIT_COMMITTER_NAME", "primefs"), ("GIT_COMMITTER_EMAIL", "primefs@localhost")):
        env.setdefault(key, value)
    base = int(env.get("GIT_CONFIG_COUNT") or 0) if str(env.get("GIT_CONFIG_COUNT", "0")).isdigit() else 0
    for i, (key, value) in enumerate(GIT_SAFE, base):
        env[f"GIT_CONFIG_KEY_{i}"], env[f"GIT_CONFIG_VALUE_{i}"] = key, value
    env["GIT_CONFIG_COUNT"] = str(base + len(GIT_SAFE))
    return env


class Workspace:
    def __init__(self, root: Path):
        self.root = Path(root).resolve()
        self.goals = self.root / "goals"
        self.sessions = self.root / "sessions"
        self.harness = self.root / "harness"
        self.plugins = self.root / "plugins"
        self.state = self.root / ".primefs"  # runtime only, git-ignored

    @cached_property
    def runtime(self) -> Path:
        """Short private folder for sockets and kernel connection files (unix socket paths max ~107 chars)."""
        digest = hashlib.sha1(str(self.root).encode()).hexdigest()[:12]
        mine = Path(tempfile.gettempdir()) / f"primefs-{os.getuid()}"
        for folder, others in ((mine, 0o022), (mine / digest, 0o077)):  # others may not write / not enter
            folder.mkdir(exist_ok=True, mode=0o700)
            st = os.lstat(folder)  # made by someone else first (/tmp is everyone's): never use it
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & others:
                raise PrimefsError(f"{folder} is not a private folder of yours (a link, another user's, or open "
                                   "to others): remove it, or set TMPDIR to another folder")
        return mine / digest

    # -- config -----------------------------------------------------------------------------------
    @cached_property
    def config(self) -> dict:
        """primefs.yaml, checked whole (a bad file is one error naming the key and the allowed values)."""
        return self._read_config()

    def _read_config(self) -> dict:
        return check_config(load_yaml(self.root / CONFIG, label=CONFIG) or {}, CONFIG, self.root) or {}

    def config_stamp(self) -> tuple:
        try:
            st = (self.root / CONFIG).stat()
            return st.st_mtime_ns, st.st_size, st.st_ino
        except OSError:
            return ()

    def reload_config(self) -> dict:
        """Read primefs.yaml again (the runner, when the file changed). A broken file raises
        PrimefsError and the config read before stays in force."""
        fresh = self._read_config()  # check_config checks the limits too
        self.__dict__["config"] = fresh  # replaces the cached_property's value
        return fresh

    def limits(self, overrides: dict | None = None) -> Limits:
        """primefs.yaml's limits (checked), then `overrides` (a session's own, checked when it was made)."""
        return Limits.of({**check_limits(self.config.get("limits") or {}, CONFIG), **(overrides or {})})

    def ray_host(self) -> dict | None:
        """The `kind: ray` entry of `hosts:` in primefs.yaml (address, resources per kernel), if any."""
        from primefs.store.settings import check_hosts

        return next((h for h in check_hosts(self.config.get("hosts") or [], CONFIG) if h["kind"] == "ray"), None)

    def default_model(self) -> str:
        return os.environ.get("PRIMEFS_MODEL") or self.config.get("model") or "local"

    def resolve_model(self, name: str) -> dict:
        """Model name (alias or provider id) -> settings dict with `model` and `tool_mode`."""
        aliases = self.config.get("models") or {}
        if name in aliases:
            settings = copy.deepcopy(dict(aliases[name] or {}))
            if "model" not in settings:
                raise PrimefsError(f"{CONFIG}: model alias {name!r} has no `model:` key")
            settings["model"] = str(settings["model"])
            if settings["model"] in aliases and settings["model"] != name:
                raise PrimefsError(f"{CONFIG}: model alias {name!r} points to another alias; give a model id")
        elif is_model_id(name):
            settings = {"model": name}
        else:
            known = ", ".join(sorted(aliases)) or "none"
            raise PrimefsError(f"unknown model {name!r}: not an alias in {CONFIG} (aliases: {known}) "
                               "and not a litellm model id (use provider/model, e.g. openai/gpt-4o-mini)")
        mode = settings.setdefault("tool_mode", "fenced" if settings["model"].split("/")[0] == "local" else "native")
        if mode not in TOOL_MODES:
            raise PrimefsError(f"{CONFIG}: tool_mode of {name!r} must be native or fenced, not {mode!r}")
        return settings


def is_model_id(name: str) -> bool:
    """provider/model ids, our own providers, and bare ids litellm knows (read from its price list file)."""
    if not name or any(c.isspace() for c in name):
        return False
    if "/" in name or name == "local":
        return True
    return name in _litellm_model_names()


_MODEL_NAMES: set[str] | None = None


def _litellm_model_names() -> set[str]:
    # Reading litellm's bundled price list is ~10x cheaper than importing litellm.
    global _MODEL_NAMES
    if _MODEL_NAMES is None:
        spec = find_spec("litellm")
        names: set[str] = set()
        if spec and spec.origin:
            f = Path(spec.origin).parent / "model_prices_and_context_window_backup.json"
            if f.is_file():
                names = set(json.loads(f.read_text()))
        _MODEL_NAMES = names
    return _MODEL_NAMES
