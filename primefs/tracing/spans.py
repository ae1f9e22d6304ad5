"""OpenTelemetry spans for turns, model calls and cells; off unless the standard OTEL_* variables ask.

Off (the default) costs nothing: opentelemetry is never imported, and every hook returns one shared
no-op object after a single check. On: `OTEL_TRACES_EXPORTER` (`otlp`, `console`, comma-separated;
`none` turns it off) or, without it, `OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`
(then `otlp`). The exporters read their own OTEL_* settings (endpoint, headers, protocol, batching).

Parenting. A session's spans cannot follow it through contextvars: its model calls come from its agent
thread and from kernel-request threads (`llm()` in a cell), and a child's turn runs in another worker
thread. The runner process holds every session, so a registry maps each session id to the ids of its
open spans (its turn, then the cell running in it) and these rules give every span its parent:
- a model call: the innermost open span of its session (the cell, for `llm()` from code; else the turn);
- a cell: its session's turn;
- a turn of a root session: none (each turn is a trace; `gen_ai.conversation.id` ties a session's turns);
- a turn of a child: the parent session's innermost open span when the turn starts (the cell waiting for
  it, or the one that mailed it), else the parent's span that was innermost when the child was spawned
  (the cell that called `rlm()`), else none (the parent ran under an earlier runner).
`primefs trace` applies the same rules to finished histories (tracing/replay.py).

One function per kind of span makes it from its events (`turn_span`, `cell_span`, `chat_span`), live and
in a replay alike, and ids are derived from the session and the event: a live span is made when its last
event is recorded (nothing is exported before a span ends anyway), so it is the span a replay makes, ids
included, and replaying a history twice gives the same spans (a backend keeps one of each).
"""
from __future__ import annotations

import hashlib
import os
import sys
import threading
import time
from dataclasses import dataclass

from primefs.store.events import Cell, ModelCall, ModelErrorEvent, TurnEnd, TurnStart
from primefs.store.summary import number

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
    from primefs import __version__

    attrs = {"service.version": __version__}
    if not os.environ.get("OTEL_SERVICE_NAME") and "service.name=" not in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", ""):
        attrs["service.name"] = "primefs"  # the environment's choice wins
    provider = TracerProvider(resource=Resource.create(attrs), id_generator=_given_ids())
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


# -- ids: from the session and the event, so the same history gives the same ids ------------------------
_given = threading.local()  # the ids emit() is giving the span it starts on this thread


def _given_ids():
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class GivenIds(RandomIdGenerator):
        """The SDK takes no span id from its caller: it asks this, which answers with emit()'s."""

        def generate_span_id(self) -> int:
            ctx = getattr(_given, "ctx", None)
            return ctx.span_id if ctx is not None else super().generate_span_id()

        def generate_trace_id(self) -> int:
            ctx = getattr(_given, "ctx", None)
            return ctx.trace_id if ctx is not None else super().generate_trace_id()

    return GivenIds()


def span_context(sid: str, key: tuple, parent=None):
    """The ids of the span `key` names in session `sid`: a hash of both; the trace is its parent's, else its own."""
    from opentelemetry.trace import SpanContext, TraceFlags

    digest = hashlib.sha256("/".join(map(str, (sid, *key))).encode()).digest()
    trace_id = parent.trace_id if parent is not None else int.from_bytes(digest[8:24], "big") or 1
    return SpanContext(trace_id, int.from_bytes(digest[:8], "big") or 1, is_remote=False,
                       trace_flags=TraceFlags(TraceFlags.SAMPLED))


def turn_key(turn_start: dict) -> tuple:
    return ("turn", turn_start["n"])


def cell_key(assistant: dict, k: int) -> tuple:
    """The k-th cell of a reply: known when it starts (what runs in it needs its id), unlike its own event."""
    return ("cell", assistant["n"], k)


def chat_key(event: dict) -> tuple:
    return ("chat", event["n"])


# -- spans from events (GenAI semantic conventions): the one place, live and replayed ------------------
@dataclass
class Spec:
    name: str
    attrs: dict
    start: float  # Unix seconds
    end: float
    kind: str = "INTERNAL"
    error: tuple | None = None  # (error.type, description)


def ts(event: dict) -> float:
    return float(event.get("ts") or 0.0)


def provider_name(model: str) -> str:
    return str(model).split("/", 1)[0] if "/" in str(model) else str(model)


