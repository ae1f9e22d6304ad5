"""The web view in a real browser (Chromium through Playwright), on a real `primefs serve` and runner.

Marked `netns`: `make test` runs these inside a network namespace that has only loopback; elsewhere
they are skipped (conftest.py). Each page's screenshot goes to the test's tmp folder, or to
$PRIMEFS_SCREENSHOTS when set; bench/screenshots.py makes the ones in docs/img/.
"""
from __future__ import annotations

import os
import re
import socket
import subprocess
from pathlib import Path

import pytest
from browser import chromium, served
from conftest import BackgroundRunner, configure, run_once, wait_for

from primefs.store.goals import write_goal
from primefs.harness.entries import Harness
from primefs.store.session import create_session, list_sessions

pytestmark = pytest.mark.netns

SCRIPT = """
rules:
  - match: "^Slowly"
    replies:
      - code: "import time\\ntime.sleep(3)\\nprint('slow-output-' + str(6 + 1))"
      - text: "slow answer"
  - match: "^Hold"
    replies:
      - code: "import os, time\\nwhile not os.path.exists('go'):\\n    time.sleep(0.05)\\nprint('held-output-' + str(6 + 1))"
      - text: "held answer"
  - match: "^Forever"
    replies:
      - code: "import time\\ntime.sleep(60)"
      - text: "never"
default:
  - code: "print(6 * 7)"
  - text: "It is 42."
  - text: "Doubled: 84"
"""


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = context.new_page()
    problems: list[str] = []  # script errors and Content-Security-Policy violations show up here
    pg.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    pg.on("pageerror", lambda e: problems.append(str(e)))
    pg.on("dialog", lambda d: d.accept())  # the confirm() of stop and revert
    pg.set_default_timeout(20000)
    yield pg
    context.close()
    assert not problems, problems


@pytest.fixture
def sws(ws):
    (ws.root / "script.yaml").write_text(SCRIPT)
    return configure(ws, model="scripted/script.yaml")


