"""The events of history.jsonl, typed: one TypedDict per event type, and EVENTS, the one registry of them.

Writers and readers share it. `History.append` checks every event it writes against it when
PRIMEFS_CHECK_EVENTS is set (the test suite sets it: a writer that adds a field, or writes a type, not
declared here fails there, not in a reader months later). `history.parse_event` reads through it: the
fields readers rely on (`Required`, or `Annotated[..., READ]` when present) must have their type, else the
line counts as garbled; any other field is read with `.get()` and checked where it is used (a hand-written
`input_tokens: "many"` counts as nothing). docs/workspace.md's table of events is checked against it
(tests/unit/test_events.py).

Every event also has `ts` (Unix seconds), `type` and `n` (its place in the session's history), set by
`History.append`; `text` and `error`, on any event, are text or null.
"""
import types
import typing
from typing import Annotated, Any, Literal, Required, TypedDict

READ = "read"  # Annotated[T, READ]: readers rely on this field when present, so its type is checked on read

class Event(TypedDict, total=False):
    """What every event has, set by History.append."""
    ts: Required[float]
    type: Required[str]
    n: int


Outcome = Literal["idle", "done", "failed", "max_steps", "loop", "stopped", "interrupted"]


class Task(Event, total=False):
    text: Required[str]


class Notice(Event, total=False):
    text: Required[str]
    direct: dict  # a direct eval session: what its one prompt held


class WarningEvent(Event, total=False):
    text: str


Message = TypedDict("Message", {**Event.__annotations__, "id": Required[str], "from": Required[str], "kind": Required[str],
                                "text": Required[str], "read_by": Literal["code", "wait"]}, total=False)


class BadMail(Event, total=False):
    file: str
    error: str


class Status(Event, total=False):
    status: str
    previous: str | None
    stop_reason: str
    error: str


class TurnStart(Event, total=False):
    turn: int
    model: str
    resumed: bool


class TurnEnd(Event, total=False):
    turn: int
    outcome: Outcome
    elapsed_s: float
    status: str
    stop_reason: str | None


class Kernel(Event, total=False):
    event: Literal["started", "restarted", "stopped"]
    reason: str | None
    pid: int | None
    node: str
    start_s: float


class Restored(Event, total=False):
    restored: list
    modules: list
    failed: list
    skipped: list
    error: str


class Snapshot(Event, total=False):
    reason: str
    saved: int
    bytes: int
    skipped: list
    error: str


class ModelCall(Event, total=False):
    model: str
    purpose: str
    response_model: str
    attempt: int
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    cost_usd: float
    cost_known: bool
    latency_s: float


class ModelErrorEvent(Event, total=False):
    model: str
    purpose: str
    attempt: int
    error: str
    retry_in_s: float
    latency_s: float


class Assistant(Event, total=False):
    text: str | None
    calls: Annotated[list | None, READ]  # of {id, name, arguments}, each a string (checked on read)


class Cell(Event, total=False):
    call_id: Annotated[str | None, READ]
    code: str | None
    output: str
    error: str | None
    timed_out: bool
    restarted: bool
    elapsed_s: float
    shown: Required[str]  # exactly what the model sees


class Result(Event, total=False):
    text: str


class ErrorEvent(Event, total=False):
    error: str


class Spawn(Event, total=False):
    child: str
    name: str
    model: str | None
    task: str
    agent: str | None


class Sent(Event, total=False):
    to: list
    target: str
    kind: str
    text: str


class DoneRefused(Event, total=False):
    answer: str
    report: str


class EndConditions(Event, total=False):
    results: list
    report: str


class Budget(Event, total=False):
    reason: str
    detail: str


class Harness(Event, total=False):
    op: Literal["put", "delete"]
    kind: str
    name: str
    scope: str
    commit: str | None


class HeartbeatSet(Event, total=False):
    id: str
    schedule: str
    prompt: str | None


class ToolCall(Event, total=False):
    name: str
    plugin: str | None
    duration_s: float
    error: str | None


class Refine(Event, total=False):
    instructions: str | None
    scope: str
    applied: list
    rejected: list
    outcomes: list
    error: str
    gate: dict  # the gate's verdict (harness.md, "Gated refinements")
    proposal: str | None  # the commit of a refinement the gate did not keep (or could not run)


class Exec(Event, total=False):
    by: Literal["user"]
    code: str
    output: str
    error: str | None
    timed_out: bool
    restarted: bool
    elapsed_s: float


class KernelConnect(Event, total=False):
    by: Literal["user"]
    file: str


