"""The web view (`primefs serve`): a Starlette app over the workspace's files.

Pages read the files (through one shared WorkspaceIndex); live parts are server-sent event streams
that poll the files and send HTML to put in place. The only writes are the CLI's own: mail through
`mail.deliver`, stops through `control.request_stop`, harness reverts through `harness.revert`.
"""
from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from pathlib import Path

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from primefs.errors import PrimefsError
from primefs.harness.entries import revert
from primefs.index.db import descendants
from primefs.store import approvals
from primefs.store.control import request_stop
from primefs.store.history import HistoryReader
from primefs.store.mail import deliver
from primefs.web import listing, pages
from primefs.web.index import WorkspaceIndex
from primefs.web.render import Renderer
from primefs.web.security import Guard, checked_form, csrf_token

POLL_S = 0.3  # how often a live stream looks at the files
KEEPALIVE_S = 15.0
MAX_BATCH = 500  # events sent at once; a bigger burst sends its newest part and says so
STATIC = Path(__file__).parent / "static"


class State:
    def __init__(self, ws, token: str, eval_roots: list[Path]):
        self.ws, self.token, self.eval_roots = ws, token, eval_roots
        self.csrf = csrf_token(token)
        self.index = WorkspaceIndex(ws)
        self.renderer = Renderer()
        self.stopping = threading.Event()  # set at shutdown: live streams end at once


def _page(request: Request, template: str, ctx: dict | None, nav: str, status: int = 200) -> HTMLResponse:
    state: State = request.app.state.pf
    if ctx is None:
        return _message(request, "Not found", "There is nothing here (it may have been removed).", 404)
    note, error = _flash(request)
    html = state.renderer.page(template, nav=nav, ws_root=str(state.ws.root), ws_name=state.ws.root.name,
                               csrf=state.csrf, note=ctx.pop("note", note), error=ctx.pop("error", error), **ctx)
    return HTMLResponse(html, status)


def _message(request: Request, heading: str, text: str, status: int) -> HTMLResponse:
    state: State = request.app.state.pf
    return HTMLResponse(state.renderer.page("message.html", heading=heading, text=text, nav=None,
                                            ws_root=str(state.ws.root), ws_name=state.ws.root.name), status)


def _flash(request: Request) -> tuple[str | None, str | None]:
    """Notes after an action's redirect: fixed sentences around checked values, never free text."""
    q = request.query_params
    if pages.SHA_RE.match(q.get("reverted", "")):
        return f"Reverted with a new commit {q['reverted'][:10]}; the next turn of each session uses the result.", None
    if pages.valid_sid(q.get("sent", "")):
        return f"Delivered message {q['sent']}.", None
    if q.get("stopped", "").isdigit():
        return f"Stop requested for {q['stopped']} session(s).", None
    if q.get("answered", "")[:9].isdigit() and q.get("verdict") in ("approved", "denied"):
        return f"Approval {int(q['answered'][:9])} {q['verdict']}.", None
    return None, None


def _int(request: Request, name: str, default: int | None = None) -> int | None:
    """A whole-number query parameter (a page, a byte offset); 400 if it is something else."""
    value = request.query_params.get(name, "")
    if not value:
        return default
    if not re.fullmatch(r"[0-9]{1,30}", value):
        raise HTTPException(400, f"{name}: {value[:40]!r} is not a whole number")
    return int(value)


# -- pages --------------------------------------------------------------------------------------------
def _filters(request: Request) -> dict:
    try:
        return listing.filters_of(request.query_params)
    except PrimefsError as exc:
        raise HTTPException(400, str(exc)) from None


def tree(request: Request):
    ctx = pages.tree_page(request.app.state.pf, _int(request, "page", 1), _filters(request))
    return _page(request, "tree.html", ctx, "Sessions")


def session(request: Request):
    state: State = request.app.state.pf
    sid = request.path_params["sid"]
    ctx = pages.session_page(state, sid, _int(request, "before"))
    if ctx is None and pages.valid_sid(sid):  # a name: the newest session of that name
        state.index.refresh()
        match = [k for k, name in state.index.names.items() if name == sid]
        if match:
            return RedirectResponse(f"/s/{max(match)}", 303)
    return _page(request, "session.html", ctx, "Sessions")


