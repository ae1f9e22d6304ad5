"""Built-in providers: scripted replies (tests), the embedded local model, and litellm for every other id."""
from __future__ import annotations

from primefs import hookimpl


@hookimpl
def register_providers(register):
    from primefs.providers.litellm_provider import LiteLLMProvider
    from primefs.providers.local import LocalProvider
    from primefs.providers.scripted import ScriptedProvider

    # Order matters: the first provider that matches a model id serves it; litellm takes any id.
    register(ScriptedProvider())
    register(LocalProvider())
    register(LiteLLMProvider())
