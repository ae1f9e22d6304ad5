"""rlm() children, mail between sessions, scheduling under a cap, and exact tree accounting."""
from __future__ import annotations

import json

from conftest import by_name, cli, configure, run_once, use_server

from primefs.index.accounting import UsageIndex
from primefs.store.goals import write_goal
from primefs.store.session import list_sessions


def outputs(s):
    return [c["output"] + (c.get("error") or "") for c in s.events("cell")]


FANOUT_PARENT = {"match": "^Add up", "replies": [
    {"code": "hs = [rlm(f'Sum chunk {i}', context=list(range(i * 10, i * 10 + 10))) for i in range(5)]\n"
             "parts = wait_all(hs)\nprint(parts, sum(int(p) for p in parts))"},
    {"text": "total 1225"}]}
CHILD_SUM = {"match": "^Sum chunk", "replies": [{"code": "print(sum(context))"},
                                                {"text": "see above"}]}


def test_fan_out_with_exact_results_and_child_folders(ws, server):
    # children answer with done(): their result is computed by code, exactly
    child = {"match": "^Sum chunk", "replies": [{"code": "done(str(sum(context)))"}]}
    server.set_script({"rules": [FANOUT_PARENT, child]})
    ws = use_server(ws, server)
    write_goal(ws, "Add up 0..49 using children", name="root")
    run_once(ws)
    sessions = by_name(ws)
    root = sessions["root"]
    assert outputs(root)[0] == "['45', '145', '245', '345', '445'] 1225\n"
    assert root.read_result() == "total 1225"
    kids = [s for s in sessions.values() if s.meta.get("parent") == root.id]
    assert len(kids) == 5
    assert all(k.meta["depth"] == 1 and k.status == "done" for k in kids)
    assert sorted(k.name for k in kids) == [f"root.{i}" for i in range(1, 6)]
    # the context went to files, never into a prompt
    k0 = next(k for k in kids if k.task == "Sum chunk 0")
    assert json.loads((k0.dir / "context.json").read_text()) == list(range(10))
    assert "[0, 1, 2" not in json.dumps(server.requests)
    # spawns are logged in the parent; results were consumed by wait(), not shown as prompts
    spawns = root.events("spawn")
    assert [e["child"] for e in spawns] == [k.id for k in sorted(kids, key=lambda k: int(k.task.split()[-1]))]
    msgs = root.events("message")
    assert len(msgs) == 5 and all(m["kind"] == "result" and m["read_by"] == "wait" for m in msgs)
    assert len(root.events("turn_start")) == 1  # results did not start another turn


def test_depth_chain_and_limit(ws, server):
    deeper = {"match": "^Go deeper", "replies": [
        {"code": "try:\n    h = rlm('Go deeper')\n    print('child', h.wait())\nexcept Exception as e:\n"
                 "    print('refused:', e)"},
        {"text": "level done"}]}
    server.set_script({"rules": [deeper]})
    ws = use_server(ws, server, limits={"max_depth": 2})
    write_goal(ws, "Go deeper", name="chain")
    run_once(ws)
    sessions = list_sessions(ws.sessions)
    assert sorted(s.meta["depth"] for s in sessions) == [0, 1, 2]
    deepest = next(s for s in sessions if s.meta["depth"] == 2)
    assert "refused: rlm(): depth limit reached" in outputs(deepest)[0]
    middle = next(s for s in sessions if s.meta["depth"] == 1)
    assert outputs(middle)[0] == "child level done\n"
    assert deepest.meta["parent"] == middle.id


