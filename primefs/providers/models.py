"""Models as the user sees them: aliases, what each resolves to, and whether its key is set.

Keys are checked without importing litellm (seconds): from the alias (`api_key_env`, `api_key_file`), else
from the provider's standard variable, by the model id's prefix or, for a bare id, the provider named
in litellm's bundled price list.
"""
from __future__ import annotations

import json
import os
from functools import lru_cache
from importlib.util import find_spec
from pathlib import Path

from primefs.errors import PrimefsError

# provider prefix -> the variables litellm reads its key from (the first one set counts)
KEY_VARS = {
    "openai": ["OPENAI_API_KEY"], "text-completion-openai": ["OPENAI_API_KEY"],
    "anthropic": ["ANTHROPIC_API_KEY"], "gemini": ["GEMINI_API_KEY", "GOOGLE_API_KEY"],
    "mistral": ["MISTRAL_API_KEY"], "groq": ["GROQ_API_KEY"], "cohere": ["COHERE_API_KEY", "CO_API_KEY"],
    "cohere_chat": ["COHERE_API_KEY", "CO_API_KEY"], "together_ai": ["TOGETHERAI_API_KEY", "TOGETHER_API_KEY"],
    "openrouter": ["OPENROUTER_API_KEY"], "deepseek": ["DEEPSEEK_API_KEY"], "xai": ["XAI_API_KEY"],
    "azure": ["AZURE_API_KEY"], "huggingface": ["HUGGINGFACE_API_KEY", "HF_TOKEN"],
    "fireworks_ai": ["FIREWORKS_AI_API_KEY", "FIREWORKS_API_KEY"], "perplexity": ["PERPLEXITYAI_API_KEY"],
    "replicate": ["REPLICATE_API_KEY"], "cerebras": ["CEREBRAS_API_KEY"], "deepinfra": ["DEEPINFRA_API_KEY"],
}
OURS = ("scripted", "local")


@lru_cache(maxsize=1)
def _price_list() -> dict:
    spec = find_spec("litellm")
    if spec and spec.origin:
        f = Path(spec.origin).parent / "model_prices_and_context_window_backup.json"
        try:
            return json.loads(f.read_text())
        except (OSError, ValueError):
            pass
    return {}


def key_from_file(path: str) -> str:
    """An alias's `api_key_file`: the key is the file's text, stripped (a file outside the workspace, so no
    kernel reads it)."""
    try:
        key = Path(path).expanduser().read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise PrimefsError(f"cannot read the key file {path} (api_key_file): {getattr(exc, 'strerror', exc)}") from None
    if not key:
        raise PrimefsError(f"the key file {path} (api_key_file) is empty")
    return key


def key_files(config: dict) -> list[str]:
    """The `api_key_file`s of primefs.yaml's aliases, as absolute paths (hidden from sandboxed kernels)."""
    out = []
    for alias in (config.get("models") or {}).values():
        if isinstance(alias, dict) and isinstance(alias.get("api_key_file"), str):
            out.append(str(Path(alias["api_key_file"]).expanduser().resolve()))
    return out


def provider_of(model_id: str) -> str:
    prefix = model_id.split("/", 1)[0] if "/" in model_id else None
    if prefix:
        return prefix
    if model_id == "local":
        return "local"
    return str((_price_list().get(model_id) or {}).get("litellm_provider") or "unknown")


def key_status(settings: dict, env=None) -> tuple[str, str | None]:
    """(what to show, the problem if the key is missing). Keys that may not be needed (a local server
    via api_base, an unknown provider) are not called missing."""
    env = os.environ if env is None else env
    provider = settings.get("provider") or provider_of(settings["model"])
    if provider in OURS:
        return "not needed", None
    if settings.get("api_key"):
        return "in primefs.yaml", None
    if settings.get("api_key_file"):
        try:
            key_from_file(settings["api_key_file"])
            return f"in {settings['api_key_file']}", None
        except PrimefsError as exc:
            return "key file unreadable", str(exc)
    if settings.get("api_key_env"):
        var = settings["api_key_env"]
        return (f"{var} is set", None) if env.get(var) else \
            (f"{var} not set", f"model {settings['model']} needs the environment variable {var} (api_key_env), "
                               "which is not set in the runner's environment")
    wanted = KEY_VARS.get(provider)
    if not wanted:
        return "not checked (provider unknown to primefs)", None
    found = next((v for v in wanted if env.get(v)), None)
    if found:
        return f"{found} is set", None
    if settings.get("api_base"):
        return f"{wanted[0]} not set (may not be needed with api_base)", None
    return f"{wanted[0]} not set", (f"model {settings['model']} needs the environment variable {wanted[0]}, "
                                    "which is not set in the runner's environment")


def key_problem(ws, name: str) -> str | None:
    try:
        return key_status(ws.resolve_model(name))[1]
    except PrimefsError as exc:
        return str(exc)


def listing(ws) -> list[dict]:
    """Every alias of primefs.yaml, plus the default model when it is not an alias."""
    aliases = ws.config.get("models") or {}
    names = list(aliases)
    default = ws.default_model()
    if default not in names:
        names.append(default)
    out = []
    for name in names:
        row = {"name": name, "alias": name in aliases, "default": name == default}
        try:
            settings = ws.resolve_model(name)
            shown, problem = key_status(settings)
            row.update(model=settings["model"], provider=settings.get("provider") or provider_of(settings["model"]),
                       tool_mode=settings["tool_mode"], key=shown, key_ok=problem is None, problem=problem)
        except PrimefsError as exc:
            row.update(model=None, provider=None, tool_mode=None, key=None, key_ok=False, problem=str(exc))
        out.append(row)
    return out
