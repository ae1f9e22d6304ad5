"""Secrets never reach a workspace file. Before anything is written to history, results, mail or a
harness commit, the values of keys the runner knows are replaced by `[redacted]`: environment variables
named by an alias's `api_key_env`, litellm's standard key variables (any `*_API_KEY`, `*_SECRET*`,
`*_TOKEN`, `*_ACCESS_KEY*` variable), `api_key` values in aliases, and values the `mcp_servers:` section
takes from the environment; and so are common key shapes (`sk-...`, `AKIA...`, `ghp_...`, ...).
Values shorter than 8 characters are not treated as secrets (they would match ordinary text).
"""
from __future__ import annotations

import os
import re
import threading

MARK = "[redacted]"
MIN_LEN = 8  # settings.SECRET_LEN: primefs.yaml may hold an api_key shorter than this
KEY_VARS = re.compile(r"(API_?KEY|SECRET|_TOKEN$|^TOKEN$|ACCESS_KEY|PASSWORD|PASSWD)", re.IGNORECASE)
KEY_SHAPES = (r"sk-(?:ant-|proj-|live-|test-)?[A-Za-z0-9_\-]{20,}", r"(?:AKIA|ASIA)[0-9A-Z]{16}",
              r"gh[pousr]_[A-Za-z0-9]{30,}", r"github_pat_[A-Za-z0-9_]{40,}", r"xox[abprs]-[A-Za-z0-9\-]{10,}",
              r"AIza[0-9A-Za-z_\-]{35}", r"hf_[A-Za-z0-9]{30,}", r"glpat-[A-Za-z0-9_\-]{20,}")
VAR_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class Redactor:
    def __init__(self, secrets=()):
        self.secrets = sorted({s for s in secrets if isinstance(s, str) and len(s) >= MIN_LEN}, key=len, reverse=True)
        parts = [re.escape(s) for s in self.secrets] + list(KEY_SHAPES)
        self.pattern = re.compile("|".join(parts))

    def text(self, value: str) -> str:
        return self.pattern.sub(MARK, value) if value else value

    def value(self, value):
        """Strings anywhere in JSON-like data (dict keys included)."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.value(k): self.value(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.value(v) for v in value]
        return value


def environment_secrets(env=None) -> set[str]:
    env = os.environ if env is None else env
    return {v for k, v in env.items() if KEY_VARS.search(k)}


def workspace_secrets(config: dict, env=None) -> set[str]:
    """What primefs.yaml says is secret: api_key values, variables named by api_key_env, and the
    variables the mcp_servers section expands."""
    env = os.environ if env is None else env
    out: set[str] = set()
    for alias in (config.get("models") or {}).values():
        if isinstance(alias, dict):
            if isinstance(alias.get("api_key"), str):
                out.add(alias["api_key"])
            if isinstance(alias.get("api_key_env"), str) and env.get(alias["api_key_env"]):
                out.add(env[alias["api_key_env"]])
            if isinstance(alias.get("api_key_file"), str):
                try:
                    out.add(open(os.path.expanduser(alias["api_key_file"]), encoding="utf-8").read().strip())
                except (OSError, UnicodeDecodeError):
                    pass
    for server in (config.get("mcp_servers") or {}).values():
        if isinstance(server, dict):
            for section in ("env", "headers"):
                for value in (server.get(section) or {}).values():
                    out.update(env[name] for name in VAR_REF.findall(str(value)) if env.get(name))
    return out


_lock = threading.Lock()
_current: Redactor | None = None


def configure(config: dict | None = None) -> Redactor:
    """Build the process's redactor from the environment and a workspace's primefs.yaml."""
    global _current
    r = Redactor(environment_secrets() | workspace_secrets(config or {}))
    with _lock:
        _current = r
    return r


def current() -> Redactor:
    global _current
    with _lock:
        if _current is None:
            _current = Redactor(environment_secrets())
        return _current


def text(value: str) -> str:
    return current().text(value)


def value(data):
    return current().value(data)