def test_mail_both_ways_and_to_siblings(ws, server):
    # The listener is inside a cell (blocked in recv) before the talker exists: deterministic order.
    parent = {"match": "^Coordinate", "replies": [
        {"code": "b = rlm('Listener task', name='listener')\nready = recv(timeout=30)\n"
                 "a = rlm('Talker task', name='talker')\n"
                 "while True:\n    m = recv(timeout=30)\n    if m.kind == 'message' and m.sender == a.id:\n"
                 "        break\n"
                 "print('parent got:', ready.text, ready.sender == b.id, m.text)\nprint(wait_all([a, b]))"},
        {"code": "send('listener', 'direct to listener')\nprint(b.wait())"},
        {"text": "coordinated"}]}
    talker = {"match": "^Talker", "replies": [{"code": "print(send('all', 'hello family'))"}, {"text": "talked"}]}
    listener = {"match": "^Listener", "replies": [
        {"code": "send('parent', 'ready')\nm = recv(timeout=30)\n"
                 "print('listener got:', m.text, m.sender != SESSION_ID)"},
        {"text": "listened"},
        {"code": "print([x.text for x in inbox()])"}, {"text": "listened again"}]}
    server.set_script({"rules": [parent, talker, listener]})
    ws = use_server(ws, server)
    write_goal(ws, "Coordinate two children", name="boss")
    run_once(ws)
    s = by_name(ws)
    assert outputs(s["talker"])[0] == "2\n"  # parent and sibling
    assert outputs(s["listener"])[0] == "listener got: hello family True\n"
    boss_out = outputs(s["boss"])
    assert boss_out[0] == "parent got: ready True hello family\n['talked', 'listened']\n"
    # a message to an idle child by name starts its next turn, shown to its model
    assert boss_out[1] == "listened again\n"
    assert s["listener"].events("message")[-1]["text"] == "direct to listener"
    assert outputs(s["listener"])[1] == "[]\n"  # already shown, so not unread
    sent = s["talker"].events("sent")[0]
    assert sorted(sent["to"]) == sorted([s["boss"].id, s["listener"].id])


def test_retasking_a_finished_child(ws, server):
    parent = {"match": "^Retask", "replies": [
        {"code": "h = rlm('Worker job', name='w')\nr1 = h.wait()\nh.send('now also do X')\nr2 = h.wait()\n"
                 "print(r1, '|', r2, '|', h.status)"},
        {"text": "ok"}]}
    worker = {"match": "^Worker", "replies": [{"text": "first result"}, {"text": "second result"}]}
    server.set_script({"rules": [parent, worker]})
    ws = use_server(ws, server)
    write_goal(ws, "Retask a child", name="p")
    run_once(ws)
    s = by_name(ws)
    assert outputs(s["p"])[0] == "first result | second result | idle\n"
    assert len(s["w"].events("turn_start")) == 2
    assert s["w"].events("message")[0]["text"] == "now also do X"


def test_cap_of_two_with_fan_out_of_twenty_no_deadlock(ws, server):
    parent = {"match": "^Fan", "replies": [
        {"code": "hs = [rlm(f'Leaf {i}') for i in range(20)]\nprint(len(wait_all(hs, timeout=120)))"},
        {"text": "all leaves done"}]}
    leaf = {"match": "^Leaf", "replies": [{"code": "x = 1"}, {"text": "leaf ok"}]}
    server.set_script({"rules": [parent, leaf]})
    ws = use_server(ws, server, limits={"max_concurrent_sessions": 2, "max_idle_kernels": 2})
    write_goal(ws, "Fan out", name="fan")
    run_once(ws)
    s = by_name(ws)
    assert outputs(s["fan"])[0] == "20\n" and s["fan"].read_result() == "all leaves done"
    leaves = [x for x in s.values() if x.name.startswith("fan.")]
    assert len(leaves) == 20 and all(x.read_result() == "leaf ok" for x in leaves)


def test_exact_tree_accounting(ws, server):
    parent = {"match": "^Account", "replies": [
        {"code": "hs = [rlm(f'Counted {i}') for i in range(3)]\nprint(wait_all(hs))\n"
                 "print(llm_batch(['Q1', 'Q2']))"},
        {"text": "accounted"}]}
    child = {"match": "^Counted", "replies": [{"code": "print(llm('Q child'))"}, {"text": "child ok"}]}
    qa = {"match": "^Q", "replies": [{"text": "A"}]}
    server.set_script({"rules": [parent, child, qa]})
    ws = use_server(ws, server)
    write_goal(ws, "Account for everything", name="acct")
    run_once(ws)
    index = UsageIndex(ws.sessions)
    root = by_name(ws)["acct"]
    tree = index.tree(root.id)
    assert tree["calls"] == len(server.usages) == 2 + 2 + 3 * 3  # parent turn + batch + 3 children x 3
    assert tree["input_tokens"] == sum(u["prompt_tokens"] for u in server.usages)
    assert tree["output_tokens"] == sum(u["completion_tokens"] for u in server.usages)
    assert index.own[root.id]["calls"] == 4
    kids = [sid for sid, s in index.sessions.items() if s.meta.get("parent") == root.id]
    assert sum(index.own[k]["calls"] for k in kids) == 9


