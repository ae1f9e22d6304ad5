"""Compaction: older turns become a summary; the last turns stay verbatim; nothing is lost."""
from __future__ import annotations


from conftest import BackgroundRunner, use_server, wait_for

from primefs.store import mail
from primefs.store.goals import write_goal
from primefs.store.session import list_sessions

BIG = "print('x' * 600)"
LONG_MESSAGE = "Please continue. " + "Some background you may need later. " * 55  # ~2,000 characters


def test_compaction_keeps_recent_turns_verbatim_and_history_whole(ws, server):
    first_turn = {"match": "^Long task", "replies": [
        {"code": "secret = 4242\n" + BIG}, {"code": BIG}, {"text": "first turn done"}]}
    # after compaction the conversation starts with the summary, then the kept tail: the new message
    after = {"match": r"^\[primefs\] Earlier work was compacted", "replies": [
        {"code": "print(secret)\nprint(len(history.search('first turn done', type='result')))"},
        {"text": "after compaction"}]}
    summary = {"match": "^You are compacting", "replies": [{"text": "SUMMARY: secret is 4242; turn one done."}]}
    server.set_script({"rules": [summary, after, first_turn]})
    # counted by litellm (tiktoken): the first turn stays under 1,300 tokens, the long message takes it over
    ws = use_server(ws, server, limits={"compact_at_tokens": 1300, "output_chars": 2000})
    with BackgroundRunner(ws):  # one runner: the same kernel before and after the compaction
        write_goal(ws, "Long task", name="long")
        s = wait_for(lambda: next((x for x in list_sessions(ws.sessions) if x.read_result()), None))
        wait_for(lambda: s.reload()["status"] == "idle")
        assert not s.events("compaction")
        mail.deliver(s.mail, sender="user", to=s.id, kind="user", text=LONG_MESSAGE)
        wait_for(lambda: s.read_result() == "after compaction")
    events = s.events()
    (c,) = [e for e in events if e["type"] == "compaction"]
    assert s.read_result() == "after compaction"
    # every original event is still in the file; the compaction says what it replaced
    assert [e["type"] for e in events].count("cell") == 3
    assert c["kept_from_n"] > c["upto_n"] and c["summary"] == "SUMMARY: secret is 4242; turn one done."
    replaced = [e for e in events if e["n"] <= c["upto_n"]]
    assert {"task", "assistant", "cell"} <= {e["type"] for e in replaced}
    kept = next(e for e in events if e["n"] == c["kept_from_n"])
    assert kept["type"] in ("assistant", "message", "task", "notice")  # a cut only where a step or turn begins
    # the summary call is accounted to the session
    assert [e["purpose"] for e in events if e["type"] == "model_call"].count("compaction") == 1
    # the next request: system, the summary, then the verbatim tail with every tool result after its call
    req = next(r for r in server.requests if r["messages"][0]["role"] == "system"
               and str(r["messages"][1]["content"]).startswith("[primefs] Earlier work was compacted"))
    msgs = req["messages"]
    assert "SUMMARY: secret is 4242" in msgs[1]["content"]
    assert "Long task" not in [m.get("content") for m in msgs[2:]]
    assert len(msgs) == 3 and msgs[-1]["content"].endswith(LONG_MESSAGE)
    called = set()
    for m in msgs[2:]:
        called |= {t["id"] for t in m.get("tool_calls") or []}
        assert m["role"] != "tool" or m["tool_call_id"] in called  # never cut between a cell and its output
    # kernel variables survive; what was compacted can be read back from the kernel
    assert [e for e in events if e["type"] == "cell"][-1]["output"] == "4242\n1\n"