class Compaction(Event, total=False):
    upto_n: Required[int]
    replaced: int
    kept_from_n: int
    summary: Required[str]
    tokens_before: int


class Judge(Event, total=False):
    model: str
    passed: bool
    reason: str


class ApprovalRequest(Event, total=False):
    approval: Required[int]
    kind: Literal["cell", "tool", "children", "cost"]
    what: str
    why: str
    timeout_s: float | None
    default: str


class Approval(Event, total=False):
    approval: Required[int]
    verdict: Literal["approved", "denied", "void"]
    by: str
    via: str
    reason: str | None


class CompactionDone(Event, total=False):
    n_compaction: int
    tokens_after: int


EVENTS: dict[str, type] = {
    "task": Task, "notice": Notice, "warning": WarningEvent, "message": Message, "bad_mail": BadMail, "status": Status,
    "turn_start": TurnStart, "turn_end": TurnEnd, "kernel": Kernel, "restored": Restored, "snapshot": Snapshot,
    "model_call": ModelCall, "model_error": ModelErrorEvent, "assistant": Assistant, "cell": Cell, "result": Result,
    "error": ErrorEvent, "spawn": Spawn, "sent": Sent, "done_refused": DoneRefused, "end_conditions": EndConditions,
    "budget": Budget, "harness": Harness, "heartbeat_set": HeartbeatSet, "tool_call": ToolCall, "refine": Refine,
    "exec": Exec, "kernel_connect": KernelConnect, "compaction": Compaction, "compaction_done": CompactionDone,
    "judge": Judge, "approval_request": ApprovalRequest, "approval": Approval,
}
# On every event, whatever its type: (types, required). `ts` and `type` are checked by parse_event itself.
COMMON: dict[str, tuple[tuple, bool]] = {"n": ((int,), False), "text": ((str, type(None)), False),
                                         "error": ((str, type(None)), False)}


# -- the registry read as plain data: for each type, every field's (type, required, checked on read) ------
def _fields(td: type) -> dict[str, tuple[Any, bool, bool]]:
    out = {}
    for name, hint in typing.get_type_hints(td, include_extras=True).items():
        if name in Event.__annotations__:
            continue
        read = False
        while typing.get_origin(hint) in (Annotated, Required):
            read = read or (typing.get_origin(hint) is Annotated and READ in hint.__metadata__)
            hint = hint.__origin__ if typing.get_origin(hint) is Annotated else typing.get_args(hint)[0]
        required = name in td.__required_keys__
        out[name] = (hint, required, read or required)
    return out


FIELDS: dict[str, dict[str, tuple[Any, bool, bool]]] = {name: _fields(td) for name, td in EVENTS.items()}


def _classes(hint) -> tuple[type, ...]:
    """The runtime classes a type hint allows (str | None -> (str, NoneType); list[x] -> (list,))."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return tuple(c for arg in typing.get_args(hint) for c in _classes(arg))
    if origin is Literal:
        return tuple({type(v) for v in typing.get_args(hint)})
    if hint is None or hint is type(None):
        return (type(None),)
    if hint is float:
        return (float, int)  # 0 is a time too
    return (origin or hint,)


def fits(value, hint) -> bool:
    if isinstance(value, bool) and bool not in _classes(hint):  # True is an int to Python, not to a reader
        return False
    if typing.get_origin(hint) is Literal:
        return value in typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return any(fits(value, arg) for arg in typing.get_args(hint))
    return isinstance(value, _classes(hint))


# What parse_event checks, by type: the fields readers rely on, as (classes, required).
SHAPES: dict[str, dict[str, tuple[tuple, bool]]] = {
    name: {f: (_classes(hint), required) for f, (hint, required, read) in fields.items() if read}
    for name, fields in FIELDS.items()}


def problem(type: str, fields: dict) -> str | None:
    """What is wrong with an event about to be written (None: nothing), by the registry."""
    declared = FIELDS.get(type)
    if declared is None:
        return f"event type {type!r} is not declared in primefs/store/events.py"
    for name, value in fields.items():
        if name in declared:
            hint = declared[name][0]
            wrong = not fits(value, hint)
        elif name in COMMON:
            hint = COMMON[name][0]
            wrong = isinstance(value, bool) or not isinstance(value, hint)
        else:
            return f"event {type!r}: field {name!r} is not declared in primefs/store/events.py"
        if wrong:
            return f"event {type!r}: field {name!r} is {value!r}, not {hint}"
    missing = [f for f, (_, required, _) in declared.items() if required and f not in fields]
    return f"event {type!r}: missing {', '.join(missing)}" if missing else None
