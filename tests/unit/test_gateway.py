"""runner/gateway.py on its own: every model call, its retries, timeouts and stops, and what it records.
Real: the gateway's plumbing (the call in a thread of its own, the waits, the backoff, the live stream file,
the redaction), the providers a runner finds (plugins.providers: the mock is registered by a plugin, before
the built-ins), goal control and its budgets, the session's history.jsonl, its Agent (no kernel host), the
bell. Faked: only the model's choices, by an in-process MockProvider (conftest.py) that replies what the
test queued, in the style of simonw/llm's MockModel."""
from __future__ import annotations

import threading
import time

import pytest
from conftest import agent_of, configure, mock_providers, new_session

from primefs.errors import BudgetExhausted, SessionStopping
from primefs.providers.base import PYTHON_TOOL, ModelError, ModelReply, ToolCall
from primefs.runner.bell import Bell
from primefs.runner.gateway import ModelGateway, cautious_tokens
from primefs.runner.goalctl import GoalControl
from primefs.runner.tree import SessionTree
from primefs.store.livefeed import stream_path

MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is six times seven?"}]
FAST_RETRIES = {"model_retries": 2, "model_retry_backoff_s": 0.01}


class Parts:
    """A gateway as Runner.__init__ makes it, and sessions with their agents."""

    def __init__(self, ws, mock):
        self.ws, self.mock, self.log = ws, mock, []
        self.tree, self.bell = SessionTree(ws.sessions), Bell()
        self.goals = GoalControl(self.tree, {}, ws, self.bell, lambda sid: 0)
        self.gateway = ModelGateway(ws, mock_providers(ws, mock), self.goals, self.bell, self.log.append)

    def agent(self, name="s", model="mock/model", limits=None, **extra):
        s = new_session(self.ws, self.tree, name, model=model, **({"limits": limits} if limits else {}), **extra)
        return agent_of(self.ws, self.tree, s, bell=self.bell, gateway=self.gateway)

    def call(self, agent, **kw):
        return self.gateway.complete(agent, MESSAGES, [PYTHON_TOOL], purpose="turn", **kw)


@pytest.fixture
def parts(ws, mock_model):
    return Parts(ws, mock_model)


def until_cancelled(seen: list):
    """A reply that never comes: the provider waits (at most 10 s) until the gateway gives the call up."""
    def reply(settings):
        seen.append(settings["_cancel"].wait(10))
        return "too late"
    return reply


def test_a_call_goes_to_the_provider_and_is_recorded_once(parts):
    agent = parts.agent()
    parts.mock.enqueue(ModelReply(text="42", input_tokens=12, output_tokens=2, cost_usd=0.001, cost_known=True,
                                  model="mock/model-2025"))
    reply = parts.call(agent)
    assert reply.text == "42"
    [(messages, tools, settings)] = parts.mock.history
    assert messages == MESSAGES and tools == [PYTHON_TOOL]
    assert (settings["model"], settings["workspace"], settings["_purpose"]) == ("mock/model", str(parts.ws.root),
                                                                               "turn")
    assert settings["_timeout_s"] == agent.limits.model_timeout_s and not settings["_cancel"].is_set()
    [event] = agent.session.events("model_call")
    assert {k: event[k] for k in ("model", "purpose", "response_model", "input_tokens", "output_tokens", "cost_usd",
                                  "cost_known")} == {"model": "mock/model", "purpose": "turn",
                                                     "response_model": "mock/model-2025", "input_tokens": 12,
                                                     "output_tokens": 2, "cost_usd": 0.001, "cost_known": True}
    assert "attempt" not in event and event["latency_s"] >= 0
    assert agent.session.events("model_error") == [] and parts.gateway.calls == set()


