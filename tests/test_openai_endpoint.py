"""`primefs serve --openai` (docs/openai-endpoint.md), driven by clients nobody here wrote: the `openai`
Python client and litellm, against a real `primefs serve` process; the sessions' model is the scripted
OpenAI-compatible server (tests/openai_server.py)."""
from __future__ import annotations

import base64
import concurrent.futures
import json
import re
import subprocess
import urllib.error
import urllib.request

import openai
import pytest
from conftest import PRIMEFS, Output, use_server

from primefs.index.accounting import UsageIndex
from primefs.store.session import list_sessions


@pytest.fixture
def endpoint(ws, server):
    """(base_url, token, workspace): `primefs serve --openai --port 0`, its model alias `fake`."""
    ws = use_server(ws, server)
    server.set_script({"rules": [
        {"match": "count", "replies": [{"code": "print(len(context['files']))"}, {"text": "one file"}]},
        {"match": "in context\\['message'\\]", "replies": [{"code": "print(len(context['message']))"},
                                                           {"text": "a long one"}]},
        {"match": "slow", "replies": [{"code": "import time; time.sleep(30)"}, {"text": "late"}]}],
        "default": [{"code": "print(6 * 7)"}, {"text": "42"}]})
    proc = subprocess.Popen([*PRIMEFS, "-w", str(ws.root), "serve", "--openai", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = Output(proc.stdout)
    try:
        text = out.wait("api_key ")
        base, token = re.search(r"base_url (\S+), api_key (\S+)", text).groups()
        yield base, token, ws
    finally:
        proc.terminate()
        proc.wait(30)


def post(base: str, path: str, body: bytes, headers: dict) -> tuple[int, dict]:
    req = urllib.request.Request(base + path, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_models_and_a_completion_with_the_openai_client(endpoint, server):
    base, token, ws = endpoint
    client = openai.OpenAI(base_url=base, api_key=token, max_retries=0)
    assert [m.id for m in client.models.list()] == ["primefs/fake", "primefs/local"]  # its aliases
    r = client.chat.completions.create(model="primefs/fake", messages=[{"role": "user", "content": "six times seven"}])
    assert r.choices[0].message.content == "42" and r.choices[0].finish_reason == "stop"
    sid = r.model_extra["primefs"]["session"]
    tree = UsageIndex(ws.sessions, root=sid).tree(sid)
    assert r.usage.prompt_tokens == tree["input_tokens"] == sum(u["prompt_tokens"] for u in server.usages)
    assert r.usage.completion_tokens == tree["output_tokens"] and r.model_extra["primefs"]["calls"] == 2
    bare = client.chat.completions.create(model="fake", messages=[{"role": "user", "content": "again"}])
    assert bare.choices[0].message.content == "42" and bare.model_extra["primefs"]["session"] != sid


def test_streaming_sends_progress_as_comments_then_the_answer_and_usage(endpoint):
    base, token, ws = endpoint
    client = openai.OpenAI(base_url=base, api_key=token, max_retries=0)
    chunks = list(client.chat.completions.create(model="primefs/fake", stream=True,
                                                 messages=[{"role": "user", "content": "six times seven"}]))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "42"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    [last] = [c for c in chunks if c.usage]
    sid = last.model_extra["primefs"]["session"]
    assert last.usage.prompt_tokens == UsageIndex(ws.sessions, root=sid).tree(sid)["input_tokens"]
    raw = urllib.request.urlopen(urllib.request.Request(  # the comments a plain reader of the stream sees
        base + "/chat/completions", method="POST", headers={"Authorization": f"Bearer {token}",
                                                           "Content-Type": "application/json"},
        data=json.dumps({"model": "primefs/fake", "stream": True,
                         "messages": [{"role": "user", "content": "six times seven"}]}).encode()), timeout=60).read()
    comments = [json.loads(line[len(": primefs "):]) for line in raw.decode().splitlines()
                if line.startswith(": primefs ")]
    assert {"task", "model_call", "cell", "turn_end"} <= {e["type"] for e in comments}
    assert any(e["type"] == "cell" and "42" in e["output"] for e in comments)
    assert raw.decode().rstrip().endswith("data: [DONE]")


def test_litellm_against_the_endpoint(endpoint):
    import litellm

    base, token, ws = endpoint
    r = litellm.completion(model="openai/primefs/fake", api_base=base, api_key=token,
                           messages=[{"role": "user", "content": "six times seven"}])
    assert r.choices[0].message.content == "42" and r.usage.prompt_tokens > 0
    streamed = litellm.completion(model="openai/primefs/fake", api_base=base, api_key=token, stream=True,
                                  messages=[{"role": "user", "content": "six times seven"}])
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == "42"


def test_long_messages_files_and_the_conversation_become_context_not_prompt(endpoint, server):
    base, token, ws = endpoint
    client = openai.OpenAI(base_url=base, api_key=token, max_retries=0)
    secret = "SECRET-FILE-TEXT " * 20
    data = "data:text/plain;base64," + base64.b64encode(secret.encode()).decode()
    r = client.chat.completions.create(model="primefs/fake", messages=[
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "count the files"},
                                     {"type": "file", "file": {"filename": "notes.txt", "file_data": data}}]}])
    assert r.choices[0].message.content == "one file"
    s = next(s for s in list_sessions(ws.sessions) if s.id == r.model_extra["primefs"]["session"])
    ctx = json.loads((s.dir / "context.json").read_text())
    assert ctx == {"conversation": [{"role": "system", "content": "be brief"}], "files": {"notes.txt": secret}}
    long = "word " * 5000
    r = client.chat.completions.create(model="primefs/fake", messages=[{"role": "user", "content": long}])
    assert r.choices[0].message.content == "a long one"
    assert not any("SECRET-FILE-TEXT" in json.dumps(q) or long in json.dumps(q) for q in server.requests)


