"""Answers of unknown length to HTTP/1.0 clients: no chunked framing, ended by closing.

uvicorn frames an answer that has neither `content-length` nor `transfer-encoding` (a
stream) as chunked whatever the request's version, but an HTTP/1.0 client knows no
transfer coding (RFC 9112, section 6.1: chunked must not be sent to it): it reads the
chunk-size lines as part of the body. As nginx does, such an answer to an HTTP/1.0
request goes out with no `transfer-encoding` and its end is the connection's close
(uvicorn never keeps an HTTP/1.0 connection open, and says `connection: close`).
`close_delimited(cycle)`, which the listener (`gateway/listener.py`) applies to each
HTTP/1.0 request, gives its `RequestResponseCycle` this `send`. Answers with a
`content-length`, to HEAD, 204 and 304 are uvicorn's as before. The stream relay's
`BodyWriter` is not `ready()` for such an answer (its framing is not chunked), so the
relay sends its chunks through `send` (gateway/body_writer.py).
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

__all__ = ["CloseDelimitedCycle", "close_delimited"]


def close_delimited(cycle: RequestResponseCycle) -> None:
    """Make `cycle` (an HTTP/1.0 request's) a `CloseDelimitedCycle`."""
    cycle.__class__ = CloseDelimitedCycle


class CloseDelimitedCycle(RequestResponseCycle):
    """uvicorn's cycle, with an answer of unknown length sent unframed (see the module)."""

    unframed = False  # the answer started has no length: its body ends with the connection

    async def send(self, message: Any) -> None:
        if not self.response_started:
            if message["type"] == "http.response.start" and _unsized(self, message):
                # No chunked framing (uvicorn adds `transfer-encoding: chunked` only when
                # it is None), and a `transfer-encoding` of the app's own is dropped.
                self.unframed = True
                self.chunked_encoding = False
                self.keep_alive = False
                headers = message.get("headers", [])
                message = {
                    **message,
                    "headers": [(n, v) for n, v in headers if n.lower() != b"transfer-encoding"],
                }
        elif self.unframed and not self.response_complete:
            await self._send_unframed(message)
            return
        await super().send(message)

    async def _send_unframed(self, message: Any) -> None:
        """A body message of an unframed answer: its bytes as they are; the last one
        closes the connection (uvicorn's completion, without its length checks)."""
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()
        if self.disconnected:
            return
        if message["type"] != "http.response.body":
            raise RuntimeError(
                f"Expected ASGI message 'http.response.body', got {message['type']!r}."
            )
        body = message.get("body", b"")
        if body:
            self.transport.write(body)
        if not message.get("more_body", False):
            self.response_complete = True
            self.message_event.set()
            self.transport.close()
            self.on_response()


def _unsized(cycle: RequestResponseCycle, message: Any) -> bool:
    """Whether uvicorn would frame this answer as chunked: it has a body (not HEAD, not
    204 or 304) and no `content-length`."""
    if cycle.scope["method"] == "HEAD" or message["status"] in (204, 304):
        return False
    headers = cycle.default_headers + list(message.get("headers", []))
    return all(name.lower() != b"content-length" for name, _ in headers)
