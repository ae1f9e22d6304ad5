"""Cold start: `import litellm` costs seconds of CPU (~2.3 s here; 4-5 s measured on a slower run) and
~190 MiB. Done lazily it lands on the first model call of every runner. So when the runner knows a
litellm-backed model (every provider except `scripted` uses litellm, the embedded `local` model too)
will be called, it begins the import in a background thread, while it starts, goals are taken and
kernels start; a model call that comes first waits for it (the provider's import lock).

Which models count: a runner that keeps running (`primefs run`, `up`) looks at its configuration when
it starts (the default model and every alias: the next goal will likely use one), so the import is done
before the first goal comes. `run --once` looks, after its start-up scan, at the sessions with work
waiting and at the goal files not taken yet (their `model:`, else the default): a `run --once` of
scripted goals (tests, benchmarks) imports nothing.
"""
from __future__ import annotations

import threading

from primefs.errors import PrimefsError
from primefs.plugins import provider_for

USES_LITELLM = ("litellm", "local")  # provider names: `local` serves through LiteLLMProvider


def litellm_models(ws, providers: list, names) -> list[str]:
    """The model names among `names` that a litellm-backed provider serves."""
    out = []
    for name in sorted({n for n in names if n}):
        try:
            settings = ws.resolve_model(name)
            provider = provider_for(providers, settings["model"], settings.get("provider"))
        except (PrimefsError, LookupError):
            continue
        if getattr(provider, "name", None) in USES_LITELLM:
            out.append(name)
    return out


def configured(ws) -> set[str]:
    """The default model and every alias: what a runner that keeps running will likely call."""
    return {ws.default_model(), *(ws.config.get("models") or {})}


def models_in_sight(ws, tree, scheduler, claimed: set) -> set[str]:
    """Models a `run --once` is about to call: of queued sessions and of goal files not taken."""
    from primefs.store import frontmatter
    from primefs.store.goals import goal_listing

    names: set[str] = set()
    for sid in scheduler.snapshot()["queued_sessions"]:
        try:
            names.add(tree.session(sid).meta.get("model"))
        except (PrimefsError, OSError):
            continue
    files, _ = goal_listing(ws)
    for path in files:
        rel = path.relative_to(ws.root).as_posix()
        if rel not in claimed:
            try:
                meta, _ = frontmatter.read(path, rel, root=ws.root)
                names.add(str(meta.get("model") or ws.default_model()))
            except PrimefsError:
                continue  # intake reports it
    return names


def start() -> threading.Thread:
    """Begin `import litellm` in the background."""
    from primefs.providers.litellm_provider import get_litellm

    thread = threading.Thread(target=get_litellm, name="primefs-import-litellm", daemon=True)
    thread.start()
    return thread
