"""The model gateway: every model call the runner makes goes through here.

Before a call: the session's budgets and stop flags (goalctl). The call: the provider that serves
the model, in a thread of its own, so that it always ends: after `limits.model_timeout_s`, after
`limits.stream_idle_timeout_s` without a streamed chunk, or within a quarter second of a stop
(`primefs stop`, `down`, Ctrl-C); then bounded retries with exponential backoff. After: one
`model_call` (or `model_error`) event in the history of the session that made the call, and the
goal's usage counters.
"""
from __future__ import annotations

import threading
import time

from primefs.errors import SessionStopping
from primefs.plugins import provider_for
from primefs.providers.base import ModelError, ModelReply
from primefs.providers.models import key_status
from primefs.runner.bell import Bell
from primefs.runner.goalctl import GoalControl
from primefs.runner.workers import Workers
from primefs.store import redact
from primefs.store.history import mend_surrogates
from primefs.store.livefeed import ReplyStream
from primefs.tracing import spans as tracing


class ModelGateway:
    def __init__(self, ws, providers: list, goals: GoalControl, bell: Bell, log):
        self.ws, self.providers, self.goals, self.bell, self.log = ws, providers, goals, bell, log
        self.calls: set[threading.Event] = set()  # provider calls in flight (abandoned ones too): set when ended
        self.workers = Workers("model")
        self._calls_lock = threading.Lock()

    def complete(self, agent, messages: list[dict], tools, *, purpose: str, settings: dict | None = None) -> ModelReply:
        """One model call for `agent` (its session, limits, settings). Raises ModelError after the
        last retry, BudgetExhausted or SessionStopping before a call that must not be paid for."""
        self.goals.before_model_call(agent)
        if getattr(agent, "approvals", None) is not None:  # past a cost mark of approve.cost_usd: a person's yes
            agent.approvals.check_cost(agent)
        settings = dict(settings or agent.settings)
        settings["workspace"] = str(self.ws.root)
        settings["_purpose"] = purpose
        provider = provider_for(self.providers, settings["model"], settings.get("provider"))
        if provider.name == "litellm":  # a missing key is said plainly, once, not retried
            problem = key_status(settings)[1]
            if problem:
                _record(agent, tracing.where(agent.session.id), "model_error", model=settings["model"], purpose=purpose,
                        attempt=1, error=problem, retry_in_s=0, latency_s=0.0)
                raise ModelError(problem, retryable=False)
        retries = agent.limits.model_retries
        backoff = agent.limits.model_retry_backoff_s
        for attempt in range(retries + 1):
            started = time.monotonic()
            parent = tracing.where(agent.session.id)  # its span goes where the session is when it starts
            try:
                reply = self._call(agent, provider, messages, tools, settings)
            except ModelError as exc:
                last = attempt == retries or not exc.retryable
                wait = 0 if last else backoff * (2 ** attempt)
                _record(agent, parent, "model_error", model=settings["model"], purpose=purpose, attempt=attempt + 1,
                        error=str(exc), retry_in_s=wait, latency_s=round(time.monotonic() - started, 4))
                if last:
                    raise
                self.log(f"{agent.session.id}: model error (attempt {attempt + 1}), retrying in {wait:g} s: {exc}")
                self._pause(agent, wait)
                continue
            event = _record(agent, parent, "model_call", model=settings["model"], purpose=purpose,
                            **({"response_model": reply.model} if reply.model else {}),
                            **({"attempt": attempt + 1} if attempt else {}), input_tokens=reply.input_tokens,
                            output_tokens=reply.output_tokens, **_cached(reply), cost_usd=reply.cost_usd,
                            cost_known=reply.cost_known,
                            latency_s=round(time.monotonic() - started, 4))
            self.goals.record_call(agent.session.id, event)
            return redacted(reply)
        raise AssertionError("unreachable")

    def prompt_tokens(self, settings: dict, messages: list[dict]) -> int:
        """Tokens of a prompt: by the model's own tokenizer where its provider has one (count_tokens),
        else a cautious bound (cautious_tokens)."""
        count = getattr(provider_for(self.providers, settings["model"], settings.get("provider")), "count_tokens", None)
        if count is not None:
            try:
                return int(count(messages, settings))
            except Exception:  # noqa: BLE001 - a tokenizer that fails leaves the estimate
                pass
        return cautious_tokens(messages)

    def _call(self, agent, provider, messages, tools, settings: dict) -> ModelReply:
        """The provider's call in a thread of its own, waited for until it ends, times out, goes
        quiet while streaming, or the session or runner stops. An abandoned call is told to stop
        (`_cancel`, which streaming providers check between chunks); its result is dropped."""
        total = agent.limits.model_timeout_s
        idle = agent.limits.stream_idle_timeout_s
        cancel = threading.Event()
        last_chunk = [time.monotonic()]
        stream = ReplyStream(self.ws.runtime, agent.session.id)

        def progress(text: str = "") -> None:  # a streaming provider calls this with each piece of text
            last_chunk[0] = time.monotonic()
            stream.write(mend_surrogates(text))  # (as in ModelReply: a server's JSON may hold lone ones)

        call = dict(settings, _cancel=cancel, _progress=progress, _timeout_s=total, _idle_timeout_s=idle)
        box: dict = {}
        done = threading.Event()

        def run():
            try:
                box["reply"] = provider.complete(messages, tools, call)
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
                box["error"] = exc
            finally:
                done.set()
                with self._calls_lock:
                    self.calls.discard(done)

        with self._calls_lock:
            self.calls.add(done)
        self.workers.submit(run)
        try:
            return self._wait(agent, box, done, cancel, last_chunk, settings)
        finally:
            stream.close()

    def _wait(self, agent, box: dict, done, cancel, last_chunk: list, settings: dict) -> ModelReply:
        total = agent.limits.model_timeout_s
        idle = agent.limits.stream_idle_timeout_s
        started = time.monotonic()
        while not done.wait(0.25):
            now = time.monotonic()
            if agent.stop_requested or self.bell.stopping:
                cancel.set()
                raise SessionStopping("the session or the runner is stopping")
            if now - started > total:
                cancel.set()
                raise ModelError(f"the model did not answer within {total:g} s (limits.model_timeout_s)")
            if settings.get("stream") and now - last_chunk[0] > idle:
                cancel.set()
                raise ModelError(f"the model's stream sent nothing for {idle:g} s (limits.stream_idle_timeout_s)")
        if "error" in box:
            raise box["error"]
        return box["reply"]

    def drain(self, timeout: float) -> None:
        """At shutdown: give cancelled calls a moment to close their connections (a streamed call sees
        the cancel at its next chunk), so a model server in this process is not torn down under them."""
        deadline = time.monotonic() + timeout
        with self._calls_lock:
            calls = list(self.calls)
        for done in calls:
            done.wait(max(0.0, deadline - time.monotonic()))

    def _pause(self, agent, seconds: float) -> None:
        """Back off before a retry, but give up at once when the session or the runner stops."""
        deadline = time.monotonic() + seconds
        with self.bell.cond:
            while time.monotonic() < deadline:
                if self.bell.stopping or agent.stop_requested:
                    raise SessionStopping("the session or the runner is stopping")
                self.bell.cond.wait(min(0.25, deadline - time.monotonic()))


