"""The web view without a browser: access, CSRF, the CLI's writes, broken files, big workspaces, pages.

Browser tests (live updates, clicks) are in test_web_browser.py, run in a network namespace.
"""
from __future__ import annotations

import json
import re
import socket

import pytest
from click.testing import CliRunner
from conftest import configure, run_once

from primefs.index.accounting import UsageIndex
from primefs.cli.main import main
from primefs.store.goals import write_goal
from primefs.harness.entries import Harness
from primefs.store.mail import new_files, parse
from primefs.store.session import create_session, list_sessions

pytest.importorskip("starlette")
from starlette.testclient import TestClient  # noqa: E402

from primefs.web.app import make_app  # noqa: E402

TOKEN = "test-token-123"


def client(ws, eval_roots=(), **kw) -> TestClient:
    app = make_app(ws, TOKEN, port=80, allowed_hosts={"testserver"}, eval_roots=list(eval_roots))
    c = TestClient(app, follow_redirects=False, **kw)
    c.cookies.set("primefs_token_80", TOKEN)
    return c


def csrf_of(html: str) -> str:
    return re.search(r'name="csrf" value="([0-9a-f]+)"', html).group(1)


@pytest.fixture
def done_ws(ws):
    """A finished session: one cell, an answer."""
    (ws.root / "script.yaml").write_text("- code: print(6 * 7)\n- text: 'It is 42.'\n- text: 'Doubled: 84'\n")
    ws = configure(ws, model="scripted/script.yaml")
    write_goal(ws, "What is 6 * 7?", name="mult")
    run_once(ws)
    return ws