def test_failed_child_makes_wait_raise_and_parent_continues(ws, server):
    parent = {"match": "^Risky", "replies": [
        {"code": "h = rlm('Doomed job', model='dead')\ntry:\n    h.wait()\nexcept ChildFailed as e:\n"
                 "    print('caught:', e)"},
        {"text": "survived"}]}
    server.set_script({"rules": [parent]})
    ws = use_server(ws, server, limits={"model_retries": 0})
    models = dict(ws.config["models"])
    models["dead"] = {"model": "openai/x", "api_base": "http://127.0.0.1:9/v1", "api_key": "k"}
    ws = configure(ws, models=models)
    write_goal(ws, "Risky business", name="risky")
    run_once(ws)
    s = by_name(ws)
    out = outputs(s["risky"])[0]
    assert out.startswith("caught: child risky.1") and "failed" in out
    assert s["risky"].read_result() == "survived"
    assert s["risky.1"].status == "failed"


def test_child_whose_kernel_dies_still_answers_or_fails_cleanly(ws, server):
    parent = {"match": "^Crashy", "replies": [
        {"code": "h = rlm('Kill my kernel')\nprint(h.wait())"}, {"text": "parent done"}]}
    child = {"match": "^Kill", "replies": [{"code": "import os\nos._exit(1)"}, {"text": "recovered"}]}
    server.set_script({"rules": [parent, child]})
    ws = use_server(ws, server)
    write_goal(ws, "Crashy child", name="crashy")
    run_once(ws)
    s = by_name(ws)
    assert outputs(s["crashy"])[0] == "recovered\n"
    assert s["crashy.1"].events("cell")[0]["restarted"]


def test_bad_send_target_and_bad_spawn_are_errors_in_the_cell(ws, server):
    server.set_script([{"code": "try:\n    send('nobody', 'x')\nexcept Exception as e:\n    print(type(e).__name__, e)\n"
                                "try:\n    rlm('t', model='no-such-alias')\nexcept Exception as e:\n"
                                "    print(type(e).__name__, e)\n"
                                "try:\n    send('parent', 'x')\nexcept Exception as e:\n    print(e)"},
                       {"text": "ok"}])
    ws = use_server(ws, server)
    write_goal(ws, "errors", name="e")
    run_once(ws)
    out = outputs(by_name(ws)["e"])[0]
    assert "LookupError unknown recipient 'nobody'" in out
    assert "unknown model 'no-such-alias'" in out
    assert "no parent" in out
    assert len(list_sessions(ws.sessions)) == 1  # nothing created


def test_cli_send_stop_usage_tree_and_log(ws, server, tmp_path):
    parent = {"match": "^Tree", "replies": [{"code": "h = rlm('Leafy', name='leafy')\nprint(h.wait())"},
                                            {"text": "tree done"}, {"text": "after user mail"}]}
    leaf = {"match": "^Leafy", "replies": [{"text": "leaf result"}]}
    server.set_script({"rules": [parent, leaf]})
    ws = use_server(ws, server)
    write_goal(ws, "Tree test", name="top")
    run_once(ws)
    r = cli(ws, "send", "top", "hello from the user")
    assert r.returncode == 0 and "delivered" in r.stdout
    run_once(ws)
    top = by_name(ws)["top"]
    assert top.read_result() == "after user mail"
    assert top.events("message")[-1]["kind"] == "user" and top.events("message")[-1]["from"] == "user"
    # usage --tree and status agree
    tree_out = cli(ws, "usage", "top", "--tree").stdout
    assert "leafy" in tree_out and "total" in tree_out
    status = {r["name"]: r for r in json.loads(cli(ws, "status", "--json").stdout)}
    usage = json.loads(cli(ws, "usage", "top", "--json").stdout)
    assert status["top"]["tree_usage"] == usage["tree"]
    assert usage["tree"]["calls"] == usage["own"]["calls"] + status["leafy"]["usage"]["calls"]
    # the log names the other sessions
    log = cli(ws, "log", "top").stdout
    assert "spawned" in log and "leafy" in log and "result from" in log
    # stop without a runner: marked at once, with --tree for descendants
    r = cli(ws, "stop", "top", "--tree")
    assert r.returncode == 0
    status = {r["name"]: r for r in json.loads(cli(ws, "status", "--json").stdout)}
    assert status["top"]["status"] == status["leafy"]["status"] == "stopped"
    # a stopped session takes no turn for new mail
    cli(ws, "send", "top", "are you there?")
    run_once(ws)
    assert top.reload()["status"] == "stopped" and len(top.events("turn_start")) == 2
    assert cli(ws, "send", "nobody", "x").returncode == 1