def usage(request: Request):
    focus = request.query_params.get("session")
    return _page(request, "usage.html", pages.usage_page(request.app.state.pf, focus or None), "Usage")


def harness(request: Request):
    return _page(request, "harness.html", pages.harness_page(request.app.state.pf), "Harness")


def commit(request: Request):
    return _page(request, "commit.html", pages.commit_page(request.app.state.pf, request.path_params["sha"]), "Harness")


def evals_list(request: Request):
    return _page(request, "evals.html", pages.evals_page(request.app.state.pf), "Evals")


def eval_run(request: Request):
    q = request.query_params
    ctx = pages.eval_run_page(request.app.state.pf, _int(request, "root", -1), q.get("path", ""))
    return _page(request, "eval_run.html", ctx, "Evals")


# -- actions (the CLI's writes, nothing else) -----------------------------------------------------------
async def send_mail(request: Request):
    state: State = request.app.state.pf
    form = await checked_form(request)
    sid = request.path_params["sid"]
    text = str(form.get("text") or "").replace("\r\n", "\n")
    if not pages.valid_sid(sid) or not (state.ws.sessions / sid / "session.yaml").is_file():
        raise HTTPException(404, "no such session")
    if not text.strip():
        return RedirectResponse(f"/s/{sid}", 303)
    msg = await run_in_threadpool(deliver, state.ws.sessions / sid / "mail", sender="user", to=sid, kind="user",
                                  text=text)
    return RedirectResponse(f"/s/{sid}?sent={msg.id}", 303)


async def stop(request: Request):
    state: State = request.app.state.pf
    form = await checked_form(request)
    sid = request.path_params["sid"]
    if not pages.valid_sid(sid) or not (state.ws.sessions / sid / "session.yaml").is_file():
        raise HTTPException(404, "no such session")
    targets = [sid] + (await run_in_threadpool(descendants, state.ws, sid) if form.get("tree") else [])
    done = await run_in_threadpool(request_stop, state.ws, targets)
    return RedirectResponse(f"/s/{sid}?stopped={len(done)}", 303)


async def answer_approval(request: Request):
    """An Approve or Deny button of a request the session waits for (handed to the runner, as the CLI does)."""
    state: State = request.app.state.pf
    form = await checked_form(request)
    sid, n = request.path_params["sid"], request.path_params["n"]
    n = int(n) if n.isascii() and n.isdigit() and len(n) < 10 else None
    if not pages.valid_sid(sid) or n is None or not (state.ws.sessions / sid / "session.yaml").is_file():
        raise HTTPException(404, "no such approval")
    verdict = str(form.get("verdict") or "")
    if verdict not in approvals.VERDICTS:
        raise HTTPException(400, "the verdict is approve or deny")
    try:
        done = await run_in_threadpool(approvals.answer, state.ws, sid, n, verdict,
                                       str(form.get("reason") or "")[:2000] or None, "web")
    except PrimefsError as exc:  # it no longer waits, no runner: say why, on the page
        return _message(request, "Not answered", str(exc), 409)
    return RedirectResponse(f"/s/{sid}?answered={n}&verdict={done['verdict']}", 303)


async def revert_commit(request: Request):
    state: State = request.app.state.pf
    form = await checked_form(request)
    sha = str(form.get("sha") or "")
    if not pages.SHA_RE.match(sha):
        raise HTTPException(400, "not a commit id")
    try:
        new = await run_in_threadpool(revert, state.ws, sha, source="user")
    except PrimefsError as exc:  # refused (conflict, not a harness commit, ...): say why, on the page
        ctx = await run_in_threadpool(pages.harness_page, state)
        return _page(request, "harness.html", {**ctx, "error": str(exc)}, "Harness", 409)
    return RedirectResponse(f"/harness?reverted={new}", 303)


# -- live streams -------------------------------------------------------------------------------------
def _patch(target: str, html: str, op: str = "replace", event_id: int | None = None) -> str:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: patch\ndata: {json.dumps({'target': target, 'op': op, 'html': html})}\n\n"