def test_access_needs_the_token_and_a_known_host(done_ws):
    app = make_app(done_ws, TOKEN, port=80, allowed_hosts={"testserver"}, eval_roots=[])
    c = TestClient(app, follow_redirects=False)
    assert c.get("/").status_code == 401
    assert c.get("/?token=wrong").status_code == 401
    r = c.get("/usage?token=" + TOKEN)  # the printed URL: the token becomes a cookie, and leaves the address
    assert r.status_code == 303 and r.headers["location"] == "/usage"
    assert "HttpOnly" in r.headers["set-cookie"] and "SameSite=strict" in r.headers["set-cookie"]
    page = c.get("/")
    assert page.status_code == 200 and "mult" in page.text
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert page.headers["x-frame-options"] == "DENY"
    fresh = TestClient(app, follow_redirects=False)
    assert fresh.get("/", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    assert fresh.get("/static/app.js").status_code == 401
    # DNS rebinding: another name for this address is refused
    assert c.get("/", headers={"Host": "evil.example:80"}).status_code == 400


def test_mail_and_stop_are_the_cli_writes_behind_csrf(done_ws):
    c = client(done_ws)
    sid = next(s.id for s in list_sessions(done_ws.sessions))
    page = c.get(f"/s/{sid}")
    assert page.status_code == 200 and "It is 42." in page.text and "42\n" in page.text
    token = csrf_of(page.text)
    assert c.post(f"/s/{sid}/mail", data={"text": "x"}).status_code == 403  # no CSRF token
    assert c.post(f"/s/{sid}/mail", data={"text": "x", "csrf": token},
                  headers={"Origin": "http://evil.example"}).status_code == 403
    assert c.post(f"/s/{sid}/mail", data={"text": "x", "csrf": token}, headers={"Origin": "null"}).status_code == 403
    assert not new_files(done_ws.sessions / sid / "mail")
    r = c.post(f"/s/{sid}/mail", data={"text": "Now double it", "csrf": token},
               headers={"Origin": "http://testserver"})
    assert r.status_code == 303 and r.headers["location"].startswith(f"/s/{sid}?sent=")
    [path] = new_files(done_ws.sessions / sid / "mail")
    msg = parse(path)
    assert (msg.kind, msg.sender, msg.text.strip()) == ("user", "user", "Now double it")
    assert "Delivered message" in c.get(r.headers["location"]).text
    run_once(done_ws)  # the next turn answers the mail
    assert "Doubled: 84" in c.get(f"/s/{sid}").text
    r = c.post(f"/s/{sid}/stop", data={"csrf": token})
    assert r.status_code == 303
    page = c.get(r.headers["location"])
    assert 'id="status">stopped<' in page.text and "Stop requested for 1 session(s)" in page.text


def test_approve_and_deny_are_behind_csrf_and_a_refused_answer_says_why(done_ws):
    c = client(done_ws)
    sid = next(s.id for s in list_sessions(done_ws.sessions))
    token = csrf_of(c.get(f"/s/{sid}").text)
    assert c.post(f"/s/{sid}/approvals/1", data={"verdict": "approve"}).status_code == 403  # no CSRF token
    assert c.post(f"/s/{sid}/approvals/x", data={"verdict": "approve", "csrf": token}).status_code == 404
    assert c.post(f"/s/{sid}/approvals/1", data={"verdict": "maybe", "csrf": token}).status_code == 400
    r = c.post(f"/s/{sid}/approvals/1", data={"verdict": "approve", "csrf": token})
    assert r.status_code == 409 and f"session {sid} waits for no approval 1 (no runner is running)" in r.text


def test_broken_files_never_break_a_page(ws):
    good = create_session(ws.sessions, task="fine", name="good", model="scripted/x.yaml")
    broken = create_session(ws.sessions, task="broken", name="broken", model="scripted/x.yaml")
    (broken.dir / "session.yaml").write_text("id: [unclosed\n")
    odd = create_session(ws.sessions, task="odd", name="odd", model="scripted/x.yaml", parent=good.id)
    with open(odd.dir / "history.jsonl", "w") as f:
        f.write('{"ts": 1, "type": "task", "n": 0, "text": "odd task"}\n')
        f.write("garbage that is not json\n[1, 2]\n")
        f.write('{"ts": 2, "type": "cell", "n": 1, "code": ["not", "text"], "output": 5}\n')
        f.write('{"ts": 3, "type": "message", "n": 2}\n')
        f.write('{"ts": 4, "type": "invented_event", "n": 3, "x": {"y": 1}}\n')
        f.write('{"ts": 5, "type": "result", "n": 4, "text": "after the junk"}\n')
        f.write('{"ts": 5, "type": "restored", "n": 6, "restored": ["df", "rows"], "modules": ["numpy"], '
                '"failed": ["conn"], "skipped": []}\n')
        f.write('{"ts": 6, "type": "cell", "n": 5, "code": "tor')  # torn last line
    (odd.dir / "session.yaml").write_text((odd.dir / "session.yaml").read_text() + "parent_extra: [1, 2]\n")
    c = client(ws)
    tree = c.get("/")
    assert tree.status_code == 200
    assert f'<a href="/s/{broken.id}">{broken.id}</a>: ' in tree.text  # named among the problems
    assert f'data-id="{good.id}"' in tree.text and f'data-id="{odd.id}"' in tree.text
    assert f'data-id="{broken.id}"' not in tree.text  # listed as a problem, not as a row
    page = c.get(f"/s/{broken.id}")
    assert page.status_code == 200 and "session.yaml cannot be read" in page.text
    page = c.get(f"/s/{odd.id}")
    assert page.status_code == 200 and "odd task" in page.text and "after the junk" in page.text
    assert "invented_event" in page.text and "x: {&#34;y&#34;: 1}" in page.text  # as `primefs log` says it
    assert "restored df, rows, numpy (module); not restored: conn" in page.text
    assert "(&#39;" not in page.text  # never Python's spelling of a tuple
    for path in ("/usage", f"/usage?session={good.id}", "/harness", "/evals"):
        assert c.get(path).status_code == 200, path
    assert c.get("/s/..%2F..%2Fetc").status_code == 404
    assert c.get("/s/nope").status_code == 404


def test_big_history_and_many_sessions_are_paged(ws):
    s = create_session(ws.sessions, task="long", name="long", model="scripted/x.yaml")
    for i in range(1000):
        s.history.append("notice", text=f"step {i:04d}")
    for i in range(420):
        create_session(ws.sessions, task="t", name=f"s{i}", model="scripted/x.yaml")
    c = client(ws)
    page = c.get(f"/s/{s.id}").text
    assert "step 0999" in page and "step 0800" in page and "step 0799" not in page
    before = re.search(r'\?before=(\d+)" id="earlier"', page).group(1)
    earlier = c.get(f"/s/{s.id}?before={before}").text
    assert "step 0799" in earlier and "step 0600" in earlier and "step 0800" not in earlier
    assert "data-sse" not in earlier  # an older page is not live
    first = c.get("/").text
    assert first.count('<tr class="st-') == 200 and "page 1 of 3" in first
    assert c.get("/?page=3").text.count('<tr class="st-') == 421 - 400


def test_usage_page_sums_like_primefs_usage(ws):
    (ws.root / "script.yaml").write_text(
        "rules:\n  - match: '^sub'\n    replies:\n      - text: 'child answer'\n"
        "default:\n  - code: \"print([rlm('sub %d' % i).wait() for i in range(3)])\"\n  - text: 'done'\n")
    ws = configure(ws, model="scripted/script.yaml")
    write_goal(ws, "fan out", name="root")
    run_once(ws)
    root = next(s for s in list_sessions(ws.sessions) if s.name == "root")
    child = next(s for s in list_sessions(ws.sessions) if s.meta.get("parent") == root.id)
    with open(child.dir / "history.jsonl", "a") as f:  # written by hand: no numbers where numbers belong
        f.write(json.dumps({"ts": "later", "type": "model_call", "n": 90, "model": "m", "input_tokens": "many",
                            "output_tokens": 7, "cost_usd": "free", "cost_known": True}) + "\n")
    tree = UsageIndex(ws.sessions).tree(root.id)
    cli = json.loads(CliRunner().invoke(main, ["-w", str(ws.root), "usage", root.id, "--json"]).output)["tree"]
    assert cli == tree and tree["output_tokens"] >= 7
    c = client(ws)
    for path in ("/", f"/s/{child.id}", "/usage"):
        assert c.get(path).status_code == 200, path
    page = c.get(f"/usage?session={root.id}").text
    tokens = tree["input_tokens"] + tree["output_tokens"]
    assert f"{tree['calls']} calls · {tokens:,} tokens · ${tree['cost_usd']:.4f}" in page
    assert page.count("<svg") >= 2 and "<polyline" in page and "root.3" in page
    overview = c.get("/usage").text
    assert f"/usage?session={root.id}" in overview and "<polyline" in overview


def test_harness_page_shows_provenance_and_reverts(ws):
    h = Harness(ws)
    sha = h.put("note", "be-brief", "Answer in one line.", source="user", description="style")
    h.put("memory", "py-math", "Compute numbers in Python.", source="agent")
    c = client(ws)
    page = c.get("/harness").text
    assert "be-brief" in page and "py-math" in page and sha[:10] in page
    diff = c.get(f"/harness/c/{sha}").text
    assert "+Answer in one line." in diff and "Primefs-Kind" in diff
    assert c.get("/harness/c/" + "0" * 40).status_code == 404
    r = c.post("/harness/revert", data={"sha": sha, "csrf": csrf_of(page)})
    assert r.status_code == 303 and "reverted=" in r.headers["location"]
    assert not (ws.harness / "notes" / "be-brief.md").exists()
    assert h.log(1)[0]["reverts"] == sha
    after = c.get(r.headers["location"]).text
    assert "Reverted with a new commit" in after and "reverted</span>" in after
    again = c.post("/harness/revert", data={"sha": sha, "csrf": csrf_of(page)})
    assert again.status_code == 409 and "cannot revert" in again.text  # refused: one clear sentence


def test_eval_runs_table_and_score_against_cost(ws, tmp_path):
    runs = tmp_path / "eval-runs"
    plain, modes = runs / "needle-a", runs / "agg-b"
    for folder in (plain, modes):
        folder.mkdir(parents=True)
    rows = [{"id": f"i{i}", "score": float(i % 2), "input_tokens": 100, "output_tokens": 10, "cost_usd": 0.01,
             "calls": 2, "wall_s": 1.0, "stop_reason": "answered", "session": None} for i in range(4)]
    (plain / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + "not json\n")
    (plain / "summary.json").write_text(json.dumps({"benchmark": "needle"}))
    (plain / "config.yaml").write_text("model: openai/gpt-x\n")
    moded = [dict(r, mode=m, score=1.0 if m == "rlm" else 0.25) for r in rows for m in ("rlm", "direct")]
    (modes / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in moded))
    c = client(ws, eval_roots=[runs])
    page = c.get("/evals").text
    assert "needle-a" in page and "openai/gpt-x" in page and "0.500" in page
    assert ">rlm<" in page and ">direct<" in page and "1.000" in page and "0.250" in page
    assert page.count("<circle") == 3 and "cost (US$)" in page
    run = c.get("/evals/run?root=0&path=needle-a").text
    assert run.count("<tr>") == 5 and "1 line(s) of results.jsonl could not be read" in run
    assert c.get("/evals/run?root=0&path=../../..").status_code == 404
    assert c.get("/evals/run?root=7&path=needle-a").status_code == 404