CAUTIOUS_BYTES_PER_TOKEN = 1.5


def cautious_tokens(messages: list[dict]) -> int:
    """At least the tokens of these messages for the tokenizers seen: 1.5 bytes of UTF-8 a token (English
    runs ~4 characters a token, code ~2.6, digit-heavy code 2.2 with SmolLM2's; a CJK character, 3 bytes,
    about one). Only a bound: when it says a prompt may not fit, it is counted for real."""
    size = sum(len(str(m.get("content") or "").encode()) + sum(len(c.get("function", {}).get("arguments", "").encode())
                                                               for c in m.get("tool_calls") or []) for m in messages)
    return int(size / CAUTIOUS_BYTES_PER_TOKEN) + 4 * len(messages)


def redacted(reply: ModelReply) -> ModelReply:
    """A reply with known secrets replaced: what the model says reaches kernels (its code, llm() answers),
    files and other sessions only like this, even when it echoes a key."""
    reply.text = redact.text(reply.text or "")
    for call in reply.tool_calls:
        call.arguments = redact.text(call.arguments or "")
    return reply


def _record(agent, parent, type: str, **fields) -> dict:
    """A model call attempt's event (returned), and its span made from it (as `primefs trace` makes it)."""
    event = agent.session.history.append(type, **fields)
    tracing.model_call(agent.session, event, parent)
    return event


def _cached(reply: ModelReply) -> dict:
    """A call's cached prompt tokens, in its event only when there were some (most calls have none)."""
    return {k: v for k, v in (("cache_read_tokens", reply.cache_read_tokens),
                              ("cache_write_tokens", reply.cache_write_tokens)) if v}