def test_stop_interrupts_a_running_session(ws, server):
    import time

    from conftest import BackgroundRunner

    from primefs.store.control import request_stop

    server.set_script({"rules": [{"match": "^Sleep", "replies": [{"code": "import time\ntime.sleep(60)"},
                                                                  {"text": "should not get here"}]}]})
    ws = use_server(ws, server, limits={"cell_timeout_s": 120})
    with BackgroundRunner(ws):
        write_goal(ws, "Sleep long", name="sleeper")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            s = by_name(ws).get("sleeper")
            if s and s.events("assistant"):
                break
            time.sleep(0.1)
        time.sleep(0.5)
        started = time.monotonic()
        assert request_stop(ws, [s.id])[0][1].startswith("stop requested")
        while s.reload()["status"] != "stopped" and time.monotonic() - started < 20:
            time.sleep(0.05)
        assert s.reload()["status"] == "stopped" and time.monotonic() - started < 10
    assert s.read_result() is None and len(server.requests) == 1


def test_mail_arriving_mid_turn_is_shown_before_the_next_model_call(ws, server):
    parent = {"match": "^Nudge", "replies": [
        {"code": "h = rlm('Busy child', name='busy')\nm = recv(timeout=30)\nh.send('extra info')\nprint(h.wait())"},
        {"text": "nudged"}]}
    child = {"match": "^Busy", "replies": [
        {"code": "send('parent', 'started')\nimport time\ntime.sleep(2)"}, {"text": "child saw it"}]}
    server.set_script({"rules": [parent, child]})
    ws = use_server(ws, server)
    write_goal(ws, "Nudge a busy child", name="nudger")
    run_once(ws)
    busy = by_name(ws)["busy"]
    assert len(busy.events("turn_start")) == 1  # no second turn: shown within the running turn
    child_requests = [r for r in server.requests if r["messages"][1]["content"] == "Busy child"]
    assert f"[message from {by_name(ws)['nudger'].id}]\nextra info" in \
        [m.get("content") for m in child_requests[-1]["messages"]]
    assert outputs(by_name(ws)["nudger"])[0] == "child saw it\n"


def test_llm_batch_keeps_order(ws, server):
    rules = [{"match": f"^item {i}$", "replies": [{"text": f"answer {i}"}]} for i in range(6)]
    rules.append({"match": "^Batch", "replies": [
        {"code": "print(llm_batch([f'item {i}' for i in range(6)]))"}, {"text": "ok"}]})
    server.set_script({"rules": rules})
    ws = use_server(ws, server)
    write_goal(ws, "Batch it", name="batch")
    run_once(ws)
    s = by_name(ws)["batch"]
    assert outputs(s)[0] == str([f"answer {i}" for i in range(6)]) + "\n"
    assert [c["purpose"] for c in s.events("model_call")].count("llm_batch") == 6


def test_a_child_budget_stops_the_child_and_one_too_big_is_refused(ws, scripted):
    """rlm(budget=...): the child stops at its own limit (its parent goes on); a budget larger than what the
    parent's has left is an error in the cell, and no child is made."""
    ws = scripted('rules:\n'
                  '  - match: "parent"\n'
                  '    replies:\n'
                  '      - code: "h = rlm(\'child work\', budget={\'tokens\': 100})\\n'
                  'try:\\n    print(\'child:\', h.wait(60))\\nexcept ChildFailed as exc:\\n    print(\'child failed:\', exc)\\n'
                  'try:\\n    rlm(\'too big\', budget={\'tokens\': 10**6})\\nexcept Exception as exc:\\n'
                  '    print(\'refused:\', exc)"\n'
                  '      - text: "parent done"\n'
                  '  - match: "child work"\n'
                  '    replies:\n'
                  '      - code: "print(1)"\n'
                  '      - text: "child done"\n')
    write_goal(ws, "parent", name="parent", extra={"budget": {"tokens": 200000}})
    run_once(ws)
    names = by_name(ws)
    assert set(names) == {"parent", "parent.1"}  # the refused child was never made
    child = names["parent.1"].reload()
    assert (child["status"], child["stop_reason"]) == ("stopped", "budget:tokens") and child["budget"] == {"tokens": 100}
    [cell] = names["parent"].events("cell")
    assert "child failed: child parent.1" in cell["output"] and "was stopped" in cell["output"]
    assert "refused: rlm(budget=...): tokens 1000000 is more than the" in cell["output"]
    assert names["parent"].read_result() == "parent done"