def test_serve_refuses_remote_hosts_and_busy_ports(ws):
    r = CliRunner().invoke(main, ["-w", str(ws.root), "serve", "--host", "0.0.0.0"])
    assert r.exit_code == 1 and "not a loopback address" in r.output and "--allow-remote" in r.output
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    try:
        r = CliRunner().invoke(main, ["-w", str(ws.root), "serve", "--port", str(busy.getsockname()[1])])
        assert r.exit_code == 1 and "is in use" in r.output and "Traceback" not in r.output
    finally:
        busy.close()


def test_bad_input_is_a_clear_4xx_never_a_500(ws, tmp_path):
    s = create_session(ws.sessions, task="t", name="s", model="scripted/x.yaml")
    s.history.append("notice", text="the last word")
    run = tmp_path / "eval-runs" / "odd"
    run.mkdir(parents=True)
    rows = [{"id": "no-cost", "score": 1, "input_tokens": 10, "output_tokens": 2},
            {"id": "odd-types", "score": "high", "input_tokens": "ten", "cost_usd": None, "mode": ["a"],
             "session": ["x"], "calls": {}}]
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    c = client(ws, eval_roots=[tmp_path / "eval-runs"])
    page = c.get(f"/s/{s.id}?before=99999999999999999999999")  # past the end: the end
    assert page.status_code == 200 and "the last word" in page.text
    for path, word in ((f"/s/{s.id}?before=abc", "before"), ("/?page=2x", "page"), ("/events/tree?page=-1", "page")):
        r = c.get(path)
        assert r.status_code == 400 and word in r.text and "Traceback" not in r.text, path
    assert c.get("/evals").status_code == 200
    run_page = c.get("/evals/run?root=0&path=odd")
    assert run_page.status_code == 200 and "no-cost" in run_page.text and "odd-types" in run_page.text


