"""`primefs trace`: a session's history (and its descendants') replayed as OpenTelemetry spans.

The spans, their names, attributes and parents are those the runner makes live (tracing.py), with the
times the history recorded: a turn from `turn_start` to `turn_end`; a cell from its end (`ts`) back by
`elapsed_s`; a model call from its end back by `latency_s`. Parents follow tracing.py's rules, decided
from the times: a child's turn goes under the parent's cell (else turn) running when the child's turn
started, else under the cell that spawned it. A turn never closed (the session runs, or a runner died)
ends at its last event and says so (`primefs.turn.unfinished`). Model calls made outside any turn
(`primefs refine` from the command line) are spans of their own.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from . import tracing
from .history import iter_events
from .index import Index
from .session import Session

NS = 1_000_000_000
LLM_PURPOSES = ("llm", "llm_batch")  # calls made by code in a cell: under that cell


def _ns(ts: float) -> int:
    return int(round(float(ts) * NS))


@dataclass
class _Interval:
    start: float
    end: float
    span: object
    children: list = field(default_factory=list)  # cells inside a turn

    def holds(self, ts: float) -> bool:
        return self.start <= ts <= self.end


@dataclass
class _Replayed:
    """One session's spans, for its children to find their parents in."""
    turns: list[_Interval] = field(default_factory=list)
    spawn_cells: dict[str, object] = field(default_factory=dict)  # child id -> span of the cell that spawned it

    def innermost(self, ts: float):
        for t in self.turns:
            if t.holds(ts):
                cell = next((c for c in reversed(t.children) if c.holds(ts)), None)
                return (cell or t).span
        return None


def session_tree(ws, root: str) -> list[Session]:
    """`root` and its descendants, parents first (found through `parent` in each session.yaml)."""
    index = Index(ws.root)  # parents from the index: no session.yaml of the workspace parsed
    try:
        rows = index.tree(root)
    finally:
        index.close()
    children: dict[str | None, list[str]] = {}
    for sid, row in rows.items():
        if not row["broken"] and (ws.sessions / sid).is_dir():  # a broken one is not part of a tree we can replay
            children.setdefault(row["parent"], []).append(sid)
    order, stack, seen = [], [root], set()
    while stack:  # depth first, children in creation order; a hand-made cycle is cut
        sid = stack.pop()
        if sid in seen:
            continue
        seen.add(sid)
        order.append(sid)
        stack.extend(sorted(children.get(sid, []), reverse=True))
    return [Session(ws.sessions / sid) for sid in order]


def replay(ws, root: str, tracer) -> dict:
    """Make the spans of `root`'s tree with `tracer`. Returns counts (sessions, spans, traces, tokens)."""
    from opentelemetry import trace

    done: dict[str, _Replayed] = {}
    counts = {"sessions": 0, "spans": 0, "traces": set(), "input_tokens": 0, "output_tokens": 0, "unfinished": 0}

    def start(name, attrs, ts, parent, kind=trace.SpanKind.INTERNAL):
        ctx = trace.set_span_in_context(parent) if parent is not None else None
        span = tracer.start_span(name, context=ctx, attributes=attrs, start_time=_ns(ts), kind=kind)
        counts["spans"] += 1
        counts["traces"].add(span.get_span_context().trace_id)
        return span

    for s in session_tree(ws, root):
        try:
            meta = s.meta
        except Exception:  # a broken session.yaml: nothing to say about it
            continue
        counts["sessions"] += 1
        events = [e for e in iter_events(s.dir / "history.jsonl") if isinstance(e, dict)]
        done[s.id] = _replay_session(s.id, meta, events, done.get(meta.get("parent")), start, counts)
    counts["traces"] = len(counts["traces"])
    return counts


def _segments(events: list[dict]) -> list[tuple[int, int, bool]]:
    """Turns as (index of turn_start, index of their last event, closed by a turn_end)."""
    out, begin = [], None
    for i, e in enumerate(events):
        if e.get("type") == "turn_start":
            if begin is not None:
                out.append((begin, i - 1, False))
            begin = i
        elif e.get("type") == "turn_end" and begin is not None:
            out.append((begin, i, True))
            begin = None
    if begin is not None:
        out.append((begin, len(events) - 1, False))
    return out