def shot(pg, tmp_path: Path, name: str) -> None:
    folder = Path(os.environ.get("PRIMEFS_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    pg.screenshot(path=str(folder / f"{name}.png"), full_page=True)


def go(pg, url: str, path: str) -> None:
    """Open `path` of the server at `url` (the printed URL: its token becomes the page's cookie)."""
    base, token = url.split("/?token=")
    pg.goto(f"{base}{path}{'&' if '?' in path else '?'}token={token}")


def session_named(ws, name: str):
    return next((s for s in list_sessions(ws.sessions) if s.name == name), None)


def test_tree_page_shows_the_sessions(sws, page, tmp_path):
    write_goal(sws, "What is 6 * 7?", name="mult")
    run_once(sws)
    s = session_named(sws, "mult")
    with served(sws.root) as url:
        page.goto(url)
        assert "token=" not in page.url  # the token became a cookie
        row = page.locator(f'tr[data-id="{s.id}"]')
        assert row.locator(".badge").inner_text() == "idle"
        assert row.locator("td.num").first.inner_text() == "1"  # turns
        shot(page, tmp_path, "tree")


def test_tree_updates_live_while_a_goal_runs(sws, page):
    with served(sws.root) as url:
        page.goto(url)
        page.wait_for_selector("#live.on")  # the event stream is open
        assert "no sessions yet" in page.inner_text("#rows")
        page.evaluate("window.notReloaded = true")
        with BackgroundRunner(sws):
            write_goal(sws, "Slowly compute something", name="slow")
            page.wait_for_selector('tr[data-id] .badge.running')
            page.wait_for_selector('tr[data-id] .badge.idle', timeout=30000)
        s = session_named(sws, "slow")
        row = page.locator(f'tr[data-id="{s.id}"]')
        assert "turn_end: idle" in row.locator("td.last").inner_text()
        assert page.evaluate("window.notReloaded") is True  # all of it came over the stream


def test_filter_the_tree_and_its_counts_follow_live(sws, page):
    create_session(sws.sessions, task="t", name="alpha", model="m/a")
    beta = create_session(sws.sessions, task="t", name="beta", model="m/b")
    with served(sws.root) as url:
        page.goto(url)
        page.select_option("#f-status", "failed")
        page.click("#f-go")
        page.wait_for_selector("#live.on")
        assert "status=failed" in page.url and "no session matches" in page.inner_text("#rows")
        assert page.inner_text("#count-all") == "all 2" and page.inner_text("#count-failed") == "0 failed"
        beta.set_status("failed", error="boom")
        page.wait_for_selector(f'tr[data-id="{beta.id}"] .badge.failed')  # through the stream, filtered
        assert page.locator("tr[data-id]").count() == 1 and page.inner_text("#count-failed") == "1 failed"


def test_an_open_page_goes_live_again_when_serve_restarts(sws, browser):
    with socket.socket() as probe:  # a port to serve on twice
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    context = browser.new_context()
    page = context.new_page()  # not the fixture's: the refused stream is a console error, on purpose
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.set_default_timeout(20000)
    with served(sws.root, "--port", port) as url:
        page.goto(url)
        page.wait_for_selector("#live.on")
    page.wait_for_selector("#live.off")  # the server is gone: the browser tries again
    with served(sws.root, "--port", port) as again:
        assert again == url  # the same token: the open page is let in
        page.wait_for_selector("#live.on")
        s = create_session(sws.sessions, task="t", name="after", model="m")
        page.wait_for_selector(f'tr[data-id="{s.id}"]')  # live again, without a reload
    with served(sws.root, "--port", port, "--new-token") as other:
        assert other != url
        page.wait_for_selector("#live.off >> text=disconnected: open the URL primefs serve printed")
        other_tab = page.context.new_page()
        other_tab.goto(other)  # the new URL, opened in another tab, sets the new token's cookie
        page.wait_for_selector("#live.on", timeout=15000)  # and the old page comes back with it
    context.close()
    assert not errors, errors


def test_session_page_shows_a_cell_output_as_it_appears(sws, page, tmp_path):
    with served(sws.root) as url:
        page.goto(url)
        with BackgroundRunner(sws):
            write_goal(sws, "Hold on until told", name="held")
            s = wait_for(lambda: session_named(sws, "held"), what="the session")
            go(page, url, f"/s/{s.id}")  # its reply comes on the page or through the stream; its cell waits
            running = page.wait_for_selector(".ev-cell.running")  # at once: the code and a running sign
            assert running.query_selector("pre.code").inner_text().startswith("import os, time")
            assert "running" in running.query_selector(".sign").inner_text()
            (s.dir / "work" / "go").write_text("")  # the cell ends
            out = page.wait_for_selector(".ev-cell pre.out", timeout=30000)
            assert out.inner_text().strip() == "held-output-7"
            assert page.locator(".ev-cell").count() == 1  # the finished cell took the running one's place
            assert page.locator(".ev-cell pre.code").inner_text().startswith("import os, time")
            page.wait_for_selector("#status.idle", timeout=30000)  # the header follows too
            page.wait_for_selector("#result")
            assert page.inner_text("#result") == "held answer"
            shot(page, tmp_path, "session")


def test_send_mail_and_see_the_next_turn(sws, page):
    write_goal(sws, "What is 6 * 7?", name="mult")
    with served(sws.root) as url, BackgroundRunner(sws):
        s = wait_for(lambda: session_named(sws, "mult"), what="the session")
        wait_for(lambda: s.read_result() == "It is 42." and s.reload()["status"] == "idle", what="turn 1")
        go(page, url, f"/s/{s.id}")
        page.fill("#mail-text", "Now double it")
        page.click("#mail-send")
        page.wait_for_selector("#note")
        assert "Delivered message" in page.inner_text("#note")
        msg = page.wait_for_selector(".ev-message", timeout=30000)
        assert "Now double it" in msg.inner_text() and "user from user" in msg.inner_text()
        page.wait_for_selector(".ev-turn_start >> text=turn 2")
        page.wait_for_selector(".ev-assistant >> text=Doubled: 84", timeout=30000)
        page.wait_for_selector("#turns >> text=2")


def test_stop_a_running_session(sws, page):
    with served(sws.root) as url, BackgroundRunner(sws):
        write_goal(sws, "Forever sleeping", name="forever")
        s = wait_for(lambda: session_named(sws, "forever"), what="the session")
        wait_for(lambda: s.events("assistant"), what="its cell to start")
        go(page, url, f"/s/{s.id}")
        page.click("#stop")
        assert "Stop requested for 1 session(s)" in page.inner_text("#note")
        page.wait_for_selector("#status.stopped", timeout=30000)
        assert s.reload()["status"] == "stopped"


def test_revert_a_harness_commit(sws, page, tmp_path):
    h = Harness(sws)
    keep = h.put("memory", "py-math", "Compute numbers in Python.", source="user")
    sha = h.put("note", "be-brief", "Answer in one line.", source="user", description="style")
    with served(sws.root) as url:
        go(page, url, "/harness")
        shot(page, tmp_path, "harness")
        page.get_by_role("button", name=f"Revert {sha[:10]} note/be-brief", exact=True).click()  # each says which
        page.wait_for_selector("#note")
        assert "Reverted with a new commit" in page.inner_text("#note")
        assert page.locator(f'tr[data-sha="{sha}"] button.revert').count() == 0
        assert page.get_by_role("button", name=f"Revert {keep[:10]} memory/py-math", exact=True).count() == 1
        assert not (sws.harness / "notes" / "be-brief.md").exists()
        head = subprocess.run(["git", "-C", str(sws.root), "log", "-1", "--format=%B"], capture_output=True,
                              text=True).stdout
        assert f"Primefs-Reverts: {sha}" in head and "Primefs-Source: user" in head
        page.click(f'a[href="/harness/c/{sha}"]')
        assert "+Answer in one line." in page.inner_text("#diff")
        shot(page, tmp_path, "commit")


def test_usage_and_eval_pages_draw_their_charts(sws, page, tmp_path):
    (sws.root / "script.yaml").write_text(
        "rules:\n  - match: '^sub'\n    replies:\n      - text: 'child answer'\n"
        "default:\n  - code: \"print([rlm('sub %d' % i).wait() for i in range(3)])\"\n  - text: 'done'\n")
    write_goal(sws, "fan out", name="root")
    run_once(sws)
    runs = sws.root / "eval-runs" / "demo"
    runs.mkdir(parents=True)
    (runs / "results.jsonl").write_text("".join(
        f'{{"id": "i{i}", "score": {i % 2}, "input_tokens": 100, "output_tokens": 9, "cost_usd": 0.0}}\n'
        for i in range(4)))
    with served(sws.root) as url:
        go(page, url, "/usage")
        assert page.locator("#chart-tokens polyline").count() == 1
        assert page.locator("#chart-tokens svg").bounding_box()["width"] > 300
        shot(page, tmp_path, "usage")
        page.click("#usage-table a")
        assert re.search(r"4 session\(s\)", page.inner_text("main"))
        assert page.locator("#chart-tokens polyline").count() == 4
        page.click("nav >> text=Evals")
        page.wait_for_selector("#chart-score circle")  # (drawn by the page's script once it loaded: count() waits not)
        assert page.locator("#chart-score circle").count() == 1
        assert page.inner_text("#runs td.score") == "0.500"
        shot(page, tmp_path, "evals")


def test_every_page_fits_a_phone(sws, browser, tmp_path):
    """390 px wide: no page scrolls sideways, and every button is on the screen."""
    (sws.root / "script.yaml").write_text(
        "rules:\n  - match: '^sub'\n    replies:\n      - text: 'child answer'\n"
        "default:\n  - code: \"print([rlm('sub %d' % i).wait() for i in range(3)])\"\n  - text: 'done'\n")
    write_goal(sws, "fan out to some children with a long task text " * 3, name="a-rather-long-root-name")
    run_once(sws)
    sha = Harness(sws).put("note", "be-brief", "Answer in one line. " * 20, source="user", description="style " * 10)
    run = sws.root / "eval-runs" / "a-run-with-a-long-name"
    run.mkdir(parents=True)
    (run / "results.jsonl").write_text(
        '{"id": "item-1", "score": 1, "answer": "%s", "expected": "x", "cost_usd": 0.01}\n' % ("long " * 40))
    root = session_named(sws, "a-rather-long-root-name")
    context = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
    pg = context.new_page()
    try:
        with served(sws.root) as url:
            for path in ("/", f"/s/{root.id}", "/usage", f"/usage?session={root.id}", "/harness",
                         f"/harness/c/{sha}", "/evals", "/evals/run?root=0&path=a-run-with-a-long-name"):
                go(pg, url, path)
                width = pg.evaluate("document.documentElement.scrollWidth")
                assert width <= 390, (path, width)
                for button in pg.locator("button").all():
                    box = button.bounding_box()
                    assert box and box["x"] >= 0 and box["x"] + box["width"] <= 390, (path, box)
                shot(pg, tmp_path, "phone-" + (path.strip("/").split("?")[0].replace("/", "-") or "tree"))
    finally:
        context.close()


def test_eval_chart_labels_are_whole_and_apart(sws, page, tmp_path):
    """Runs of nearly the same score and cost, one at the top score: each label whole, inside the chart,
    on no other."""
    names = [f"run-{i}-with-a-name-long-enough-to-matter" for i in range(5)]
    for name, (score, cost) in zip(names, [(1.0, 0.010), (1.0, 0.0101), (0.98, 0.0102), (0.5, 0.03), (0.0, 0.0)]):
        folder = sws.root / "eval-runs" / name
        folder.mkdir(parents=True)
        (folder / "results.jsonl").write_text(f'{{"id": "i", "score": {score}, "cost_usd": {cost}}}\n')
    with served(sws.root) as url:
        go(page, url, "/evals")
        found = page.evaluate("""() => {
            const svg = document.querySelector('#chart-score svg'), vb = svg.viewBox.baseVal;
            const box = (t) => { const b = t.getBBox(); return {x: b.x, y: b.y, w: b.width, h: b.height}; };
            return {vb: [vb.x, vb.y, vb.width, vb.height],
                    labels: [...svg.querySelectorAll('text.label')].map(t => ({...box(t), text: t.textContent}))};
        }""")
        shot(page, tmp_path, "eval-labels")
    x0, y0, width, height = found["vb"]
    labels = found["labels"]
    assert sorted(label["text"] for label in labels) == names
    for a in labels:
        assert x0 <= a["x"] and a["x"] + a["w"] <= x0 + width and y0 <= a["y"] and a["y"] + a["h"] <= y0 + height, a
        for b in labels:
            apart = (a["x"] + a["w"] <= b["x"] or b["x"] + b["w"] <= a["x"] or a["y"] + a["h"] <= b["y"]
                     or b["y"] + b["h"] <= a["y"])
            assert a is b or apart, (a, b)


@pytest.mark.parametrize("verdict", ["approve", "deny"])
def test_answer_an_approval_with_its_buttons(sws, page, tmp_path, verdict):
    """The request appears on the open page (live), with its code; a button answers it, as the person."""
    (sws.root / "script.yaml").write_text(
        '- code: "print(\'gated-\' + str(6 * 7))"\n- text: "gated answer"\n')
    ws = configure(sws, approve={"cells": ["gated-"]})
    with served(ws.root) as url, BackgroundRunner(ws):
        write_goal(ws, "Print it", name="gated")
        s = wait_for(lambda: session_named(ws, "gated"), what="the session")
        go(page, url, f"/s/{s.id}")
        page.wait_for_selector("#approve-1", timeout=30000)
        assert "gated-" in page.inner_text("#approval-1 pre") and "waiting: approval 1" in page.inner_text("#waiting")
        shot(page, tmp_path, f"approval-{verdict}")
        if verdict == "deny":
            page.fill("#reason-1", "not that one")
        page.click(f"#{verdict}-1")
        said = {"approve": "approved", "deny": "denied"}[verdict]
        assert f"Approval 1 {said}." in page.inner_text("#note")
        if verdict == "approve":
            page.wait_for_selector(".ev-cell >> text=gated-42", timeout=30000)
        else:
            page.wait_for_selector(".ev-cell >> text=not that one", timeout=30000)
        page.wait_for_selector("#status.idle", timeout=30000)
        assert page.locator(".approval").count() == 0
    [answer] = s.events("approval")
    assert answer["via"] == "web" and answer["verdict"] == said