def test_a_call_whose_cell_is_not_written_shows_its_code(ws):
    s = create_session(ws.sessions, task="t", name="s", model="scripted/x.yaml")
    call = {"id": "call_0", "name": "python", "arguments": json.dumps({"code": "print('first')"})}
    s.history.append("assistant", text="", calls=[call])
    s.history.append("cell", call_id="call_0", code="print('first')", output="first\n", shown="first\n")
    s.history.append("assistant", text="and again", calls=[dict(call, arguments=json.dumps({"code": "slow()"}))])
    c = client(ws)
    page = c.get(f"/s/{s.id}").text
    pending = re.findall(r'<div class="ev ev-cell pending[^"]*" data-call="call_0">.*?</div>', page, re.S)
    assert len(pending) == 1 and "slow()" in pending[0] and "print(" not in pending[0]
    assert "no output recorded" in pending[0] and "running" not in pending[0]  # pending, not running
    s.update(status="running")
    page = c.get(f"/s/{s.id}").text
    assert 'ev-cell pending running" data-call="call_0"' in page and "running…" in page
    older = c.get(f"/s/{s.id}?before={(s.dir / 'history.jsonl').stat().st_size - 1}").text
    assert "pending" not in older  # an older page: its cells come later


def test_a_failed_session_is_found_among_many(ws):
    """Filters (status, name, model, time) and counts by status; unfiltered pages start at a root."""
    roots = [create_session(ws.sessions, task="t", name=f"r{i}", model="m/a") for i in range(300)]
    big = create_session(ws.sessions, task="t", name="big", model="m/b")
    kids = [create_session(ws.sessions, task="t", name=f"big.c{i}", model="m/b", parent=big.id) for i in range(250)]
    for s in (roots[3], roots[150], roots[299], kids[200]):
        s.set_status("failed", error="boom")
    c = client(ws)
    first = c.get("/").text
    assert re.search(r'id="count-failed"[^>]*>4 failed<', first) and re.search(r">all 551<", first)
    parents = {s.id: s.meta.get("parent") for s in [*roots, big, *kids]}
    n = int(re.search(r"page 1 of (\d+)", first).group(1))
    starts = []
    for page in range(1, n + 1):
        text = c.get(f"/?page={page}").text
        ids = re.findall(r'<tr class="st-\w+" data-id="([^"]+)"', text)
        assert ids and len(ids) <= 200 and parents[ids[0]] is None, page  # every page starts at a root
        starts.append(ids[0])
    assert starts.count(big.id) == 2  # the tree bigger than a page: two pages, each from its root
    assert "(continued)" in c.get(f"/?page={starts.index(big.id) + 2}").text
    failed = c.get("/?status=failed").text
    assert failed.count('<tr class="st-failed"') == 4 and "4 matching" in failed
    assert f'in <a href="/s/{big.id}">big</a>' in failed  # a child says whose it is
    only_b = c.get("/?status=failed&model=m/b").text
    assert re.findall(r'data-id="([^"]+)"', only_b) == [kids[200].id]
    assert re.search(r'id="count-failed"[^>]*>1 failed<', c.get("/?model=m/b").text)  # counts follow the filters
    assert c.get("/?status=failed&model=m/*").text.count('<tr class="st-failed"') == 4
    assert "250 matching" in c.get("/?name=big.*").text
    assert c.get("/?name=r29&status=failed").text.count("<tr class=") == 1  # text: anywhere in the name
    assert c.get("/?since=1h").text.count("<tr class=") == 200
    assert "no session matches these filters" in c.get("/?until=2000-01-01").text
    for path, word in (("/?status=broken", "status"), ("/?since=yesterday", "since"),
                       ("/events/tree?status=nope", "status")):
        r = c.get(path)
        assert r.status_code == 400 and word in r.text, path


def test_trees_of_the_same_name_are_told_apart_on_the_usage_page(ws):
    same = [create_session(ws.sessions, task="t", name="report", model="m") for _ in range(2)]
    for i, s in enumerate(same):
        s.history.append("model_call", model="m", input_tokens=100 * (i + 1), output_tokens=1, cost_usd=0.0)
    page = client(ws).get("/usage").text
    legend = re.findall(r'<li><span class="key[^"]*"></span>([^<]*)</li>', page)
    assert len(legend) == 2 == len(set(legend)) == 2 and all(s.id in "".join(legend) for s in same)
    rows = re.findall(r"<tr><td>(.*?)</td>", page.split('id="usage-table"')[1], re.S)
    shown = [re.sub(r"<[^>]+>|\s+", " ", row).strip() for row in rows]
    assert len(shown) == 2 and shown[0] != shown[1] and all(any(s.id in x for x in shown) for s in same)
