"""OpenTelemetry spans for turns, model calls and cells; off unless the standard OTEL_* variables ask.

Off (the default) costs nothing: opentelemetry is never imported, and every hook returns one shared
no-op object after a single check. On: `OTEL_TRACES_EXPORTER` (`otlp`, `console`, comma-separated;
`none` turns it off) or, without it, `OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`
(then `otlp`). The exporters read their own OTEL_* settings (endpoint, headers, protocol, batching).

Parenting. A session's spans cannot follow it through contextvars: its model calls come from its agent
thread and from kernel-request threads (`llm()` in a cell), and a child's turn runs in another worker
thread. The runner process holds every session, so a registry maps each session id to its open spans
(its turn, then the cell running in it) and these rules give every span its parent:
- a model call: the innermost open span of its session (the cell, for `llm()` from code; else the turn);
- a cell: its session's turn;
- a turn of a root session: none (each turn is a trace; `gen_ai.conversation.id` ties a session's turns);
- a turn of a child: the parent session's innermost open span when the turn starts (the cell waiting for
  it, or the one that mailed it), else the parent's span that was innermost when the child was spawned
  (the cell that called `rlm()`), else none (the parent ran under an earlier runner).
`primefs trace` applies the same rules to finished histories (tracereplay.py).
"""
from __future__ import annotations

import os
import sys
import threading

ENV_ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
EXPORTERS = ("otlp", "console")


class TracingError(Exception):
    """Tracing was asked for but cannot work (a missing package, an unknown exporter)."""


def exporters_from_env(env=None) -> list[str]:
    """The span exporters the OTEL_* environment asks for; empty: tracing is off."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    names = [n.strip().lower() for n in env.get("OTEL_TRACES_EXPORTER", "").split(",") if n.strip()]
    if not names and any(env.get(k) for k in ENV_ENDPOINTS):
        names = ["otlp"]
    return [n for n in names if n != "none"]


def make_provider(exporters: list[str] | None = None, *, span_exporter=None, batch: bool = True):
    """A TracerProvider exporting to the named exporters (or to `span_exporter`, e.g. in-memory)."""
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    except ImportError:
        raise TracingError("tracing needs opentelemetry: pip install 'primefs[otel]'") from None
    from . import __version__

    attrs = {"service.version": __version__}
    if not os.environ.get("OTEL_SERVICE_NAME") and "service.name=" not in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", ""):
        attrs["service.name"] = "primefs"  # the environment's choice wins
    provider = TracerProvider(resource=Resource.create(attrs))
    if span_exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(span_exporter))
    for name in exporters or ():
        exp = exporter(name)
        # console: print each span as it ends; otlp: batch in the background (OTEL_BSP_* apply)
        provider.add_span_processor(BatchSpanProcessor(exp) if batch and name == "otlp" else SimpleSpanProcessor(exp))
    return provider


def exporter(name: str):
    """One span exporter by its OTEL_TRACES_EXPORTER name, configured by its own OTEL_* variables."""
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if name != "otlp":
        raise TracingError(f"OTEL_TRACES_EXPORTER: unknown exporter {name!r} (primefs knows: {', '.join(EXPORTERS)}, none)")
    protocol = (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                or "http/protobuf").strip()
    try:
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        elif protocol == "http/protobuf":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        else:
            raise TracingError(f"OTEL_EXPORTER_OTLP_PROTOCOL: {protocol!r} is not supported (http/protobuf, grpc)")
    except ImportError:
        pkg = "opentelemetry-exporter-otlp-proto-grpc" if protocol == "grpc" else "primefs[otel]"
        raise TracingError(f"the OTLP exporter ({protocol}) is not installed: pip install '{pkg}'") from None
    return OTLPSpanExporter()


# -- attributes (GenAI semantic conventions), shared with the replay -------------------------------------
def provider_name(model: str) -> str:
    return str(model).split("/", 1)[0] if "/" in str(model) else str(model)


def turn_attrs(sid: str, meta: dict, turn: int, resumed: bool) -> tuple[str, dict]:
    name = str(meta.get("name") or sid)
    attrs = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.id": sid, "gen_ai.agent.name": name,
             "gen_ai.conversation.id": sid, "gen_ai.request.model": str(meta.get("model") or ""),
             "primefs.session.id": sid, "primefs.session.name": name,
             "primefs.session.depth": int(meta.get("depth") or 0), "primefs.turn": int(turn)}
    if meta.get("parent"):
        attrs["primefs.session.parent"] = str(meta["parent"])
    if resumed:
        attrs["primefs.turn.resumed"] = True
    return f"invoke_agent {name}", attrs


def turn_end_attrs(outcome, status, stop_reason) -> dict:
    out = {"primefs.turn.outcome": str(outcome), "primefs.session.status": str(status)}
    if stop_reason:
        out["primefs.stop_reason"] = str(stop_reason)
    return out


def model_attrs(sid: str, model: str, purpose: str, attempt: int) -> tuple[str, dict]:
    return f"chat {model}", {"gen_ai.operation.name": "chat", "gen_ai.request.model": str(model),
                             "gen_ai.provider.name": provider_name(model), "primefs.session.id": sid,
                             "primefs.purpose": purpose, "primefs.attempt": int(attempt)}


def usage_attrs(input_tokens, output_tokens, cost_usd, cost_known, response_model=None) -> dict:
    out = {"gen_ai.usage.input_tokens": int(input_tokens or 0), "gen_ai.usage.output_tokens": int(output_tokens or 0),
           "primefs.cost_usd": float(cost_usd or 0.0), "primefs.cost_known": bool(cost_known)}
    if response_model:
        out["gen_ai.response.model"] = str(response_model)
    return out


def cell_attrs(sid: str, call_id) -> tuple[str, dict]:
    attrs = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "python", "gen_ai.tool.type": "function",
             "primefs.session.id": sid}
    if call_id:
        attrs["gen_ai.tool.call.id"] = str(call_id)
    return "execute_tool python", attrs


def cell_error_type(error: str | None) -> str | None:
    """`ZeroDivisionError` from a traceback's last line; None for a cell without an error."""
    if not error:
        return None
    last = next((ln.strip() for ln in reversed(str(error).splitlines()) if ln.strip()), "")
    head = last.split(":", 1)[0].strip()
    return head if head.replace(".", "").replace("_", "").isalnum() and " " not in head else "cell_error"