def _ran(e: dict) -> bool:
    return e.get("type") == "cell" and "elapsed_s" in e  # a cell that never ran has no span (as live)


def _replay_session(sid: str, meta: dict, events: list[dict], parent: _Replayed | None, start, counts) -> _Replayed:
    from opentelemetry import trace

    out = _Replayed()
    turn_of: dict[int, _Interval] = {}  # event index -> the turn it happened in
    for first, last, closed in _segments(events):
        e, end = events[first], events[last]
        name, attrs = tracing.turn_attrs(sid, meta, e.get("turn") or 0, bool(e.get("resumed")))
        ts = float(e.get("ts") or 0.0)
        turn = _Interval(ts, float(end.get("ts") or ts), start(name, attrs, ts, _turn_parent(sid, parent, ts)))
        if closed:
            turn.span.set_attributes(tracing.turn_end_attrs(end.get("outcome"), end.get("status"), end.get("stop_reason")))
            if end.get("outcome") == "failed":
                tracing.mark_error(turn.span, "turn_failed", meta.get("error"))
        else:
            turn.span.set_attribute("primefs.turn.unfinished", True)
            counts["unfinished"] += 1
        out.turns.append(turn)
        for i in range(first, last + 1):
            turn_of[i] = turn
    cells: dict[int, object] = {}  # event index of a cell -> its span
    for i, e in enumerate(events):
        if _ran(e):
            ts = float(e.get("ts") or 0.0)
            begin = ts - float(e.get("elapsed_s") or 0.0)
            name, attrs = tracing.cell_attrs(sid, e.get("call_id"))
            attrs.update({"primefs.cell.elapsed_s": float(e.get("elapsed_s") or 0.0),
                          "primefs.cell.timed_out": bool(e.get("timed_out")),
                          "primefs.cell.restarted": bool(e.get("restarted"))})
            turn = turn_of.get(i)
            span = cells[i] = start(name, attrs, begin, turn.span if turn else None)
            kind = tracing.cell_error_type(e.get("error"))
            if kind:
                tracing.mark_error(span, kind, str(e["error"]).strip().splitlines()[-1])
            if turn is not None:
                turn.children.append(_Interval(begin, ts, span))
    for i, e in enumerate(events):
        t = e.get("type")
        if t == "spawn":  # made by the cell running then: the next cell event, recorded when it ended
            j = _next_cell(events, i)
            if j is not None:
                out.spawn_cells[e.get("child")] = cells[j]
        elif t in ("model_call", "model_error"):
            ts = float(e.get("ts") or 0.0)
            purpose = e.get("purpose") or "turn"
            turn = turn_of.get(i)
            holder = turn.span if turn else None
            if turn is not None and purpose in LLM_PURPOSES:  # from code: under the cell running then
                j = _next_cell(events, i, within=turn)
                holder = cells[j] if j is not None and turn_of.get(j) is turn else holder
            name, attrs = tracing.model_attrs(sid, e.get("model") or "", purpose, e.get("attempt") or 1)
            span = start(name, attrs, ts - float(e.get("latency_s") or 0.0), holder, trace.SpanKind.CLIENT)
            if t == "model_call":
                span.set_attributes(tracing.usage_attrs(e.get("input_tokens"), e.get("output_tokens"),
                                                        e.get("cost_usd"), e.get("cost_known")))
                counts["input_tokens"] += int(e.get("input_tokens") or 0)
                counts["output_tokens"] += int(e.get("output_tokens") or 0)
            else:
                tracing.mark_error(span, "model_error", e.get("error"))
            span.end(end_time=_ns(ts))
    for i, span in cells.items():
        span.end(end_time=_ns(float(events[i].get("ts") or 0.0)))
    for turn in out.turns:
        turn.span.end(end_time=_ns(turn.end))
    return out


def _next_cell(events: list[dict], i: int, within=None) -> int | None:
    for j in range(i + 1, len(events)):
        if _ran(events[j]):
            return j
        if within is not None and events[j].get("type") in ("turn_start", "turn_end"):
            return None
    return None


def _turn_parent(sid: str, parent: _Replayed | None, ts: float):
    """tracing.py's rule: the parent's innermost span running at `ts`, else the cell that spawned `sid`."""
    if parent is None:
        return None
    return parent.innermost(ts) or parent.spawn_cells.get(sid)
