"""What settings may hold: limits, primefs.yaml, session.yaml, the sandbox (hosts and resources: hosts.py).
Every check names the file, the key and the allowed range; numbers must be finite (no NaN, no infinity) and
within bounds (the checks they are made of: checks.py)."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields
from pathlib import Path

from primefs.errors import PrimefsError
from primefs.store.approvals import check_approve
from primefs.store.checks import ABOVE_ZERO, check_text, kind_of, number, short
from primefs.store.hosts import check_hosts, check_resources, memory_bytes  # noqa: F401 - memory_bytes re-exported

SECRET_LEN = 8  # shorter values (`none`, `x`) are no secrets: redact.py ignores them too

# key: (default, kind, lowest, highest). kind "int" takes whole numbers (5.0 too), "num" any number.
LIMITS = {
    "cell_timeout_s":          (120,  "num", ABOVE_ZERO, 7 * 86400),
    "output_chars":            (8000, "int", 0, 10_000_000),
    "max_steps_per_turn":      (30,   "int", 1, 100_000),
    "loop_repeat":             (4,    "int", 0, 10_000),  # runner/loops.py; 0: off
    "loop_window":             (12,   "int", 0, 10_000),
    "model_retries":           (3,    "int", 0, 100),
    "model_retry_backoff_s":   (1.0,  "num", 0, 3600),
    "model_timeout_s":         (600,  "num", ABOVE_ZERO, 86400),
    "stream_idle_timeout_s":   (120,  "num", ABOVE_ZERO, 86400),
    "max_depth":               (3,    "int", 0, 100),
    "max_concurrent_sessions": (4,    "int", 1, 1000),
    "max_idle_kernels":        (8,    "int", 0, 10_000),
    "llm_batch_concurrency":   (8,    "int", 1, 256),
    "memory_prompt_chars":     (4000, "int", 0, 1_000_000),
    "refine_events":           (60,   "int", 0, 100_000),
    "compact_at_tokens":       (0,    "int", 0, 100_000_000),  # 0: 3/4 of the model's input window
    "tool_timeout_s":          (60,   "num", ABOVE_ZERO, 86400),
    "snapshot":                ("turn", ("turn", "idle", "off"), None, None),
    "snapshot_max_mb":         (256,  "num", ABOVE_ZERO, 1_000_000),
    "budget_tokens":           ("all", ("all", "uncached"), None, None),  # uncached: cache reads not counted
}
DEFAULT_LIMITS = {k: v[0] for k, v in LIMITS.items()}


@dataclass(frozen=True)
class Limits:
    """The limits of a runner or of one session, made once from checked settings (LIMITS has each one's
    default and range): typed attributes, so no part casts them. A `float` limit keeps the number as
    written (120 stays 120 in what the model is told)."""
    cell_timeout_s: float
    output_chars: int
    max_steps_per_turn: int
    loop_repeat: int
    loop_window: int
    model_retries: int
    model_retry_backoff_s: float
    model_timeout_s: float
    stream_idle_timeout_s: float
    max_depth: int
    max_concurrent_sessions: int
    max_idle_kernels: int
    llm_batch_concurrency: int
    memory_prompt_chars: int
    refine_events: int
    compact_at_tokens: int
    tool_timeout_s: float
    snapshot: str
    snapshot_max_mb: float
    budget_tokens: str

    @classmethod
    def of(cls, values: dict) -> "Limits":
        """From the defaults updated with `values` (checked ones: check_limits); other keys are ignored."""
        return cls(**{**DEFAULT_LIMITS, **{k: v for k, v in values.items() if k in LIMITS}})


assert [f.name for f in fields(Limits)] == list(LIMITS), "Limits and LIMITS name the same limits"
CHOICES = {k: v[1] for k, v in LIMITS.items() if isinstance(v[1], tuple)}
# Limits of earlier versions, accepted and ignored: kernels are no longer pooled or handed on.
RETIRED = {"kernel_pool", "reuse_kernels"}
TOOL_MODES = ("native", "fenced")
STATUSES = ("pending", "running", "idle", "done", "failed", "stopped")
FINISHED = ("idle", "done", "failed", "stopped")  # no turn running or waiting to run (mail may start one)


def check_limits(limits, where: str) -> dict:
    """Known keys, finite numbers in range (or one of the choices). Returns the checked values."""
    if not isinstance(limits, dict):
        raise PrimefsError(f"{where}: `limits:` must be a mapping of limit: value, not {kind_of(limits)}")
    out = {}
    for key, value in limits.items():
        if key in RETIRED:
            continue
        if key not in LIMITS:
            raise PrimefsError(f"{where}: unknown limit {key!r} (known: {', '.join(LIMITS)})")
        _, kind, low, high = LIMITS[key]
        if isinstance(kind, tuple):
            if value not in kind:
                raise PrimefsError(f"{where}: limit {key} must be one of {', '.join(kind)}, not {value!r}")
            out[key] = value
        else:
            out[key] = number(value, f"{where}: limit {key}", kind, low, high)
    return out


# -- primefs.yaml ---------------------------------------------------------------------------------
HOOKS = ("turn_end", "session_end", "before_cell", "after_compaction", "approval_needed")  # runner/hooks.py


def check_hooks(value, where: str) -> None:
    """`hooks:`: {name: command, or a list of commands or {command, timeout_s}}."""
    if not isinstance(value, dict):
        raise PrimefsError(f"{where}: `hooks:` must be a mapping of hook: command (hooks: {', '.join(HOOKS)})")
    for name, items in value.items():
        if name not in HOOKS:
            raise PrimefsError(f"{where}: hooks: unknown hook {name!r} (known: {', '.join(HOOKS)})")
        for item in items if isinstance(items, list) else [items]:
            command = item.get("command") if isinstance(item, dict) else item
            if not isinstance(command, str) or not command.strip():
                raise PrimefsError(f"{where}: hooks.{name}: each hook is a command (text) or {{command, timeout_s}}")
            if isinstance(item, dict):
                extra = set(item) - {"command", "timeout_s"}
                if extra:
                    raise PrimefsError(f"{where}: hooks.{name}: unknown key(s) {', '.join(sorted(map(str, extra)))} "
                                       "(known: command, timeout_s)")
                t = item.get("timeout_s", 30)
                if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t <= 3600:
                    raise PrimefsError(f"{where}: hooks.{name}: timeout_s must be a number of seconds, above 0 and "
                                       f"at most 3600, not {t!r}")


CONFIG_KEYS = ("model", "models", "limits", "sandbox", "mcp_servers", "hosts", "hooks", "approve", "kernel_connect",
               "harness", "keep_alive_s")


def check_config(data, where: str = "primefs.yaml", root: Path | None = None) -> dict:
    """The whole primefs.yaml: a mapping of CONFIG_KEYS, each well formed."""
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise PrimefsError(f"{where}: must be a YAML mapping (key: value lines)")
    unknown = sorted(str(k) for k in data if k not in CONFIG_KEYS)
    if unknown:  # a misspelt key would otherwise be a setting silently not in force
        raise PrimefsError(f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(CONFIG_KEYS)})")
    if data.get("model") is not None:
        check_text(data["model"], f"{where}: model", 256)
    models = data.get("models")
    if models is not None:
        if not isinstance(models, dict):
            raise PrimefsError(f"{where}: `models:` must be a mapping of alias: settings")
        for alias, settings in models.items():
            check_alias(alias, settings, where)
            key_file = (settings or {}).get("api_key_file")
            if key_file and root is not None and Path(key_file).expanduser().resolve().is_relative_to(Path(root).resolve()):
                raise PrimefsError(f"{where}: models.{alias}.api_key_file must be outside the workspace (every "
                                   "kernel reads the workspace)")
    if data.get("limits") is not None:
        check_limits(data["limits"], where)
    if data.get("sandbox") is not None:
        check_sandbox(data["sandbox"], where, root)
    if data.get("mcp_servers") is not None:
        from primefs.tools.mcp import check_servers

        check_servers(data["mcp_servers"])
    if data.get("hosts") is not None:
        check_hosts(data["hosts"], where)
    if data.get("hooks") is not None:
        check_hooks(data["hooks"], where)
    if data.get("approve") is not None:
        check_approve(data["approve"], where)
    if data.get("kernel_connect") is not None and not isinstance(data["kernel_connect"], bool):
        raise PrimefsError(f"{where}: kernel_connect must be true or false")
    if data.get("harness") is not None:
        check_harness(data["harness"], where)
    keep = data.get("keep_alive_s")
    if keep is not None and (isinstance(keep, bool) or not isinstance(keep, (int, float)) or not 0 <= keep <= 86400):
        raise PrimefsError(f"{where}: keep_alive_s is a number of seconds from 0 (off) to 86400, not {short(keep)}")
    return data


LOCK_PATTERN = re.compile(r"(note|memory|skill|agent|\*)/[a-z0-9*?\[\]-]+")  # kind/name, wildcards allowed
GATE_KEYS = {"benchmark": str, "n": int, "seed": int, "model": str}


def check_harness(data, where: str) -> None:
    """`harness: {locked: [kind/name, ...], gate: {benchmark, n, seed, model}}`."""
    if not isinstance(data, dict) or set(data) - {"locked", "gate"}:
        raise PrimefsError(f"{where}: harness is a mapping of locked (a list of kind/name) and gate (a mapping)")
    locked = data.get("locked")
    if locked is not None and (not isinstance(locked, list)
                               or not all(isinstance(x, str) and LOCK_PATTERN.fullmatch(x) for x in locked)):
        raise PrimefsError(f"{where}: harness.locked is a list of kind/name (note/style, skill/*), not {short(locked)}")
    gate = data.get("gate")
    if gate is not None:
        if not isinstance(gate, dict) or not gate.get("benchmark") or set(gate) - set(GATE_KEYS) or any(
                not isinstance(v, GATE_KEYS[k]) or isinstance(v, bool) for k, v in gate.items()):
            raise PrimefsError(f"{where}: harness.gate is {{benchmark: NAME, n: N, seed: S, model: M}} (benchmark "
                               f"required), not {short(gate)}")
        if gate.get("n", 1) < 1 or gate.get("seed", 0) < 0:
            raise PrimefsError(f"{where}: harness.gate: n must be at least 1 and seed at least 0")


def check_alias(alias, settings, where: str) -> None:
    check_text(alias, f"{where}: a model alias name", 128)
    if not alias.strip() or not alias.isprintable():  # it is named on command lines and in one-line errors
        raise PrimefsError(f"{where}: a model alias name must be printable text on one line, not {short(alias)}")
    at = f"{where}: models.{alias}"
    if settings is None:
        settings = {}
    if not isinstance(settings, dict):
        raise PrimefsError(f"{at} must be a mapping (model: ..., tool_mode: ...)")
    for key in ("model", "api_key_env", "api_key_file", "provider", "script", "api_base", "api_key"):
        if settings.get(key) is not None:
            check_text(settings[key], f"{at}.{key}")
    if settings.get("api_key") is not None and len(settings["api_key"]) >= SECRET_LEN:
        raise PrimefsError(f"{at}.api_key: a key written in primefs.yaml can be read by every kernel (they read "
                           "the workspace) and is in git's history; name an environment variable of the "
                           "runner with api_key_env, or a file outside the workspace with api_key_file")
    if settings.get("tool_mode") is not None and settings["tool_mode"] not in TOOL_MODES:
        raise PrimefsError(f"{at}.tool_mode must be native or fenced, not {short(settings['tool_mode'])}")
    if settings.get("stream") is not None and not isinstance(settings["stream"], bool):
        raise PrimefsError(f"{at}.stream must be true or false")
    if settings.get("context_window") is not None:
        number(settings["context_window"], f"{at}.context_window", "int", 1, 100_000_000)
    if settings.get("first_reply_grammar") is not None:
        check_text(settings["first_reply_grammar"], f"{at}.first_reply_grammar", 65536)
        model = str(settings.get("model") or "")
        if model != "local" and not model.startswith("local/"):
            raise PrimefsError(f"{at}.first_reply_grammar is for the embedded model (model: local) only, "
                               f"not {short(model)}")
    for key, value in settings.items():  # the rest goes to litellm: plain values only
        if isinstance(value, float) and not math.isfinite(value):
            raise PrimefsError(f"{at}.{key} must be a finite number, not {value!r}")


# -- the sandbox ----------------------------------------------------------------------------------
SANDBOX = {  # key: (default, kind, lowest, highest)
    "network":    (False, "bool", None, None),
    "memory_mb":  (4096, "int", 64, 1_000_000),
    "cpu_s":      (3600, "int", 1, 30 * 86400),
    "processes":  (256, "int", 1, 100_000),
    "open_files": (1024, "int", 16, 1_000_000),
    "disk_mb":    (10240, "int", 1, 100_000_000),
}
OFF, ON = ("off", "false", "no"), ("on", "true", "yes")  # `sandbox: off` is text to YAML, False to a person


def check_sandbox(value, where: str, root: Path | None = None) -> dict | None:
    """`sandbox:` (primefs.yaml or a goal): on/true, off/false, or a mapping of the keys above (enabled:
    true implied; `write:` folders a person lets the kernel write, workspace-relative or absolute).
    Absent (None): on, marked `default` (where the machine has no sandbox, the runner then says so and
    goes on without one). Returns the full settings, or None for no sandbox."""
    if value is None:
        return {**{k: v[0] for k, v in SANDBOX.items()}, "write": [], "default": True}
    if isinstance(value, str) and value.strip().lower() in OFF + ON:
        value = value.strip().lower() in ON
    if value is False:
        return None
    if value is True:
        value = {}
    if not isinstance(value, dict):
        raise PrimefsError(f"{where}: `sandbox:` is on, off, or a mapping of {', '.join(SANDBOX)}, write")
    if value.get("enabled") is False:
        return None
    out = {k: v[0] for k, v in SANDBOX.items()}
    out["write"] = []
    for key, v in value.items():
        if key == "enabled":
            if not isinstance(v, bool):
                raise PrimefsError(f"{where}: sandbox.enabled must be true or false")
            continue
        if key == "write":
            out["write"] = _write_grants(v, f"{where}: sandbox.write", root)
            continue
        if key not in SANDBOX:
            raise PrimefsError(f"{where}: unknown sandbox key {key!r} (known: enabled, {', '.join(SANDBOX)}, write)")
        _, kind, low, high = SANDBOX[key]
        if kind == "bool":
            if not isinstance(v, bool):
                raise PrimefsError(f"{where}: sandbox.{key} must be true or false, not {short(v)}")
            out[key] = v
        else:
            out[key] = number(v, f"{where}: sandbox.{key}", kind, low, high)
    return out


def _write_grants(value, where: str, root: Path | None) -> list[str]:
    """Folders a kernel may write besides its room: existing folders, absolute once checked."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or len(items) > 64:
        raise PrimefsError(f"{where} must be a folder or a list of at most 64 folders")
    out = []
    for item in items:
        check_text(item, where, 4096)
        path = Path(item).expanduser()
        if not path.is_absolute():
            if root is None:
                raise PrimefsError(f"{where}: {item!r} must be an absolute path here")
            path = Path(root) / path
        path = path.resolve()
        if not path.is_dir() or str(path) == "/":
            raise PrimefsError(f"{where}: {item!r} is not a folder")
        out.append(str(path))
    return out


