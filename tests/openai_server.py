"""A scripted OpenAI-compatible HTTP server, for tests that drive litellm over real HTTP.

Only the model's choices are mocked (by a script, see ``primefs.providers.script``);
requests, responses, streaming (SSE over chunked HTTP/1.1), errors and usage are real::

    with ScriptServer([{"code": "print(1)"}, {"text": "done"}]) as server:
        litellm.completion(model="openai/test-model", api_base=server.url, api_key="x", ...)
        server.requests   # the JSON bodies received
        server.usages     # the usage reported for each successful completion

Replies: with a non-empty ``tools`` list in the request, a reply with ``code`` becomes one
tool call of function ``python`` with arguments ``{"code": ...}``; otherwise the code is
sent as a ```python fence in the content.
"""
from __future__ import annotations

import itertools
import json
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from primefs.providers.script import estimate_tokens, fenced, next_reply, normalize_script, prompt_tokens

CHAT_PATHS = {"/v1/chat/completions", "/chat/completions"}
MODELS_PATHS = {"/v1/models", "/models"}


def _pieces(text: str, n: int = 3) -> list[str]:
    """``text`` split into at most ``n`` non-empty pieces (none if empty)."""
    if not text:
        return []
    size = max(1, -(-len(text) // n))
    return [text[i:i + size] for i in range(0, len(text), size)]


class ScriptServer:
    """An OpenAI-compatible chat completions server on 127.0.0.1 answering from a script.

    ``ScriptServer(script, *, delay=0.0, host="127.0.0.1", port=0)``: ``script`` is anything
    ``normalize_script`` accepts; ``delay`` seconds are slept before each reply (``stall``
    seconds after the first chunk of a streamed one); port 0 picks a free port. Use as a context manager, or call ``start()``/``stop()``.
    """

    def __init__(self, script: Any, *, delay: float = 0.0, host: str = "127.0.0.1", port: int = 0):
        self._lock = threading.Lock()
        self._script = normalize_script(script)
        self.delay = delay
        self.stall = 0.0  # seconds a streamed reply pauses after its first chunk (a server gone quiet)
        self._host, self._port = host, port
        self._requests: list[dict] = []
        self._usages: list[dict] = []
        self._failures: list[int] = []  # statuses for the next requests to fail with
        self._timings: list[tuple[float, float]] = []  # (request read, reply sent) per completion
        self._ids = itertools.count(1)
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> "ScriptServer":
        if self._httpd is not None:
            return self
        self._httpd = ThreadingHTTPServer((self._host, self._port), _make_handler(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"ScriptServer:{self.port}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> "ScriptServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- public state ------------------------------------------------------------------------
    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("ScriptServer is not started")
        return self._httpd.server_address[1]

    @property
    def url(self) -> str:
        """The API base, e.g. ``http://127.0.0.1:PORT/v1``."""
        return f"http://{self._host}:{self.port}/v1"

    @property
    def requests(self) -> list[dict]:
        """JSON bodies of every chat completion request received (failed ones too), in arrival order."""
        with self._lock:
            return list(self._requests)

    @property
    def usages(self) -> list[dict]:
        """``{"prompt_tokens", "completion_tokens"}`` reported per successful completion, in order."""
        with self._lock:
            return [dict(u) for u in self._usages]

    @property
    def timings(self) -> list[tuple[float, float]]:
        """``(request read, reply sent)`` wall-clock times per successful completion, in order."""
        with self._lock:
            return list(self._timings)

    def set_script(self, script: Any) -> None:
        normalized = normalize_script(script)
        with self._lock:
            self._script = normalized

    def fail_next(self, n: int = 1, status: int = 500) -> None:
        """Make the next ``n`` chat completion requests fail with HTTP ``status``."""
        with self._lock:
            self._failures.extend([status] * n)

    # -- request handling (called from handler threads) -----------------------------------------
    def _admit(self, body: dict) -> tuple[int | None, dict, int]:
        """Record a request; return (failure status or None, script, response number)."""
        with self._lock:
            self._requests.append(body)
            status = self._failures.pop(0) if self._failures else None
            return status, self._script, next(self._ids)

    def _record_usage(self, usage: dict) -> None:
        with self._lock:
            self._usages.append({"prompt_tokens": usage["prompt_tokens"],
                                 "completion_tokens": usage["completion_tokens"]})

    def _answer(self, body: dict, script: dict, number: int) -> dict:
        """The completion's parts: content, tool_calls, finish_reason and usage."""
        messages = body.get("messages") or []
        reply = next_reply(script, messages)
        text, code = reply.get("text") or "", reply.get("code")
        tool_calls = None
        if code is not None and body.get("tools"):
            content = text or None
            arguments = json.dumps({"code": code})
            tool_calls = [{"id": f"call_{number}", "type": "function",
                           "function": {"name": "python", "arguments": arguments}}]
            finish = "tool_calls"
        else:
            content = fenced(text, code) if code is not None else text
            arguments = ""
            finish = "stop"
        given = reply.get("usage") or {}
        p = given.get("input_tokens")
        c = given.get("output_tokens")
        p = int(p) if p is not None else prompt_tokens(messages)
        c = int(c) if c is not None else estimate_tokens((content or "") + arguments)
        usage = {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}
        if given.get("cached_tokens") is not None:  # as OpenAI reports a prompt-cache hit (part of prompt_tokens)
            usage["prompt_tokens_details"] = {"cached_tokens": int(given["cached_tokens"])}
        if given.get("cache_creation_input_tokens") is not None:  # as Anthropic-style servers add a cache write
            usage["cache_creation_input_tokens"] = int(given["cache_creation_input_tokens"])
        return {"content": content, "tool_calls": tool_calls, "finish_reason": finish, "usage": usage}


def _error_body(status: int, message: str) -> dict:
    kind = "server_error" if status >= 500 else "invalid_request_error"
    if status == 429:
        kind = "rate_limit_exceeded"
    return {"error": {"message": message, "type": kind, "param": None, "code": str(status)}}


def _make_handler(owner: ScriptServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = 30  # idle keep-alive connections are dropped after this
        # headers and body go out in two writes: without TCP_NODELAY the body waits ~40 ms for the
        # client's delayed ACK of the headers, a delay of this test server, not of the client
        disable_nagle_algorithm = True

        def log_message(self, format, *args):  # noqa: A002 - quiet
            pass

        # -- helpers --
        def _send_json(self, status: int, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            self.wfile.flush()

        def _path(self) -> str:
            return self.path.split("?", 1)[0].rstrip("/") or "/"

        # -- routes --
        def do_GET(self):
            if self._path() in MODELS_PATHS:
                self._send_json(200, {"object": "list", "data": [
                    {"id": "test-model", "object": "model", "created": 0, "owned_by": "primefs-tests"}]})
            else:
                self._send_json(404, _error_body(404, f"no route GET {self.path}"))

        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            arrived = time.time()
            if self._path() not in CHAT_PATHS:
                self._send_json(404, _error_body(404, f"no route POST {self.path}"))
                return
            try:
                body = json.loads(raw or b"{}")
                if not isinstance(body, dict):
                    raise ValueError("body is not a JSON object")
            except ValueError as exc:
                self._send_json(400, _error_body(400, f"invalid JSON body: {exc}"))
                return
            status, script, number = owner._admit(body)
            if owner.delay:
                time.sleep(owner.delay)
            if status is not None:
                phrase = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else "error"
                self._send_json(status, _error_body(status, f"scripted failure: {status} {phrase}"))
                return
            answer = owner._answer(body, script, number)
            model = body.get("model") or "test-model"
            cid, created = f"chatcmpl-{number}", int(time.time())
            # recorded before sending, so a client that has its answer always sees it in usages
            owner._record_usage(answer["usage"])
            if body.get("stream"):
                include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
                self._stream(answer, model, cid, created, include_usage)
            else:
                message = {"role": "assistant", "content": answer["content"]}
                if answer["tool_calls"]:
                    message["tool_calls"] = answer["tool_calls"]
                self._send_json(200, {
                    "id": cid, "object": "chat.completion", "created": created, "model": model,
                    "choices": [{"index": 0, "message": message, "logprobs": None,
                                 "finish_reason": answer["finish_reason"]}],
                    "usage": answer["usage"],
                })
            with owner._lock:
                owner._timings.append((arrived, time.time()))

        def _stream(self, answer: dict, model: str, cid: str, created: int, include_usage: bool) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()

            def send(data: str) -> None:
                payload = f"data: {data}\n\n".encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(payload), payload))
                self.wfile.flush()

            sent = [0]

            def chunk(delta: dict, finish: str | None = None) -> None:
                event = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                         "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
                if include_usage:
                    event["usage"] = None
                send(json.dumps(event))
                sent[0] += 1
                if sent[0] == 1 and owner.stall:
                    time.sleep(owner.stall)

            content, calls = answer["content"], answer["tool_calls"]
            pieces = _pieces(content or "")
            if pieces:
                chunk({"role": "assistant", "content": pieces[0]})
                for piece in pieces[1:]:
                    chunk({"content": piece})
            for i, call in enumerate(calls or []):
                head = {"index": i, "id": call["id"], "type": "function",
                        "function": {"name": call["function"]["name"], "arguments": ""}}
                delta = {"tool_calls": [head]}
                if not pieces and i == 0:
                    delta = {"role": "assistant", "content": None, **delta}
                chunk(delta)
                for piece in _pieces(call["function"]["arguments"]):
                    chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})
            if not pieces and not calls:
                chunk({"role": "assistant", "content": ""})
            chunk({}, answer["finish_reason"])
            if include_usage:
                send(json.dumps({"id": cid, "object": "chat.completion.chunk", "created": created,
                                 "model": model, "choices": [], "usage": answer["usage"]}))
            send("[DONE]")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

    return Handler
