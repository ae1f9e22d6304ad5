"""`first_reply_grammar` of the embedded model (what `make demo` uses): the grammar goes with the
session's first turn reply only, never with later replies, llm() calls or other models.

The llama.cpp server is replaced by the scripted OpenAI-compatible server, so the request bodies that
reach "llama.cpp" through litellm can be read; the model itself is in test_local_model.py (slow)."""
from __future__ import annotations

import pytest
from conftest import configure, run_once

from primefs.errors import PrimefsError
from primefs.store.goals import write_goal
from primefs.providers import local
from primefs.providers.local import first_reply_grammar
from primefs.store.session import list_sessions
from primefs.store.settings import check_config

GRAMMAR = 'root ::= "```python\\n" [^`]+ "```"'


def test_only_a_first_turn_reply_is_constrained():
    system, task = {"role": "system", "content": "s"}, {"role": "user", "content": "t"}
    settings = {"model": "local", "first_reply_grammar": GRAMMAR, "_purpose": "turn"}
    assert first_reply_grammar([system, task], settings) == GRAMMAR
    later = [system, task, {"role": "assistant", "content": "x"}, {"role": "user", "content": "Output:\n1"}]
    assert first_reply_grammar(later, settings) is None
    for purpose in ("llm", "llm_batch", "compaction", "refine", "direct"):
        assert first_reply_grammar([task], {**settings, "_purpose": purpose}) is None
    assert first_reply_grammar([system, task], {"model": "local", "_purpose": "turn"}) is None


def test_the_grammar_reaches_the_server_with_the_first_reply_only(ws, server, monkeypatch):
    monkeypatch.setattr(local, "ensure_server", lambda: server.url)
    server.set_script({"rules": [{"match": "^say hi$", "replies": [{"text": "hi"}]}],
                       "default": [{"code": "print(llm('say hi'))"}, {"text": "it said hi"}]})
    ws = configure(ws, model="demo", models={"demo": {"model": "local/smollm2", "first_reply_grammar": GRAMMAR}},
                   limits={"model_retry_backoff_s": 0.01})
    write_goal(ws, "Ask the model", name="ask")
    run_once(ws)
    [s] = list_sessions(ws.sessions)
    assert s.read_result() == "it said hi"
    assert [c["output"] for c in s.events("cell")] == ["hi\n"]
    turn1, llm_call, turn2 = server.requests
    assert turn1["grammar"] == GRAMMAR  # litellm sends extra_body's keys at the top of the JSON body
    assert "first_reply_grammar" not in turn1
    for body in (llm_call, turn2):
        assert "grammar" not in body and "grammar" not in (body.get("extra_body") or {})
    # the template's alias `local`, without the key: no grammar
    write_goal(ws, "Again", name="again", model="local")
    run_once(ws)
    assert all("grammar" not in body for body in server.requests[3:])


@pytest.mark.parametrize("alias, problem", [
    ({"model": "openai/gpt-4o-mini", "first_reply_grammar": GRAMMAR}, "is for the embedded model"),
    ({"model": "local", "first_reply_grammar": ["root ::= x"]}, "must be text"),
])
def test_first_reply_grammar_is_checked(alias, problem):
    with pytest.raises(PrimefsError, match=problem):
        check_config({"models": {"x": alias}})
    check_config({"models": {"x": {"model": "local/smollm2", "first_reply_grammar": GRAMMAR}}})