def test_the_calls_usage_counts_for_the_budget_and_a_used_budget_stops_the_next_call(parts):
    agent = parts.agent(budget={"tokens": 10})
    assert parts.goals.used(agent.session.id)["tokens"] == 0  # (goal control now counts from memory)
    parts.mock.enqueue(ModelReply(text="a", input_tokens=6, output_tokens=6), "never asked for")
    parts.call(agent)
    assert parts.goals.used(agent.session.id)["tokens"] == 12  # told by the gateway, not read again
    with pytest.raises(BudgetExhausted, match="tokens used 12 of 10"):
        parts.call(agent)
    assert len(parts.mock.history) == 1 and len(agent.session.events("model_call")) == 1  # not paid for


def test_a_retryable_error_is_tried_again_with_backoff(parts):
    agent = parts.agent(limits=FAST_RETRIES)
    parts.mock.enqueue(ModelError("overloaded"), ModelError("overloaded"), "at last")
    assert parts.call(agent).text == "at last"
    errors = agent.session.events("model_error")
    assert [(e["attempt"], e["error"], e["retry_in_s"]) for e in errors] == [(1, "overloaded", 0.01),
                                                                             (2, "overloaded", 0.02)]
    assert agent.session.events("model_call")[0]["attempt"] == 3
    assert parts.log == [f"{agent.session.id}: model error (attempt 1), retrying in 0.01 s: overloaded",
                         f"{agent.session.id}: model error (attempt 2), retrying in 0.02 s: overloaded"]


def test_the_last_retry_and_an_error_that_is_not_retryable_are_raised(parts):
    agent = parts.agent(limits=FAST_RETRIES)
    parts.mock.enqueue(*[ModelError("overloaded")] * 3)
    with pytest.raises(ModelError, match="overloaded"):
        parts.call(agent)
    assert [e["retry_in_s"] for e in agent.session.events("model_error")] == [0.01, 0.02, 0]
    other = parts.agent("other", limits=FAST_RETRIES)
    parts.mock.enqueue(ModelError("context too long", retryable=False), "never asked for")
    with pytest.raises(ModelError, match="context too long"):
        parts.call(other)
    assert [(e["attempt"], e["retry_in_s"]) for e in other.session.events("model_error")] == [(1, 0)]
    assert other.session.events("model_call") == []


def test_a_call_not_answered_in_time_is_given_up_and_told_to_stop(parts):
    agent = parts.agent(limits={"model_timeout_s": 0.3, "model_retries": 0})
    seen = []
    parts.mock.enqueue(until_cancelled(seen))
    with pytest.raises(ModelError, match=r"did not answer within 0\.3 s \(limits\.model_timeout_s\)"):
        parts.call(agent)
    parts.gateway.drain(5)  # the abandoned call ends once it sees the cancel
    assert seen == [True] and parts.gateway.calls == set()
    assert agent.session.events("model_error")[0]["error"].startswith("the model did not answer")


def test_a_stream_that_goes_quiet_is_given_up_and_what_it_sent_was_live_meanwhile(parts):
    agent = parts.agent(limits={"stream_idle_timeout_s": 0.3, "model_retries": 0})
    path, live, seen = stream_path(parts.ws.runtime, agent.session.id), [], []

    def quiet_after_a_word(settings):
        settings["_progress"]("Thinking")
        live.append(path.read_text().splitlines()[-1])  # what `primefs watch` shows now
        return until_cancelled(seen)(settings)

    parts.mock.enqueue(quiet_after_a_word)
    with pytest.raises(ModelError, match=r"stream sent nothing for 0\.3 s"):
        parts.call(agent, settings={**agent.settings, "stream": True})
    parts.gateway.drain(5)
    assert live == ["Thinking"] and seen == [True] and not path.exists()  # the file goes with the call


@pytest.mark.parametrize("who", ["session", "runner"])
def test_a_stop_gives_the_call_up_at_once_and_records_no_call(parts, who):
    agent = parts.agent()
    seen = []

    def stop_while_waiting(settings):
        if who == "session":
            agent.stop_requested = True  # `primefs stop`
        else:
            parts.bell.stop()  # `primefs down`, Ctrl-C
        return until_cancelled(seen)(settings)

    parts.mock.enqueue(stop_while_waiting)
    with pytest.raises(SessionStopping):
        parts.call(agent)
    parts.gateway.drain(5)
    assert seen == [True] and agent.session.events("model_call") == agent.session.events("model_error") == []