# -- goals: budgets and end conditions ------------------------------------------------------------
BUDGET_KEYS = {"turns": "budget:turns", "tokens": "budget:tokens", "seconds": "budget:seconds",
               "cost_usd": "budget:cost"}
BUDGET_MAX = {"turns": 1e7, "tokens": 1e13, "seconds": 1e9, "cost_usd": 1e9}


def check_budget(value, where: str) -> dict:
    if not isinstance(value, dict):
        raise PrimefsError(f"{where}: `budget:` must be a mapping of {', '.join(BUDGET_KEYS)}")
    out = {}
    for key, limit in value.items():
        if key not in BUDGET_KEYS:
            raise PrimefsError(f"{where}: unknown budget {key!r} (known: {', '.join(BUDGET_KEYS)})")
        if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not math.isfinite(limit) or limit <= 0:
            raise PrimefsError(f"{where}: budget {key} must be a positive number, not {limit!r}")
        if limit > BUDGET_MAX[key]:
            raise PrimefsError(f"{where}: budget {key} must be at most {BUDGET_MAX[key]:g}, not {limit!r}")
        out[str(key)] = limit
    return out


def check_end_conditions(value, where: str, known: dict | None = None) -> list[dict]:
    if not isinstance(value, list):
        raise PrimefsError(f"{where}: `end_conditions:` must be a list like [{{command: \"pytest -q\"}}]")
    out = []
    for item in value:
        if not isinstance(item, dict) or len(item) != 1:
            raise PrimefsError(f"{where}: each end condition is a map with one key, its name "
                               f"(e.g. {{file_exists: report.md}}), not {item!r}")
        (name, arg), = item.items()
        if known is not None and name not in known:
            raise PrimefsError(f"{where}: unknown end condition {name!r} (known: {', '.join(sorted(known))})")
        out.append({str(name): arg})
    return out


