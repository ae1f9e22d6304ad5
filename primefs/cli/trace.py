"""`primefs trace SESSION`: replay a session tree's history as OpenTelemetry spans (tracereplay.py)."""
from __future__ import annotations

import json

import click

from primefs.cli.options import workspace, ws_option
from primefs.errors import PrimefsError
from primefs.index.db import find_session


class _Counting:
    """Wraps a span exporter to learn whether every batch got through (exporters only log failures)."""

    def __init__(self, inner):
        self.inner, self.sent, self.failed = inner, 0, 0

    def export(self, spans):
        from opentelemetry.sdk.trace.export import SpanExportResult

        result = self.inner.export(spans)
        if result == SpanExportResult.SUCCESS:
            self.sent += len(spans)
        else:
            self.failed += len(spans)
        return result

    def shutdown(self):
        return self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000):
        return getattr(self.inner, "force_flush", lambda *_: True)(timeout_millis)


def span_record(span) -> dict:
    """One finished span as plain data (for --json)."""
    def hexid(n, width):
        return format(n, f"0{width}x") if n is not None else None

    ctx = span.get_span_context()
    return {"name": span.name, "trace_id": hexid(ctx.trace_id, 32), "span_id": hexid(ctx.span_id, 16),
            "parent_span_id": hexid(span.parent.span_id, 16) if span.parent else None,
            "kind": span.kind.name, "start": span.start_time / 1e9, "end": span.end_time / 1e9,
            "status": span.status.status_code.name, "attributes": dict(span.attributes or {})}


@click.command("trace")
@click.argument("session")
@click.option("--json", "as_json", is_flag=True,
              help="Print the spans, one JSON object per line, instead of exporting them.")
@ws_option
@click.pass_context
def trace_cmd(ctx, session, as_json):
    """Replay SESSION's history and its descendants' as OpenTelemetry spans (turns, model calls, cells).

    Exported as the OTEL_* environment says (e.g. OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4318);
    see docs/observability.md.
    """
    from primefs.tracing import spans as tracing
    from primefs.tracing.replay import replay, session_tree

    ws = workspace(ctx)
    s = find_session(ws.sessions, session)
    names = tracing.exporters_from_env()
    if not as_json and not names:
        raise PrimefsError("tracing is not configured: set OTEL_EXPORTER_OTLP_ENDPOINT (e.g. http://localhost:4318) "
                           "or OTEL_TRACES_EXPORTER=console, or use --json")
    running = [t.id for t in session_tree(ws, s.id) if _status(t) == "running"]
    if running:
        click.echo(f"note: {len(running)} session(s) of this tree are running ({', '.join(running[:3])}); "
                   "an open turn ends at its last event", err=True)
    try:
        if as_json:
            from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

            memory = InMemorySpanExporter()
            provider = tracing.make_provider(span_exporter=memory)
        else:
            from opentelemetry.sdk.trace.export import BatchSpanProcessor

            provider = tracing.make_provider()
            exporters = [_Counting(tracing.exporter(n)) for n in names]
            for exp in exporters:
                provider.add_span_processor(BatchSpanProcessor(exp))
    except ImportError:
        raise PrimefsError("tracing needs opentelemetry: pip install 'primefs[otel]'") from None
    except tracing.TracingError as exc:
        raise PrimefsError(str(exc)) from None
    counts = replay(ws, s.id, provider.get_tracer("primefs"))
    provider.force_flush()
    provider.shutdown()
    if as_json:
        for span in sorted(memory.get_finished_spans(), key=lambda sp: sp.start_time):
            click.echo(json.dumps(span_record(span), default=str))
        return
    failed = sum(e.failed for e in exporters)
    if failed:
        raise PrimefsError(f"{failed} of {counts['spans']} spans could not be exported ({', '.join(names)}); "
                           "check OTEL_EXPORTER_OTLP_ENDPOINT and that the collector runs")
    click.echo(f"{s.id} ({s.name}): {counts['spans']} spans in {counts['traces']} trace(s) from "
               f"{counts['sessions']} session(s), {counts['input_tokens']:,} input and "
               f"{counts['output_tokens']:,} output tokens, exported to {', '.join(names)}")


def _status(s) -> str | None:
    try:
        return s.meta.get("status")
    except Exception:
        return None