def mark_error(span, error_type: str, description: str | None = None) -> None:
    from opentelemetry.trace import Status, StatusCode

    span.set_attribute("error.type", error_type)
    span.set_status(Status(StatusCode.ERROR, (description or error_type)[:300]))


# -- live spans ---------------------------------------------------------------------------------------
class _Noop:
    """What every hook returns while tracing is off."""

    __slots__ = ()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def usage(self, reply) -> None:
        pass

    def turn_ended(self, outcome, session) -> None:
        pass

    def cell_ran(self, res) -> None:
        pass


NOOP = _Noop()
_lock = threading.Lock()
_state: dict = {"checked": False, "tracer": None, "provider": None}
_open: dict[str, list] = {}  # session id -> its open turn / cell spans, innermost last
_spawned: dict[str, object] = {}  # child id -> SpanContext innermost in the parent when it was spawned


class _Live(_Noop):
    __slots__ = ("span", "sid")

    def __init__(self, span, sid: str | None):
        self.span, self.sid = span, sid  # sid: registered as an open span of that session

    def __enter__(self):
        if self.sid is not None:
            with _lock:
                _open.setdefault(self.sid, []).append(self.span)
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc is not None:
            mark_error(self.span, exc_type.__name__, str(exc))
        if self.sid is not None:
            with _lock:
                stack = _open.get(self.sid) or []
                if self.span in stack:
                    stack.remove(self.span)
                if not stack:
                    _open.pop(self.sid, None)
        self.span.end()
        return False

    def usage(self, reply) -> None:
        self.span.set_attributes(usage_attrs(reply.input_tokens, reply.output_tokens, reply.cost_usd,
                                             reply.cost_known, getattr(reply, "model", None)))

    def turn_ended(self, outcome, session) -> None:
        meta = session.meta
        self.span.set_attributes(turn_end_attrs(outcome, meta.get("status"), meta.get("stop_reason")))
        if outcome == "failed":
            mark_error(self.span, "turn_failed", meta.get("error"))

    def cell_ran(self, res) -> None:
        self.span.set_attributes({"primefs.cell.elapsed_s": float(res.elapsed_s or 0.0),
                                  "primefs.cell.timed_out": bool(res.timed_out),
                                  "primefs.cell.restarted": bool(res.restarted)})
        kind = cell_error_type(res.error)
        if kind:
            mark_error(self.span, kind, str(res.error).strip().splitlines()[-1])