def test_a_stop_during_the_backoff_ends_the_wait(parts):
    agent = parts.agent(limits={"model_retries": 3, "model_retry_backoff_s": 30})

    def fail_and_stop(settings):
        agent.stop_requested = True
        raise ModelError("overloaded")

    parts.mock.enqueue(fail_and_stop)
    started = time.monotonic()
    with pytest.raises(SessionStopping):
        parts.call(agent)
    assert time.monotonic() - started < 10  # not the 30 s backoff
    assert [e["retry_in_s"] for e in agent.session.events("model_error")] == [30]


def test_a_missing_key_is_said_plainly_and_not_retried(parts, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    agent = parts.agent(model="openai/gpt-4o-mini")  # the built-in litellm provider serves it
    with pytest.raises(ModelError, match="needs the environment variable OPENAI_API_KEY") as exc:
        parts.call(agent)
    assert exc.value.retryable is False and parts.mock.history == []
    [event] = agent.session.events("model_error")
    assert (event["attempt"], event["retry_in_s"]) == (1, 0) and "OPENAI_API_KEY" in event["error"]


def test_an_alias_names_its_provider_and_an_unknown_provider_is_refused(parts):
    parts.ws = configure(parts.ws, models={"mine": {"model": "someone/model-x", "provider": "mock"},
                                           "gone": {"model": "someone/model-y", "provider": "nope"}})
    parts.gateway.ws = parts.ws
    parts.mock.enqueue("served")
    assert parts.call(parts.agent(model="mine")).text == "served"
    assert parts.mock.history[0][2]["model"] == "someone/model-x"
    with pytest.raises(LookupError, match="no provider 'nope'"):
        parts.call(parts.agent("other", model="gone"))


def test_known_secrets_in_a_reply_never_reach_the_caller(parts):
    key = "sk-" + "x" * 32  # a key's shape: always redacted
    call = ToolCall(id="c1", name="python", arguments=f'{{"code": "k = \'{key}\'"}}')
    parts.mock.enqueue(ModelReply(text=f"the key is {key}", tool_calls=[call]))
    reply = parts.call(parts.agent())
    assert key not in reply.text and "[redacted]" in reply.text
    assert key not in reply.tool_calls[0].arguments and "[redacted]" in reply.tool_calls[0].arguments


def test_prompt_tokens_by_the_providers_tokenizer_else_a_cautious_bound(parts):
    settings = {"model": "mock/model"}
    assert parts.gateway.prompt_tokens(settings, MESSAGES) == cautious_tokens(MESSAGES)
    parts.mock.count_tokens = lambda messages, settings: 7
    assert parts.gateway.prompt_tokens(settings, MESSAGES) == 7

    def broken(messages, settings):
        raise RuntimeError("no tokenizer here")

    parts.mock.count_tokens = broken
    assert parts.gateway.prompt_tokens(settings, MESSAGES) == cautious_tokens(MESSAGES)


def test_calls_of_many_sessions_at_once_each_get_one_reply_and_one_record(parts):
    agents = [parts.agent(f"s{i}") for i in range(4)]
    parts.mock.enqueue(*[f"reply {i}" for i in range(4)])
    replies, threads = {}, []
    for a in agents:
        threads.append(threading.Thread(target=lambda a=a: replies.setdefault(a.session.id, parts.call(a).text)))
        threads[-1].start()
    for t in threads:
        t.join(10)
    assert sorted(replies) == sorted(a.session.id for a in agents)
    assert sorted(replies.values()) == [f"reply {i}" for i in range(4)]  # none lost, none given twice
    assert all(len(a.session.events("model_call")) == 1 for a in agents) and parts.gateway.calls == set()