async def _stream(request: Request, step):
    """Call `step()` (in a thread) every POLL_S and send what it returns, until the client or server goes."""
    state: State = request.app.state.pf
    yield "retry: 1000\n\n"
    quiet_since = time.monotonic()
    while not state.stopping.is_set():
        if await request.is_disconnected():
            return
        chunks = await run_in_threadpool(step)
        if chunks:
            quiet_since = time.monotonic()
            for chunk in chunks:
                yield chunk
        elif time.monotonic() - quiet_since > KEEPALIVE_S:
            quiet_since = time.monotonic()
            yield ": keepalive\n\n"
        await asyncio.sleep(POLL_S)


def _sse(gen) -> StreamingResponse:
    return StreamingResponse(gen, media_type="text/event-stream", headers={"X-Accel-Buffering": "no"})


def tree_events(request: Request):
    state: State = request.app.state.pf
    page, filters = _int(request, "page", 1), _filters(request)
    last = {"version": None, "rows": None, "summary": None}

    def step():
        version = state.index.refresh()
        if version == last["version"]:
            return []
        last["version"] = version
        parts = pages.tree_parts(state, page, filters)
        out = []
        for target, template in (("rows", "_tree_rows.html"), ("summary", "_tree_summary.html")):
            html = state.renderer.page(template, **parts)
            if html != last[target]:
                last[target] = html
                out.append(_patch(target, html))
        return out

    return _sse(_stream(request, step))


def session_events(request: Request):
    state: State = request.app.state.pf
    sid = request.path_params["sid"]
    if not pages.valid_sid(sid) or not (state.ws.sessions / sid).is_dir():
        raise HTTPException(404, "no such session")
    # a reconnecting EventSource says where it got to (the id of the last batch)
    last_id = request.headers.get("last-event-id", "")
    pos = int(last_id) if last_id.isascii() and last_id.isdigit() else _int(request, "pos", 0)
    reader = HistoryReader(state.ws.sessions / sid / "history.jsonl", pos)
    last = {"version": None, "head": None}

    def step():
        out = []
        events = reader.read()
        version = state.index.refresh(force=bool(events))  # names of children just spawned, for links
        if events:
            skipped = len(events) - MAX_BATCH
            running = state.index.meta.get(sid, {}).get("status") == "running"
            html = state.renderer.events(events[-MAX_BATCH:], state.index.names, running)
            if skipped > 0:
                html = f'<p class="flash note">{skipped} events not shown: reload for the full page</p>' + html
            out.append(_patch("events", str(html), "append", reader.pos))
        if version != last["version"]:
            last["version"] = version
            html = state.renderer.page("_session_head.html", csrf=state.csrf, **pages.session_head(state, sid))
            if html != last["head"]:
                last["head"] = html
                out.append(_patch("head", html))
        return out

    return _sse(_stream(request, step))


async def _http_error(request: Request, exc: HTTPException):
    return _message(request, "Refused" if exc.status_code == 403 else "Error", exc.detail, exc.status_code)


def make_app(ws, token: str, *, port: int, allowed_hosts: set[str] | None, eval_roots: list[Path],
             openai: bool = False) -> Starlette:
    routes = [
        Route("/", tree),
        Route("/s/{sid}", session),
        Route("/s/{sid}/mail", send_mail, methods=["POST"]),
        Route("/s/{sid}/stop", stop, methods=["POST"]),
        Route("/s/{sid}/approvals/{n}", answer_approval, methods=["POST"]),
        Route("/usage", usage),
        Route("/harness", harness),
        Route("/harness/c/{sha}", commit),
        Route("/harness/revert", revert_commit, methods=["POST"]),
        Route("/evals", evals_list),
        Route("/evals/run", eval_run),
        Route("/events/tree", tree_events),
        Route("/events/s/{sid}", session_events),
        Mount("/static", StaticFiles(directory=str(STATIC)), name="static"),
    ]
    if openai:  # the OpenAI-compatible endpoint: each request a session, run through the Python API
        from primefs.api import Workspace
        from primefs.web.openai import ROUTES

        routes = ROUTES + routes
    app = Starlette(routes=routes, exception_handlers={HTTPException: _http_error})
    app.state.pf = State(ws, token, eval_roots)
    if openai:
        app.state.pf.api = Workspace(ws.root)
    app.add_middleware(Guard, token=token, port=port, allowed_hosts=allowed_hosts)
    return app