# -- session.yaml ---------------------------------------------------------------------------------
def check_session_meta(data, where: str) -> dict:
    """A session.yaml as the runner needs it. Unknown keys are kept (people and tools may add some)."""
    if not isinstance(data, dict):
        raise PrimefsError(f"{where}: not a mapping")
    for key in ("id", "name", "model"):
        check_text(data.get(key), f"{where}: {key}", 256)
    if data.get("status", "pending") not in STATUSES:
        raise PrimefsError(f"{where}: status must be one of {', '.join(STATUSES)}, not {short(data.get('status'))}")
    for key in ("parent", "goal", "context_data", "agent", "stop_reason", "created", "updated"):
        if data.get(key) is not None:
            check_text(data[key], f"{where}: {key}")
    if data.get("error") is not None:
        check_text(data["error"], f"{where}: error", 100_000)
    if data.get("depth") is not None:
        number(data["depth"], f"{where}: depth", "int", 0, 10_000)
    if data.get("started_ts") is not None:
        number(data["started_ts"], f"{where}: started_ts", "num", 0, 1e11)
    context = data.get("context")
    if context is not None and (not isinstance(context, list) or not all(isinstance(c, str) for c in context)):
        raise PrimefsError(f"{where}: context must be a list of file paths")
    if data.get("limits") is not None:
        check_limits(data["limits"], where)
    if data.get("autonomous") is not None and not isinstance(data["autonomous"], bool):
        raise PrimefsError(f"{where}: autonomous must be true or false")
    if data.get("budget") is not None:
        check_budget(data["budget"], where)
    if data.get("end_conditions") is not None:
        check_end_conditions(data["end_conditions"], where)
    if data.get("tools") is not None:
        from primefs.tools.registry import check_selection

        check_selection(data["tools"], where)
    if data.get("sandbox") is not None and not isinstance(data["sandbox"], (bool, dict)):
        raise PrimefsError(f"{where}: sandbox must be true, false or a mapping")
    if data.get("resources") is not None:
        check_resources(data["resources"], f"{where}: resources")
    if data.get("node") is not None:
        check_text(data["node"], f"{where}: node", 256)
    return data
