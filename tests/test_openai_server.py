"""The scripted OpenAI-compatible server, driven by litellm over real HTTP."""
from __future__ import annotations

import json
import os
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
import litellm  # noqa: E402

try:
    from openai_server import ScriptServer
except ImportError:  # tests/ made a package
    from tests.openai_server import ScriptServer

from primefs.providers.script import estimate_tokens, fenced, prompt_tokens  # noqa: E402

litellm.suppress_debug_info = True

TOOLS = [{"type": "function", "function": {
    "name": "python", "description": "Run Python code in the kernel.",
    "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}}]
USER = [{"role": "user", "content": "What is one plus one?"}]
SCRIPT = [{"text": "Let me compute.", "code": "print(1 + 1)"}, {"text": "It is 2."}]


def complete(server: ScriptServer, messages: list[dict], **kwargs):
    return litellm.completion(model="openai/test-model", api_base=server.url, api_key="x",
                              messages=messages, num_retries=0, **kwargs)


def stream(server: ScriptServer, messages: list[dict], **kwargs):
    chunks = list(complete(server, messages, stream=True, stream_options={"include_usage": True}, **kwargs))
    return chunks, litellm.stream_chunk_builder(chunks, messages=messages)


@pytest.fixture
def server():
    with ScriptServer(SCRIPT) as s:
        yield s


def usage_of(response) -> dict:
    return {"prompt_tokens": response.usage.prompt_tokens, "completion_tokens": response.usage.completion_tokens}


def test_tool_call_form(server):
    response = complete(server, USER, tools=TOOLS)
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me compute."
    [call] = choice.message.tool_calls
    assert call.function.name == "python"
    assert json.loads(call.function.arguments) == {"code": "print(1 + 1)"}
    assert call.id and call.type == "function"
    assert response.model == "test-model"
    arguments = json.dumps({"code": "print(1 + 1)"})
    expected = {"prompt_tokens": prompt_tokens(USER),
                "completion_tokens": estimate_tokens("Let me compute." + arguments)}
    assert server.usages == [expected] and usage_of(response) == expected
    assert response.usage.total_tokens == sum(expected.values())
    [body] = server.requests
    assert body["model"] == "test-model" and body["tools"] and body["messages"] == USER


def test_fenced_form(server):
    response = complete(server, USER)
    choice = response.choices[0]
    assert choice.finish_reason == "stop"
    assert not choice.message.tool_calls
    assert choice.message.content == fenced("Let me compute.", "print(1 + 1)")
    assert server.usages == [usage_of(response)]
    assert usage_of(response)["completion_tokens"] == estimate_tokens(choice.message.content)


def test_stream_tool_call_form(server):
    chunks, response = stream(server, USER, tools=TOOLS)
    assert len(chunks) > 3  # really streamed in pieces
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me compute."
    [call] = choice.message.tool_calls
    assert call.function.name == "python"
    assert json.loads(call.function.arguments) == {"code": "print(1 + 1)"}
    assert server.usages == [usage_of(response)]
    assert response.usage.total_tokens == sum(server.usages[0].values())


def test_stream_fenced_form(server):
    chunks, response = stream(server, USER)
    assert len(chunks) > 2
    choice = response.choices[0]
    assert choice.finish_reason == "stop"
    assert not choice.message.tool_calls
    assert choice.message.content == fenced("Let me compute.", "print(1 + 1)")
    assert server.usages == [usage_of(response)]
    assert server.requests[0]["stream"] is True


def test_scripted_usage_is_reported():
    script = [{"code": "x = 1", "usage": {"input_tokens": 1000, "output_tokens": 42}}]
    with ScriptServer(script) as server:
        response = complete(server, USER, tools=TOOLS)
        _, streamed = stream(server, USER, tools=TOOLS)
    expected = {"prompt_tokens": 1000, "completion_tokens": 42}
    assert usage_of(response) == expected and usage_of(streamed) == expected
    assert server.usages == [expected, expected]


def test_fail_next_then_succeed(server):
    server.fail_next(1, 500)
    with pytest.raises(litellm.exceptions.InternalServerError) as info:
        complete(server, USER)
    assert info.value.status_code == 500
    assert complete(server, USER).choices[0].message.content
    assert len(server.requests) == 2 and len(server.usages) == 1

    server.fail_next(1, 429)
    with pytest.raises(litellm.exceptions.RateLimitError):
        complete(server, USER, stream=True)
    assert complete(server, USER).choices[0].finish_reason == "stop"


def test_rule_match_and_reply_index():
    script = {
        "rules": [
            {"match": r"largest\s+files", "replies": [{"code": "find()"}, {"text": "Here they are."}]},
            {"match": "hello", "replies": [{"text": "hi"}]},
        ],
        "default": [{"text": "default reply"}],
    }
    with ScriptServer(script) as server:
        first = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "the largest  files?"}]
        call = complete(server, first, tools=TOOLS).choices[0].message.tool_calls[0]
        assert json.loads(call.function.arguments) == {"code": "find()"}

        # one assistant message so far: the rule's second reply
        second = first + [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": call.id, "type": "function",
                 "function": {"name": "python", "arguments": call.function.arguments}}]},
            {"role": "tool", "tool_call_id": call.id, "content": "a.bin 10 MB"},
        ]
        assert complete(server, second, tools=TOOLS).choices[0].message.content == "Here they are."
        third = second + [{"role": "assistant", "content": "Here they are."},
                          {"role": "user", "content": "hello"}]
        assert complete(server, third).choices[0].message.content == "(script exhausted)"

        # only the first user message selects the rule
        greeting = [{"role": "user", "content": "hello"}]
        assert complete(server, greeting).choices[0].message.content == "hi"
        assert complete(server, [{"role": "user", "content": "nothing"}]).choices[0].message.content \
            == "default reply"

        server.set_script([{"text": "replaced"}])
        assert complete(server, greeting).choices[0].message.content == "replaced"


def test_concurrent_requests_and_models_route():
    with ScriptServer([{"code": "pass"}], delay=0.05) as server:
        def ask(i: int):
            messages = [{"role": "user", "content": f"question {i}"}]
            if i % 2:
                return stream(server, messages, tools=TOOLS)[1]
            return complete(server, messages, tools=TOOLS)

        with ThreadPoolExecutor(8) as pool:
            responses = list(pool.map(ask, range(16)))
        assert all(r.choices[0].message.tool_calls[0].function.name == "python" for r in responses)
        assert len(server.requests) == 16 and len(server.usages) == 16

        with urllib.request.urlopen(server.url + "/models", timeout=5) as reply:
            models = json.load(reply)
        assert models["object"] == "list" and models["data"][0]["id"]
