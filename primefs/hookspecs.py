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
    A ``score`` with a keyword ``judge`` is given ``judge(prompt) -> reply`` under ``primefs eval --judge``.
    """


@hookspec
def register_end_conditions(register):
    """Register end conditions for goals: call ``register(name, check)``.

    ``check(arg, ctx) -> (passed: bool, report: str)``; ``arg`` is the value given in the goal's
    front matter (``end_conditions: [{name: arg}]``); ``ctx`` has ``workspace`` (Path), ``session``
    (the session id), ``room`` (Path: the session's ``work/`` folder, its kernel's working folder) and
    ``run(command, timeout) -> (exit code or None on timeout, output)``, which runs a shell command as
    the session's kernel would (in its sandbox and room; use it for anything the goal's text names).
    ``report`` is shown to the model when the condition fails.
    """


@hookspec
def register_tools(register):
    """Register tools, functions that code in every kernel can call as ``tools.NAME(...)``.

    Call ``register(fn_or_path, runs="kernel" | "runner", name=None, description=None)`` once per tool:

    - ``runs="kernel"``: ``fn_or_path`` is ``"module:attr"`` (importable in the kernel; a workspace's
      ``plugins/`` folder is on the kernel's path) or a function whose module can be imported. It is
      imported into each kernel at start: for pure computation, parsers, formatters.
    - ``runs="runner"``: ``fn_or_path`` is a function; it runs in the runner process, so it may hold
      clients and credentials a kernel must never see. The kernel gets a stub with the same
      signature that calls it as the calling session. Arguments and results are JSON values;
      an exception comes back as an exception in the cell.

    ``name`` defaults to the function's name (a Python identifier); ``description`` to the first
    line of its docstring, which ``help(tools.NAME)`` shows whole. A bad tool is reported by
    ``primefs tools`` and left out; the others are not affected.
    """
