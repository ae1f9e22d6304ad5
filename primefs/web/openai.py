"""The OpenAI-compatible endpoint of `primefs serve --openai` (docs/openai-endpoint.md).

`GET /v1/models` lists the workspace's model aliases as `primefs/<alias>`. `POST /v1/chat/completions`
runs one session per request through the Python API (`asubmit`): the last user message is the task,
earlier messages and attached files its `context` (a long message too), never a prompt. The reply is the
session's answer; `usage` is its tree's. With `stream: true` the answer comes as content once the session
gives it, and everything before it (model replies as they stream, cells, children) as SSE comment lines
`: primefs <event>`. Errors are OpenAI's JSON shape. A client that goes away stops its session.
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import json
import time

from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from primefs.errors import PrimefsError

MAX_BODY = 200_000_000  # bytes: a request's messages and files (contexts may be long; they go to files)
LONG_MESSAGE = 8_000  # characters: a longer last message is the session's context, not its task
ROLES = {"system", "developer", "user", "assistant", "tool"}
SHOWN_CHARS = 2_000  # of each long field of an event sent as a progress comment
FINISH = {"answered": "stop", "done": "stop", "max_steps": "length"}


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400, code: str | None = None, param: str | None = None):
        super().__init__(message)
        self.status, self.code, self.param = status, code, param


def error(status: int, message: str, kind: str = "invalid_request_error", code: str | None = None,
          param: str | None = None) -> JSONResponse:
    """OpenAI's error body (the `openai` client raises its status's exception with this message)."""
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}}, status)


def aliases(ws) -> list[str]:
    return sorted(str(a) for a in (ws.config.get("models") or {}))


async def models(request: Request) -> JSONResponse:
    ws = request.app.state.pf.ws
    return JSONResponse({"object": "list", "data": [
        {"id": f"primefs/{a}", "object": "model", "created": 0, "owned_by": "primefs"} for a in aliases(ws)]})


async def chat_completions(request: Request):
    state = request.app.state.pf
    try:
        body = await _body(request)
        alias = _model(state.ws, body.get("model"))
        task, context = request_task(body.get("messages"))
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise BadRequest("`stream` must be true or false", param="stream")
        handle = await state.api.asubmit(task, context=context, model=alias)
    except BadRequest as exc:
        return error(exc.status, str(exc), code=exc.code, param=exc.param)
    except PrimefsError as exc:
        return error(400, str(exc))
    model = f"primefs/{alias}"
    if stream:
        return StreamingResponse(_streamed(handle, model), media_type="text/event-stream",
                                 headers={"X-Accel-Buffering": "no", "Cache-Control": "no-store"})
    waiting = asyncio.ensure_future(handle.await_result())
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({waiting, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not waiting.done():  # the client went away: its session's work is not wanted any more
            waiting.cancel()
            handle.stop(timeout=0)  # asked, not waited for: the event loop serves the other requests
    if not waiting.done() or waiting.cancelled():
        return error(499, "the client closed the request; its session was stopped", code="client_closed")
    result = waiting.result()
    if not result.ok:
        return _failed(result)
    return JSONResponse({
        "id": f"chatcmpl-{result.session_id}", "object": "chat.completion", "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": result.answer or ""},
                     "finish_reason": FINISH.get(result.stop_reason or "", "stop"), "logprobs": None}],
        "usage": usage(result.usage), "primefs": extension(result)})


def usage(u: dict) -> dict:
    return {"prompt_tokens": u["input_tokens"], "completion_tokens": u["output_tokens"],
            "total_tokens": u["input_tokens"] + u["output_tokens"],
            "prompt_tokens_details": {"cached_tokens": u.get("cache_read_tokens", 0)}}


def extension(result) -> dict:
    """What OpenAI's shape has no field for: the session, how it ended, the tree's calls and cost."""
    return {"session": result.session_id, "name": result.name, "status": result.status,
            "stop_reason": result.stop_reason, "calls": result.usage["calls"], "cost_usd": result.usage["cost_usd"]}


def _failed(result) -> JSONResponse:
    why = f" ({result.stop_reason})" if result.stop_reason else ""
    message = f"session {result.session_id} is {result.status}{why}" + (f": {result.error}" if result.error else "")
    body = {"error": {"message": message, "type": "session_failed", "param": None, "code": result.stop_reason},
            "usage": usage(result.usage), "primefs": extension(result)}
    # 4xx: clients retry 5xx (and 429) by themselves, and each retry would be another session
    return JSONResponse(body, 402 if (result.stop_reason or "").startswith("budget:") else 422)


async def _streamed(handle, model: str):
    created, cid = int(time.time()), f"chatcmpl-{handle.id}"

    def chunk(delta: dict, finish: str | None = None, **extra) -> str:
        choices = [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}] if delta is not None else []
        return "data: " + json.dumps({"id": cid, "object": "chat.completion.chunk", "created": created,
                                      "model": model, "choices": choices, **extra}, ensure_ascii=False) + "\n\n"

    yield chunk({"role": "assistant", "content": ""})
    try:
        async for event in handle.aevents():
            if event["type"] == "result" and event.get("text"):
                yield chunk({"content": event["text"]})
            else:
                yield f": primefs {json.dumps(_shown(event), ensure_ascii=False)}\n\n"
        result = handle.result
        if not result.ok:
            yield "data: " + json.dumps(json.loads(_failed(result).body)) + "\n\n"
        else:
            yield chunk({}, FINISH.get(result.stop_reason or "", "stop"))
            yield chunk(None, usage=usage(result.usage), primefs=extension(result))
        yield "data: [DONE]\n\n"
    finally:
        if not handle.ended:  # the client went away (Starlette cancelled us): stop the work it asked for
            handle.stop(timeout=0)


def _shown(event: dict) -> dict:
    """An event for a progress comment: one line, its long strings cut."""
    out = {}
    for k, v in event.items():
        if isinstance(v, str) and len(v) > SHOWN_CHARS:
            v = v[:SHOWN_CHARS] + f"... ({len(v) - SHOWN_CHARS:,} more characters)"
        out[k] = v
    return out


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


# -- reading the request -----------------------------------------------------------------------------
async def _body(request: Request) -> dict:
    if "json" not in request.headers.get("content-type", ""):
        raise BadRequest("expected a JSON body (Content-Type: application/json)", 415)
    raw = bytearray()
    async for piece in request.stream():
        raw += piece
        if len(raw) > MAX_BODY:
            raise BadRequest(f"the request is over {MAX_BODY // 1_000_000} MB", 413)
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return body


def _model(ws, model) -> str:
    """`primefs/<alias>` (or a bare alias) -> the alias."""
    if not isinstance(model, str) or not model:
        raise BadRequest("`model` is required: one of GET /v1/models (primefs/<alias>)", param="model")
    alias = model.removeprefix("primefs/")
    if alias not in aliases(ws):
        known = ", ".join(f"primefs/{a}" for a in aliases(ws)) or "none: add models: to primefs.yaml"
        raise BadRequest(f"The model `{model}` does not exist (models: {known})", 404, "model_not_found", "model")
    return alias


def request_task(messages) -> tuple[str, dict | None]:
    """(task, context) of a request's messages: the last user message is the task (a long one is in
    context["message"]); earlier messages are context["conversation"], attached files context["files"]."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("`messages` must be a non-empty list", param="messages")
    read = [_message(m, i) for i, m in enumerate(messages)]
    *earlier, (role, text, files) = read
    if role != "user":
        raise BadRequest(f"the last message must be the user's, not {role!r}", param="messages")
    if not text.strip() and not files:
        raise BadRequest("the last message has no text and no file", param="messages")
    context: dict = {}
    notes = []
    if earlier:
        context["conversation"] = [{"role": r, "content": t} for r, t, _ in earlier]
        notes.append(f"The {len(earlier)} message(s) before this one are in context['conversation'] "
                     "(a list of {role, content}).")
    earlier_files = {name: body for _, _, f in earlier for name, body in f.items()}
    if files or earlier_files:
        context["files"] = {**earlier_files, **files}
        notes.append(f"Attached files are in context['files'] (name -> text): {', '.join(context['files'])}.")
    if len(text) > LONG_MESSAGE:
        context["message"] = text
        task = f"The user's message ({len(text):,} characters) is in context['message']: read it there and answer it."
    else:
        task = text.strip() or "Answer the user's request about the attached files."
    return (task + ("\n\n" + " ".join(notes) if notes else "")), (context or None)


