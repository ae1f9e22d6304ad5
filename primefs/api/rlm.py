"""`primefs.RLM`: the `rlms` library's interface over primefs sessions, so code written for
`from rlm import RLM` runs with its import changed (docs/python-api.md maps every rlms argument).

`RLM(...).completion(context, root_prompt)` is one `Workspace.ask()`: the context is the session's
`context`, root_prompt its task. With no workspace given, each completion runs in a new temporary
workspace, removed afterwards unless `keep=True` (then `result.workspace` names it, to inspect or replay).
"""
from __future__ import annotations

import shutil
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from primefs.errors import PrimefsError

SHORT_PROMPT = 2000  # chars: a lone short prompt is the task itself (as rlms's examples use it)
DEFAULT_TASK = ("The task and its material are in `context` (a {kind} of {n:,} characters): read it there, "
                "do what it asks, and answer.")
# rlms arguments primefs has no counterpart for: accepted (code written for rlms runs) and said once.
IGNORED = ("environment_kwargs", "depth", "max_errors", "custom_system_prompt", "other_backends",
           "other_backend_kwargs", "logger", "persistent", "custom_tools", "custom_sub_tools", "compaction",
           "compaction_threshold_pct", "max_concurrent_subcalls", "on_subcall_start", "on_subcall_complete",
           "on_iteration_start", "on_iteration_complete", "sampling_args", "sub_sampling_args", "orchestrator",
           "user_prologue")
# rlms's `backend` names -> litellm's provider prefix
BACKENDS = {"openai": "openai", "anthropic": "anthropic", "openrouter": "openrouter", "vllm": "hosted_vllm",
            "gemini": "gemini", "azure_openai": "azure", "litellm": ""}


@dataclass
class ModelUsageSummary:
    total_calls: int
    total_input_tokens: int
    total_output_tokens: int
    total_cost: float | None = None

    def to_dict(self) -> dict:
        d = {"total_calls": self.total_calls, "total_input_tokens": self.total_input_tokens,
             "total_output_tokens": self.total_output_tokens}
        if self.total_cost is not None:
            d["total_cost"] = self.total_cost
        return d


@dataclass
class UsageSummary:
    """rlms's shape: per model (here: per model of the sessions of the tree), calls and tokens."""

    model_usage_summaries: dict[str, ModelUsageSummary] = field(default_factory=dict)

    @property
    def total_cost(self) -> float | None:
        costs = [m.total_cost for m in self.model_usage_summaries.values() if m.total_cost is not None]
        return round(sum(costs), 10) if costs else None

    @property
    def total_input_tokens(self) -> int:
        return sum(m.total_input_tokens for m in self.model_usage_summaries.values())

    @property
    def total_output_tokens(self) -> int:
        return sum(m.total_output_tokens for m in self.model_usage_summaries.values())

    def to_dict(self) -> dict:
        d: dict = {"model_usage_summaries": {k: v.to_dict() for k, v in self.model_usage_summaries.items()}}
        if self.total_cost is not None:
            d["total_cost"] = self.total_cost
        return d


@dataclass
class RLMCompletion:
    """rlms's RLMChatCompletion, plus where the run is: its session and (if kept) its workspace."""

    root_model: str
    prompt: object
    response: str
    usage_summary: UsageSummary
    execution_time: float  # seconds
    metadata: dict | None = None
    error: str | None = None
    session_id: str = ""
    workspace: Path | None = None  # None once a temporary workspace is removed

    def to_dict(self) -> dict:
        d = {"root_model": self.root_model, "prompt": self.prompt, "response": self.response,
             "usage_summary": self.usage_summary.to_dict(), "execution_time": self.execution_time}
        for k in ("metadata", "error"):
            if getattr(self, k) is not None:
                d[k] = getattr(self, k)
        return d

    def __str__(self) -> str:
        return self.response


