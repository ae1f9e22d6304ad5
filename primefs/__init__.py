"""primefs: recursive language-model agents on persistent kernels, where everything is a file."""
import os

# litellm must never try to download its price list (no network); set before any import of it.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

__version__ = "0.1.0"


API = ("Workspace", "SessionHandle", "Result", "RLM", "RLMCompletion", "PrimefsError", "SessionFailed",
       "BudgetExceeded", "Timeout")


def __getattr__(name: str):
    """Made on first use, so `import primefs` stays light: `hookimpl` (for plugins; pluggy is not imported
    by commands that need none) and the Python API (primefs.api: `primefs.Workspace`, `primefs.RLM`, ...)."""
    if name == "hookimpl":
        import pluggy

        globals()["hookimpl"] = marker = pluggy.HookimplMarker("primefs")
        return marker
    if name in API:
        from primefs import api

        return getattr(api, name)
    raise AttributeError(f"module 'primefs' has no attribute {name!r}")


__all__ = ["hookimpl", "__version__", *API]