def _tracer():
    if _state["checked"]:
        return _state["tracer"]
    with _lock:
        if not _state["checked"]:
            names = exporters_from_env()
            if names:
                try:
                    install(make_provider(names), _locked=True)
                except TracingError as exc:  # a runner must not die of its telemetry
                    print(f"warning: tracing is off: {exc}", file=sys.stderr, flush=True)
            _state["checked"] = True
    return _state["tracer"]


def install(provider, _locked: bool = False):
    """Use this TracerProvider for live spans (tests pass one with an in-memory exporter); None: off."""
    def do():
        _state.update(checked=True, provider=provider,
                      tracer=provider.get_tracer("primefs") if provider is not None else None)
        _open.clear()
        _spawned.clear()
    if _locked:
        do()
    else:
        with _lock:
            do()
    return provider


def reset() -> None:
    """Forget the configuration: the next hook reads the environment again."""
    with _lock:
        _state.update(checked=False, tracer=None, provider=None)
        _open.clear()
        _spawned.clear()


def _context_of(span_or_ctx):
    from opentelemetry import trace

    if span_or_ctx is None:
        return None
    if isinstance(span_or_ctx, trace.SpanContext):
        span_or_ctx = trace.NonRecordingSpan(span_or_ctx)
    return trace.set_span_in_context(span_or_ctx)


def _innermost(sid: str | None):
    if not sid:
        return None
    with _lock:
        stack = _open.get(sid)
        return stack[-1] if stack else None


def turn(session, turn_no: int, resumed: bool):
    """Around one turn (turns.py), from `turn_start` to `turn_end`."""
    tracer = _tracer()
    if tracer is None:
        return NOOP
    meta = session.meta
    parent = meta.get("parent")
    ctx = _innermost(parent)
    if ctx is None and parent:
        with _lock:
            ctx = _spawned.get(session.id)
    name, attrs = turn_attrs(session.id, meta, turn_no, resumed)
    from opentelemetry.trace import SpanKind

    return _Live(tracer.start_span(name, context=_context_of(ctx), kind=SpanKind.INTERNAL, attributes=attrs),
                 session.id)


def model_call(session, model: str, purpose: str, attempt: int):
    """Around one model call attempt (gateway.py); `.usage(reply)` adds its tokens."""
    tracer = _tracer()
    if tracer is None:
        return NOOP
    from opentelemetry.trace import SpanKind

    name, attrs = model_attrs(session.id, model, purpose, attempt)
    return _Live(tracer.start_span(name, context=_context_of(_innermost(session.id)), kind=SpanKind.CLIENT,
                                   attributes=attrs), None)


def cell(session, call_id):
    """Around one cell (agent.py); `.cell_ran(res)` adds its outcome."""
    tracer = _tracer()
    if tracer is None:
        return NOOP
    name, attrs = cell_attrs(session.id, call_id)
    return _Live(tracer.start_span(name, context=_context_of(_innermost(session.id)), attributes=attrs), session.id)


def spawned(parent: str, child: str) -> None:
    """`rlm()` made `child`: remember where in the parent it came from (services.py)."""
    if _tracer() is None:
        return
    span = _innermost(parent)
    if span is not None:
        with _lock:
            _spawned[child] = span.get_span_context()
