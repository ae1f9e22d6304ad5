"""Who may use the web view: a secret token, the Host header, CSRF tokens on every form.

- The token comes in the URL `primefs serve` prints (`/?token=...`). The first request with it gets the
  token as an HttpOnly, SameSite=Strict cookie and is redirected to the same page without it, so it does
  not stay in the address bar or the history. Scripts may send `Authorization: Bearer <token>` instead.
- The Host header must name the address served (unless --allow-remote): a page on another site that
  points a name of its own at 127.0.0.1 (DNS rebinding) is refused.
- Every state-changing request is a POST carrying the CSRF token of the page it came from (derived from
  the secret) and, when the browser says where it came from (Origin), coming from this origin.
- Every response forbids framing, inline scripts and styles, and loading anything from elsewhere.
"""
from __future__ import annotations

import hashlib
import hmac
from urllib.parse import parse_qsl, urlencode

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse

SECURITY_HEADERS = [
    (b"content-security-policy", b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                                 b"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    # same-origin, not no-referrer: with no-referrer browsers send `Origin: null` on our own form posts
    (b"referrer-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
]


MAX_FORM_BYTES = 2_000_000  # a mail text, a commit id: far below this


def csrf_token(secret: str) -> str:
    return hmac.new(secret.encode(), b"primefs-csrf", hashlib.sha256).hexdigest()


def loopback_hosts(host: str, port: int) -> set[str]:
    names = {host, "127.0.0.1", "localhost", "[::1]"}
    return {f"{n}:{port}".lower() for n in names}


class Guard:
    """ASGI middleware: the checks above, before any route runs."""

    def __init__(self, app, token: str, port: int, allowed_hosts: set[str] | None):
        self.app, self.token, self.allowed_hosts = app, token, allowed_hosts
        self.cookie = f"primefs_token_{port}"  # cookies ignore ports: one name per server

    def _valid(self, value: str | None) -> bool:
        return bool(value) and hmac.compare_digest(value.encode(), self.token.encode())

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = Headers(scope=scope)

        async def send_secure(message):
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] = list(message["headers"]) + SECURITY_HEADERS
            await send(message)

        api = scope["path"].startswith("/v1/")  # the OpenAI endpoint: a bearer token only, errors as JSON
        if self.allowed_hosts is not None and headers.get("host", "").lower() not in self.allowed_hosts:
            return await _refusal(api, 400, "unknown Host header")(scope, receive, send_secure)
        if api:
            auth = headers.get("authorization", "")
            if not self._valid(auth[7:] if auth.lower().startswith("bearer ") else None):
                return await _refusal(True, 401, "send the token `primefs serve` printed as `Authorization: Bearer "
                                      "<token>` (the openai client: api_key=<token>)")(scope, receive, send_secure)
            return await self.app(scope, receive, send_secure)
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        given = next((v for k, v in query if k == "token"), None)
        if given is not None and self._valid(given) and scope["method"] == "GET":
            rest = urlencode([(k, v) for k, v in query if k != "token"])
            response = RedirectResponse(scope["path"] + (f"?{rest}" if rest else ""), 303)
            response.set_cookie(self.cookie, self.token, httponly=True, samesite="strict", path="/")
            return await response(scope, receive, send_secure)
        cookie = _cookie(headers.get("cookie", ""), self.cookie)
        auth = headers.get("authorization", "")
        bearer = auth[7:] if auth.lower().startswith("bearer ") else None
        if not (self._valid(cookie) or self._valid(bearer) or self._valid(given)):
            return await PlainTextResponse("primefs: open the URL that `primefs serve` printed (it carries the "
                                           "access token)", 401)(scope, receive, send_secure)
        return await self.app(scope, receive, send_secure)


def _refusal(api: bool, status: int, message: str):
    if api:
        return JSONResponse({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                       "code": "invalid_api_key" if status == 401 else None}}, status)
    return PlainTextResponse(message, status)


def _cookie(header: str, name: str) -> str | None:
    for part in header.split(";"):
        key, _, value = part.strip().partition("=")
        if key == name:
            return value
    return None


async def checked_form(request) -> dict:
    """The form of a POST, after the CSRF checks; 403 if they fail."""
    origin = request.headers.get("origin")
    own = f"{request.url.scheme}://{request.headers.get('host', '')}".lower()
    if origin is not None and origin.rstrip("/").lower() != own:  # `null` too: an opaque, foreign origin
        raise HTTPException(403, "cross-origin request refused")
    if not request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
        raise HTTPException(415, "expected a form (application/x-www-form-urlencoded)")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise HTTPException(413, f"a form may hold at most {MAX_FORM_BYTES // 1_000_000} MB")
    form = dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
    if not hmac.compare_digest(str(form.get("csrf", "")).encode(), request.app.state.pf.csrf.encode()):
        raise HTTPException(403, "missing or wrong CSRF token: reload the page and try again")
    return form