def _message(m, i: int) -> tuple[str, str, dict[str, str]]:
    where = f"messages[{i}]"
    if not isinstance(m, dict):
        raise BadRequest(f"{where} must be an object with `role` and `content`", param=where)
    role = m.get("role")
    if role not in ROLES:
        raise BadRequest(f"{where}.role must be one of {', '.join(sorted(ROLES))}, not {role!r}", param=where)
    content = m.get("content")
    if content is None or isinstance(content, str):
        return role, content or "", {}
    if not isinstance(content, list):
        raise BadRequest(f"{where}.content must be text or a list of parts", param=where)
    texts, files = [], {}
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "file" and isinstance(part.get("file"), dict):
            name, body = _file(part["file"], f"{where}.content[{j}]", len(files))
            files[name] = body
        else:
            raise BadRequest(f"{where}.content[{j}]: only text parts and files (file_data) are taken, not "
                             f"{kind!r}", param=where)
    return role, "\n".join(texts), files


def _file(f: dict, where: str, n: int) -> tuple[str, str]:
    """A file part's `file_data` (a data: URL or plain base64) as text."""
    data = f.get("file_data")
    if not isinstance(data, str):
        raise BadRequest(f"{where}: a file must carry `file_data` (file_id uploads are not kept here)", param=where)
    payload = data.split(",", 1)[1] if data.startswith("data:") and "," in data else data
    try:
        raw = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise BadRequest(f"{where}: `file_data` is not base64", param=where) from None
    if b"\0" in raw:
        raise BadRequest(f"{where}: only text files are taken (this one has NUL bytes)", param=where)
    name = f.get("filename") if isinstance(f.get("filename"), str) and f.get("filename") else f"file-{n + 1}.txt"
    return name, raw.decode("utf-8", errors="replace")


ROUTES = [Route("/v1/models", models), Route("/v1/chat/completions", chat_completions, methods=["POST"])]
