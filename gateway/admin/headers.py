"""Security headers on every answer of the admin listener.

The console's assets set their own (console_routes.py `SECURITY_HEADERS`: this origin's
scripts only); every other answer (the JSON API, the OpenAPI schema, the log's tiles and
checkpoint, the HTML audit report, an error object) gets what it lacks of `API_HEADERS`:

- `X-Content-Type-Options: nosniff`: no answer is ever read as another type than it
  declares (a tile or a checkpoint holds bytes a client of the public API chose);
- `Content-Security-Policy` `API_CSP`, with `sandbox`: an answer a browser shows on its
  own (the audit report, opened rather than saved; a JSON body a user navigated to with
  `admin.allow_loopback`) runs no script, loads nothing, and is not same-origin with the
  console, whose admin token is in this origin's sessionStorage;
- `Cache-Control: no-store` unless the route set one (a full tile is `immutable`): an
  answer can hold a new tenant key (`POST /admin/v1/keys`) or the log's records;
- no framing (`X-Frame-Options: DENY`) and no referrer;
- `Cross-Origin-Opener-Policy: same-origin`: a page of another origin that opened an
  answer in a tab (`window.open`) keeps no handle on that tab.

Headers the route set are kept; only missing ones are added.

`HeadAsGet` answers `HEAD` on every GET route as the GET would be answered, its head
alone: the same status and headers (`Content-Length` the GET body's), no body bytes.
FastAPI routes take GET only, and the tokenless loopback reader (auth.py) was promised
GET and HEAD while every HEAD was a 405. The schema (docs/admin-openapi.json) lists the
GET operations; HEAD is implied by them (RFC 9110 section 9.3.2). The GET it runs has
`HEAD_ONLY` set in its scope, so an answer whose body costs work to produce (a streamed
log file, log_stream.py) may send its head and skip the body.
"""

from __future__ import annotations

from typing import Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["API_CSP", "API_HEADERS", "HEAD_ONLY", "ApiHeaders", "HeadAsGet"]

# What an admin answer may do when a browser renders it: show itself with its own inline
# styles (the audit report's <style> and SVG), nothing else.
API_CSP: Final = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'; sandbox"
)
API_HEADERS: Final = (
    (b"x-content-type-options", b"nosniff"),
    (b"content-security-policy", API_CSP.encode()),
    (b"cache-control", b"no-store"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-opener-policy", b"same-origin"),
)
# Set (True) in the scope of the GET that `HeadAsGet` runs for a HEAD: its body is dropped.
HEAD_ONLY: Final = "owngate.head_only"


class ApiHeaders:
    """ASGI middleware adding the `API_HEADERS` an answer lacks."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                present = {name.lower() for name, _ in headers}
                headers += [(k, v) for k, v in API_HEADERS if k not in present]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_headers)


class HeadAsGet:
    """ASGI middleware running a `HEAD` request as a GET and sending its head alone.

    The app sees a copy of the scope (the server's own still says HEAD, so it writes no
    body either); every body message of the GET answer is dropped, and one empty final
    body message ends the answer."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return
        ended = False

        async def head_only(message: Message) -> None:
            nonlocal ended
            if message["type"] != "http.response.body":
                await send(message)
            elif not message.get("more_body", False) and not ended:
                ended = True
                await send({"type": "http.response.body", "body": b"", "more_body": False})

        await self.app({**scope, "method": "GET", HEAD_ONLY: True}, receive, head_only)
