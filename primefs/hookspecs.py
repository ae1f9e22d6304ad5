"""Hook specifications. Plugins implement these with ``@primefs.hookimpl``."""
import pluggy

hookspec = pluggy.HookspecMarker("primefs")


@hookspec
def register_providers(register):
    """Register model providers: call ``register(provider)`` once per provider.

    A provider has ``name``, ``matches(model_id) -> bool`` and
    ``complete(messages, tools, settings) -> primefs.providers.ModelReply``.
    Providers registered by plugins are tried before the built-in ones; the built-in
    ``litellm`` provider matches every model id and is tried last.
    """
