"""primefs: recursive language-model agents on persistent kernels, where everything is a file."""
import os

# litellm must never try to download its price list (no network); set before any import of it.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import pluggy

__version__ = "0.1.0"
hookimpl = pluggy.HookimplMarker("primefs")

__all__ = ["hookimpl", "__version__"]
