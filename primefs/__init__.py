"""primefs: recursive language-model agents on persistent kernels, where everything is a file."""
import os

# litellm must never try to download its price list (no network); set before any import of it.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

__version__ = "0.1.0"


def __getattr__(name: str):
    """`hookimpl` (for plugins) made on first use: pluggy is not imported by commands that need none."""
    if name == "hookimpl":
        import pluggy

        globals()["hookimpl"] = marker = pluggy.HookimplMarker("primefs")
        return marker
    raise AttributeError(f"module 'primefs' has no attribute {name!r}")


__all__ = ["hookimpl", "__version__"]