def turn_span(sid: str, meta: dict, start: TurnStart, end: TurnEnd | None, last_ts: float) -> Spec:
    """A turn from its `turn_start` to its `turn_end`; without one (it runs, or its runner died) to `last_ts`."""
    name = str(meta.get("name") or sid)
    attrs = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.id": sid, "gen_ai.agent.name": name,
             "gen_ai.conversation.id": sid, "primefs.session.id": sid, "primefs.session.name": name,
             "primefs.session.model": str(meta.get("model") or ""),
             "primefs.session.depth": number(meta.get("depth"), int), "primefs.turn": number(start.get("turn"), int)}
    if start.get("model"):  # the model id the session's model (an alias, often) resolved to; older histories lack it
        attrs["gen_ai.request.model"] = str(start["model"])
    if meta.get("parent"):
        attrs["primefs.session.parent"] = str(meta["parent"])
    if start.get("resumed"):
        attrs["primefs.turn.resumed"] = True
    if end is None:
        attrs["primefs.turn.unfinished"] = True
        return Spec(f"invoke_agent {name}", attrs, ts(start), last_ts)
    attrs.update({"primefs.turn.outcome": str(end.get("outcome")), "primefs.session.status": str(end.get("status"))})
    if end.get("stop_reason"):
        attrs["primefs.stop_reason"] = str(end["stop_reason"])
    error = ("turn_failed", meta.get("error")) if end.get("outcome") == "failed" else None
    return Spec(f"invoke_agent {name}", attrs, ts(start), ts(end), error=error)


def cell_span(sid: str, event: Cell | None, *, call_id=None, begin: float = 0.0, end: float = 0.0) -> Spec:
    """A cell from its `cell` event; without one (its runner died in it, or it runs) from `begin` to `end`."""
    call_id = event.get("call_id") if event is not None else call_id
    attrs = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "python", "gen_ai.tool.type": "function",
             "primefs.session.id": sid}
    if call_id:
        attrs["gen_ai.tool.call.id"] = str(call_id)
    if event is None:
        attrs["primefs.cell.unfinished"] = True
        return Spec("execute_tool python", attrs, begin, end)
    elapsed = number(event.get("elapsed_s"))
    attrs.update({"primefs.cell.elapsed_s": elapsed, "primefs.cell.timed_out": bool(event.get("timed_out")),
                  "primefs.cell.restarted": bool(event.get("restarted"))})
    kind = cell_error_type(event.get("error"))
    error = (kind, str(event["error"]).strip().splitlines()[-1]) if kind else None
    return Spec("execute_tool python", attrs, ts(event) - elapsed, ts(event), error=error)


def chat_span(sid: str, event: ModelCall | ModelErrorEvent) -> Spec:
    """A model call attempt from its `model_call` (or `model_error`) event."""
    model = str(event.get("model") or "")
    attrs = {"gen_ai.operation.name": "chat", "gen_ai.request.model": model,
             "gen_ai.provider.name": provider_name(model), "primefs.session.id": sid,
             "primefs.purpose": str(event.get("purpose") or "turn"), "primefs.attempt": number(event.get("attempt"), int) or 1}
    error = None
    if event.get("type") == "model_call":
        attrs.update({"gen_ai.usage.input_tokens": number(event.get("input_tokens"), int),
                      "gen_ai.usage.output_tokens": number(event.get("output_tokens"), int),
                      # semconv: both are parts of input_tokens
                      "gen_ai.usage.cache_read.input_tokens": number(event.get("cache_read_tokens"), int),
                      "gen_ai.usage.cache_creation.input_tokens": number(event.get("cache_write_tokens"), int),
                      "primefs.cost_usd": number(event.get("cost_usd")),
                      "primefs.cost_known": bool(event.get("cost_known"))})
        if event.get("response_model"):
            attrs["gen_ai.response.model"] = str(event["response_model"])
    else:
        error = ("model_error", event.get("error"))
    return Spec(f"chat {model}", attrs, ts(event) - number(event.get("latency_s")), ts(event), "CLIENT", error)


def cell_error_type(error: str | None) -> str | None:
    """`ZeroDivisionError` from a traceback's last line; None for a cell without an error."""
    if not error:
        return None
    last = next((ln.strip() for ln in reversed(str(error).splitlines()) if ln.strip()), "")
    head = last.split(":", 1)[0].strip()
    return head if head.replace(".", "").replace("_", "").isalnum() and " " not in head else "cell_error"


