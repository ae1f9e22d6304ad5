"""`primefs trace`: a session's history (and its descendants') replayed as OpenTelemetry spans.

The spans are the ones the runner makes live, made by the same functions from the same events, ids
included (tracing.py): a turn from `turn_start` to `turn_end`; a cell from its end (`ts`) back by
`elapsed_s`; a model call from its end back by `latency_s`. Parents follow tracing.py's rules: a model
call (or a spawn) goes under the cell whose events enclose it, else its turn; a child's turn under the
parent's cell (else turn) running when the child's turn started, else under the cell that spawned it.
A turn never closed (the session runs, or its runner died) ends at the last event its runner recorded and
says so (`primefs.turn.unfinished`), and so does the cell it was in (`primefs.cell.unfinished`): what a new
runner records when it resumes the turn (the cell said interrupted, the restart notice) is not part of it.
Model calls made outside any turn (`primefs refine` from the command line) are spans of their own.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from primefs.index.db import Index
from primefs.store.conversation import INTERRUPTED, RESUMED, fenced_code
from primefs.store.history import iter_events
from primefs.store.session import Session, subtree
from primefs.store.summary import fold_call, zero_usage
from primefs.tracing import spans as tracing


@dataclass
class _Interval:
    start: float
    end: float
    ctx: object  # the span's SpanContext
    first: int  # the events it encloses (indexes)
    last: int
    cells: list = field(default_factory=list)  # a turn's

    def holds(self, ts: float) -> bool:
        return self.start <= ts <= self.end


@dataclass
class _Replayed:
    """One session's spans, for its children to find their parents in."""
    turns: list[_Interval] = field(default_factory=list)
    spawn_cells: dict[str, object] = field(default_factory=dict)  # child id -> SpanContext where it was spawned

    def innermost(self, ts: float):
        for t in self.turns:
            if t.holds(ts):
                cell = next((c for c in reversed(t.cells) if c.holds(ts)), None)
                return (cell or t).ctx
        return None


def session_tree(ws, root: str) -> list[Session]:
    """`root` and its descendants, parents first (found through `parent` in each session.yaml)."""
    with Index(ws.root) as index:  # parents from the index: no session.yaml of the workspace parsed
        rows = index.tree(root)
    children: dict[str | None, list[str]] = {}
    for sid, row in rows.items():
        if not row["broken"] and (ws.sessions / sid).is_dir():  # a broken one is not part of a tree we can replay
            children.setdefault(row["parent"], []).append(sid)
    return [Session(ws.sessions / sid) for sid in subtree(children, root)]


def replay(ws, root: str, tracer) -> dict:
    """Make the spans of `root`'s tree with `tracer`. Returns counts (sessions, spans, traces, tokens)."""
    done: dict[str, _Replayed] = {}
    counts = {"sessions": 0, "spans": 0, "traces": set(), "usage": zero_usage(), "unfinished": 0}

    def emit(spec, ctx, parent):
        tracing.emit(tracer, spec, ctx, parent)
        counts["spans"] += 1
        counts["traces"].add(ctx.trace_id)

    for s in session_tree(ws, root):
        try:
            meta = s.meta
        except Exception:  # a broken session.yaml: nothing to say about it
            continue
        counts["sessions"] += 1
        events = [e for e in iter_events(s.dir / "history.jsonl") if isinstance(e, dict)]
        for i, e in enumerate(events):
            e.setdefault("n", i)  # histories older than the sequence number
        done[s.id] = _replay_session(s.id, meta, events, done.get(meta.get("parent")), emit, counts)
    counts["traces"] = len(counts["traces"])
    u = counts.pop("usage")
    return counts | {"input_tokens": u["input_tokens"], "output_tokens": u["output_tokens"]}


def _replay_session(sid: str, meta: dict, events: list[dict], parent: _Replayed | None, emit, counts) -> _Replayed:
    out = _Replayed()
    at: list[_Interval | None] = [None] * len(events)  # event index -> the innermost span it happened in
    for first, last, closed in _segments(events):
        start = events[first]
        stop = last if closed else _own_last(events, first, last)
        spec = tracing.turn_span(sid, meta, start, events[last] if closed else None, tracing.ts(events[stop]))
        above = (parent.innermost(spec.start) or parent.spawn_cells.get(sid)) if parent else None  # tracing.py's rule
        turn = _Interval(spec.start, spec.end, tracing.span_context(sid, tracing.turn_key(start), above), first, stop)
        emit(spec, turn.ctx, above)
        counts["unfinished"] += not closed
        at[first:stop + 1] = [turn] * (stop + 1 - first)
        for cell, cell_spec in _cells(sid, events, turn, closed):
            emit(cell_spec, cell.ctx, turn.ctx)
            turn.cells.append(cell)
            at[cell.first:cell.last + 1] = [cell] * (cell.last + 1 - cell.first)
        out.turns.append(turn)
    for i, e in enumerate(events):
        holder = at[i].ctx if at[i] is not None else None
        if e.get("type") == "spawn" and holder is not None:
            out.spawn_cells[e.get("child")] = holder
        elif e.get("type") in ("model_call", "model_error"):
            emit(tracing.chat_span(sid, e), tracing.span_context(sid, tracing.chat_key(e), holder), holder)
            if e["type"] == "model_call":
                fold_call(counts["usage"], e)
    return out


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


def _own_last(events: list[dict], first: int, last: int) -> int:
    """The last event of an unclosed turn that its own runner recorded: a runner that resumes the turn
    first answers the cells left without an end (INTERRUPTED), then says it restarted (RESUMED)."""
    for i in range(first + 1, last + 1):
        e = events[i]
        if (e.get("type"), e.get("error") if e.get("type") == "cell" else e.get("text")) in (
                ("cell", INTERRUPTED), ("notice", RESUMED)):
            return i - 1
    return last


def _cells(sid: str, events: list[dict], turn: _Interval, closed: bool) -> list[tuple[_Interval, object]]:
    """A turn's cells, each the k-th of the reply (assistant event) that asked for it, as agent.py counts
    them; and, in a turn not closed, the cell its runner started and never saw end."""
    out, asked, k, since = [], None, 0, turn.first
    for i in range(turn.first, turn.last + 1):
        e = events[i]
        if e.get("type") == "assistant":
            asked, k, since = e, 0, i
        elif e.get("type") == "cell" and asked is not None:
            if "elapsed_s" in e:  # it ran (a tool call that was no cell did not: no span, as live)
                spec = tracing.cell_span(sid, e)
                ctx = tracing.span_context(sid, tracing.cell_key(asked, k), turn.ctx)
                out.append((_Interval(spec.start, spec.end, ctx, since + 1, i), spec))
            k, since = k + 1, i
    calls = (asked or {}).get("calls") or []
    if not closed and asked is not None and k < (len(calls) or len(fenced_code(asked.get("text") or ""))):
        spec = tracing.cell_span(sid, None, call_id=calls[k]["id"] if calls else None,
                                 begin=tracing.ts(events[since]), end=turn.end)
        ctx = tracing.span_context(sid, tracing.cell_key(asked, k), turn.ctx)
        out.append((_Interval(spec.start, spec.end, ctx, since + 1, turn.last), spec))
    return out
