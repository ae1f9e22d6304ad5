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


@hookspec
def register_benchmarks(register):
    """Register benchmarks for `primefs eval`: call ``register(obj)`` once per benchmark.

    ``obj`` is any object (a plain class instance is enough) with:
    ``name`` (str), ``description`` (str), ``items(n, seed)`` yielding dicts
    ``{"id", "task", "context", "expected"}`` (deterministic for a seed; ``context`` is handed to the
    session as its ``context`` variable, never put in a prompt), ``score(answer, expected) -> float``
    in [0, 1], and ``oracle(item) -> answer`` (a reference solver: scores 1.0 without any model).
    """


@hookspec
def register_end_conditions(register):
    """Register end conditions for goals: call ``register(name, check)``.

    ``check(arg, ctx) -> (passed: bool, report: str)``; ``arg`` is the value given in the goal's
    front matter (``end_conditions: [{name: arg}]``); ``ctx`` has ``workspace`` (Path) and
    ``session`` (the session id). ``report`` is shown to the model when the condition fails.
    """