def emit(tracer, spec: Spec, ctx, parent) -> None:
    """Make and end the span `spec` says, with the ids `ctx` holds, under `parent` (a SpanContext, or None)."""
    from opentelemetry import trace
    from opentelemetry.trace import Status, StatusCode

    context = trace.set_span_in_context(trace.NonRecordingSpan(parent)) if parent is not None else None
    _given.ctx = ctx
    try:
        span = tracer.start_span(spec.name, context=context, kind=trace.SpanKind[spec.kind], attributes=spec.attrs,
                                 start_time=int(round(spec.start * 1e9)))
    finally:
        _given.ctx = None
    if spec.error:
        span.set_attribute("error.type", spec.error[0])
        span.set_status(Status(StatusCode.ERROR, str(spec.error[1] or spec.error[0])[:300]))
    span.end(end_time=int(round(spec.end * 1e9)))


# -- live spans ---------------------------------------------------------------------------------------
class _Noop:
    """What every hook returns while tracing is off."""

    __slots__ = ()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def done(self, event) -> None:
        pass


NOOP = _Noop()
_lock = threading.Lock()
_state: dict = {"checked": False, "tracer": None, "provider": None}
_open: dict[str, list] = {}  # session id -> SpanContexts of its open turn / cell, innermost last
_spawned: dict[str, object] = {}  # child id -> SpanContext innermost in the parent when it was spawned


class _Open(_Noop):
    """A turn or a cell running now: what runs inside it finds its ids here; its span is made when it ends,
    from the event that ends it (`done`), by the function that makes it from a history."""

    __slots__ = ("tracer", "sid", "ctx", "parent", "make", "event")

    def __init__(self, tracer, sid: str, ctx, parent, make):
        self.tracer, self.sid, self.ctx, self.parent, self.make, self.event = tracer, sid, ctx, parent, make, None

    def __enter__(self):
        with _lock:
            _open.setdefault(self.sid, []).append(self.ctx)
        return self

    def __exit__(self, exc_type, exc, tb):
        with _lock:
            stack = _open.get(self.sid) or []
            if self.ctx in stack:
                stack.remove(self.ctx)
            if not stack:
                _open.pop(self.sid, None)
        spec = self.make(self.event)
        if exc is not None:
            spec.error = (exc_type.__name__, str(exc))
        emit(self.tracer, spec, self.ctx, self.parent)
        return False

    def done(self, event) -> None:
        self.event = event


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


def _innermost(sid: str | None):
    if not sid:
        return None
    with _lock:
        stack = _open.get(sid)
        return stack[-1] if stack else None


def turn(session, start: dict):
    """Around one turn (turns.py), from its `turn_start`; `.done(turn_end)` when it is recorded."""
    tracer = _tracer()
    if tracer is None:
        return NOOP
    sid, parent = session.id, session.meta.get("parent")
    ctx = _innermost(parent)
    if ctx is None and parent:
        with _lock:
            ctx = _spawned.get(sid)
    return _Open(tracer, sid, span_context(sid, turn_key(start), ctx), ctx,
                 lambda end: turn_span(sid, session.meta, start, end, time.time()))


def cell(session, assistant: dict, k: int, call_id):
    """Around the k-th cell of the reply `assistant` (agent.py); `.done(cell_event)` when it is recorded."""
    tracer = _tracer()
    if tracer is None:
        return NOOP
    sid, parent, begin = session.id, _innermost(session.id), time.time()

    def make(event):
        return cell_span(sid, event) if event else cell_span(sid, None, call_id=call_id, begin=begin, end=time.time())
    return _Open(tracer, sid, span_context(sid, cell_key(assistant, k), parent), parent, make)


def where(sid: str):
    """What a model call of `sid` starting now goes under: its innermost open span (None: off, or none)."""
    return _innermost(sid) if _tracer() is not None else None


def model_call(session, event: dict, parent) -> None:
    """A model call attempt was recorded (gateway.py): its span, under `where()` as it was when it started."""
    tracer = _tracer()
    if tracer is not None:
        emit(tracer, chat_span(session.id, event), span_context(session.id, chat_key(event), parent), parent)


def spawned(parent: str, child: str) -> None:
    """`rlm()` made `child`: remember where in the parent it came from (services.py)."""
    if _tracer() is None:
        return
    ctx = _innermost(parent)
    if ctx is not None:
        with _lock:
            _spawned[child] = ctx