def test_bad_requests_are_4xx_with_a_json_error_and_start_nothing(endpoint):
    base, token, ws = endpoint
    auth = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    good = {"model": "primefs/fake", "messages": [{"role": "user", "content": "hi"}]}
    cases = [
        ({"Content-Type": "application/json"}, json.dumps(good), 401, "Bearer"),
        ({**auth, "Authorization": "Bearer wrong"}, json.dumps(good), 401, "Bearer"),
        (auth, "{not json", 400, "not JSON"),
        (auth, "[1, 2]", 400, "JSON object"),
        ({**auth, "Content-Type": "text/plain"}, json.dumps(good), 415, "JSON body"),
        (auth, json.dumps({**good, "model": None}), 400, "`model` is required"),
        (auth, json.dumps({**good, "model": "primefs/nope"}), 404, "does not exist"),
        (auth, json.dumps({**good, "messages": []}), 400, "non-empty list"),
        (auth, json.dumps({**good, "messages": ["hi"]}), 400, "must be an object"),
        (auth, json.dumps({**good, "messages": [{"role": "wizard", "content": "x"}]}), 400, "role must be"),
        (auth, json.dumps({**good, "messages": [{"role": "assistant", "content": "x"}]}), 400, "the user's"),
        (auth, json.dumps({**good, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}), 400,
         "only text parts"),
        (auth, json.dumps({**good, "messages": [{"role": "user", "content": [
            {"type": "file", "file": {"file_data": "!!!"}}]}]}), 400, "not base64"),
        (auth, json.dumps({**good, "stream": "yes"}), 400, "`stream`"),
    ]
    for headers, body, status, message in cases:
        code, reply = post(base, "/chat/completions", body.encode(), headers)
        assert code == status and message in reply["error"]["message"], (body, code, reply)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=base, api_key="wrong", max_retries=0).models.list()
    assert list_sessions(ws.sessions) == [] and not list(ws.goals.glob("*.md"))


def test_twenty_concurrent_requests_each_its_own_session_with_exact_usage(endpoint):
    base, token, ws = endpoint
    client = openai.OpenAI(base_url=base, api_key=token, max_retries=0, timeout=300)

    def ask(i):
        return client.chat.completions.create(model="primefs/fake", messages=[{"role": "user", "content": f"q{i}"}])

    with concurrent.futures.ThreadPoolExecutor(20) as pool:
        replies = list(pool.map(ask, range(20)))
    assert all(r.choices[0].message.content == "42" for r in replies)
    sids = {r.model_extra["primefs"]["session"] for r in replies}
    assert len(sids) == 20 == len(list_sessions(ws.sessions))
    index = UsageIndex(ws.sessions)
    for r in replies:
        sid = r.model_extra["primefs"]["session"]
        assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (index.tree(sid)["input_tokens"],
                                                                      index.tree(sid)["output_tokens"])


def test_a_client_that_goes_away_stops_its_session(endpoint):
    base, token, ws = endpoint
    client = openai.OpenAI(base_url=base, api_key=token, max_retries=0)
    stream = client.chat.completions.create(model="primefs/fake", stream=True,
                                            messages=[{"role": "user", "content": "be slow"}])
    next(iter(stream))  # the session is running
    stream.close()
    from conftest import wait_for

    [s] = list_sessions(ws.sessions)
    wait_for(lambda: s.reload()["status"] == "stopped", 30, "the session stopped")
    r = client.chat.completions.create(model="primefs/fake", messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].message.content == "42"