class RLM:
    """A recursive language model over primefs sessions. `model`: an alias of the workspace's primefs.yaml
    or a litellm model id (default: the workspace's model, `local` in a new one)."""

    def __init__(self, model: str | None = None, *, max_depth: int = 1, max_iterations: int = 30,
                 max_budget: float | None = None, max_timeout: float | None = None, max_tokens: int | None = None,
                 workspace=None, keep: bool = False, verbose: bool = False, backend: str | None = None,
                 backend_kwargs: dict | None = None, environment: str = "local", **rlms_only):
        unknown = set(rlms_only) - set(IGNORED)
        if unknown:
            raise TypeError(f"RLM() got unexpected argument(s): {', '.join(sorted(unknown))}")
        given = sorted(k for k, v in rlms_only.items() if v not in (None, False, 0))
        if given:
            warnings.warn(f"primefs.RLM: {', '.join(given)} have no effect here (docs/python-api.md)", stacklevel=2)
        if environment not in ("local", "ipython"):
            warnings.warn(f"primefs.RLM: environment={environment!r}: primefs runs code in its own kernel "
                          "(an IPython kernel per session, sandboxed as primefs.yaml says)", stacklevel=2)
        self.model = model or _model_of(backend, backend_kwargs or {})
        for name, value in (("max_depth", max_depth), ("max_iterations", max_iterations)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PrimefsError(f"RLM({name}=...) must be a whole number of at least 1, not {value!r}")
        self.max_depth, self.max_iterations = max_depth, max_iterations
        self.budget = {k: v for k, v in (("cost_usd", max_budget), ("seconds", max_timeout),
                                         ("tokens", max_tokens)) if v is not None}
        self.workspace, self.keep, self.verbose = workspace, keep, verbose

    def completion(self, prompt, root_prompt: str | None = None) -> RLMCompletion:
        """Run one task: `prompt` is the context (str, dict or list); `root_prompt` the task the model is
        shown (a lone short str prompt is the task itself). Raises BudgetExceeded when max_budget,
        max_timeout or max_tokens runs out, SessionFailed when the session fails."""
        from primefs.api.workspace import Workspace

        if root_prompt is None and isinstance(prompt, str) and len(prompt) <= SHORT_PROMPT:
            task, context = prompt, None
        else:
            task = root_prompt or DEFAULT_TASK.format(kind=type(prompt).__name__, n=len(str(prompt)))
            context = prompt
        started = time.perf_counter()
        temp = None
        if self.workspace is None:
            temp = Path(tempfile.mkdtemp(prefix="primefs-rlm-"))
            ws = Workspace.init(temp / "workspace")
        else:
            ws = self.workspace if isinstance(self.workspace, Workspace) else Workspace(self.workspace)
        try:
            # rlms's max_depth counts the root (1: sub-calls are plain LM calls); primefs's counts children
            limits = {"max_steps_per_turn": self.max_iterations, "max_depth": self.max_depth - 1}
            handle = ws.submit(task, context=context, model=self.model, budget=self.budget or None, limits=limits)
            if self.verbose:
                _narrate(handle)
            from primefs.api.sessions import check_ended

            result = check_ended(handle.wait())
            usage = _per_model(ws, handle.id)
        finally:
            if temp is not None:
                ws.close()
                if not self.keep:
                    shutil.rmtree(temp, ignore_errors=True)
        return RLMCompletion(root_model=handle.session.meta.get("model") or "", prompt=prompt,
                             response=result.answer or "", usage_summary=usage,
                             execution_time=time.perf_counter() - started, session_id=handle.id,
                             workspace=ws.root if (temp is None or self.keep) else None)


def _model_of(backend: str | None, kwargs: dict) -> str | None:
    """rlms's backend + backend_kwargs={"model_name": ...} as a litellm id (None: the workspace's model)."""
    name = kwargs.get("model_name")
    if not name:
        return None
    if backend not in BACKENDS and backend is not None:
        raise PrimefsError(f"RLM(backend={backend!r}): give model= (an alias or a litellm id) instead")
    if kwargs.get("base_url") or kwargs.get("api_key"):
        raise PrimefsError("RLM(backend_kwargs=...): base_url and api_key belong in a model alias of primefs.yaml "
                           "(docs/models.md); pass model=<alias> and workspace=...")
    prefix = BACKENDS.get(backend or "openai", "")
    return f"{prefix}/{name}" if prefix and not str(name).startswith(prefix + "/") else str(name)


def _per_model(ws, sid: str) -> UsageSummary:
    """The tree's usage by each session's model (every call is counted once, by the session that made it)."""
    from primefs.index.accounting import UsageIndex
    from primefs.store.session import subtree

    index = UsageIndex(ws._ws.sessions, root=sid)
    out: dict[str, ModelUsageSummary] = {}
    for s in subtree(index.children, sid):
        u = index.own[s]
        entry = index.sessions.get(s)
        model = str(entry.meta.get("model")) if entry is not None else "unknown"
        m = out.setdefault(model, ModelUsageSummary(0, 0, 0, None))
        m.total_calls += u["calls"]
        m.total_input_tokens += u["input_tokens"]
        m.total_output_tokens += u["output_tokens"]
        if u.get("cost_usd"):
            m.total_cost = round((m.total_cost or 0.0) + u["cost_usd"], 10)
    return UsageSummary(out)


def _narrate(handle) -> None:
    """verbose=True: the session's steps on stderr as they happen (a thread; it ends with the session)."""
    import threading

    from primefs.views.console import err
    from primefs.views.events import EventPrinter

    def run():
        printer = EventPrinter(err(), {})
        for event in handle.events():
            printer.event(event)
        printer.end_line()

    threading.Thread(target=run, name="primefs-rlm-verbose", daemon=True).start()
