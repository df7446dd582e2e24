"""A raw HTTP/1.1 client for fuzzing: requests assembled byte by byte, answers parsed.

No HTTP library on the sending side: `build_request` writes exactly the request line,
header lines and body it is given (repeated, empty or malformed headers, lengths that do
not match the body), and `exchange` sends those bytes over a plain socket. The answer is
parsed with httptools (the parser uvicorn uses for requests, here for responses), and the
outcome says what the server did: the responses it wrote, whether it closed or reset the
connection, or whether it stayed silent until the client's (generous) timeout.

`half_close` ends the request with a TCP half-close (FIN): for a request the client knows
to be incomplete or malformed, the server then sees the end of its input at once instead
of waiting for bytes that never come; a complete request is sent without it (uvicorn
closes a connection whose client half-closed, which would drop a pending answer).
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field
from typing import Any, Final

import httptools
import orjson

__all__ = ["Outcome", "Response", "build_request", "exchange", "openai_error"]

CRLF: Final = b"\r\n"


@dataclass
class Response:
    """One response as it came off the wire."""

    status: int
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: bytes = b""
    complete: bool = False

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key.lower() == name:
                return value
        return None

    def describe(self) -> str:
        return f"{self.status} {self.body[:300]!r}"


@dataclass
class Outcome:
    """What the server did with one request."""

    responses: list[Response] = field(default_factory=list)
    closed: bool = False  # the server closed the connection (FIN)
    reset: bool = False  # the connection was reset (RST), or refused while sending
    hung: bool = False  # neither an answer nor a close within the client's timeout
    malformed: str | None = None  # the server's bytes were not a valid HTTP response
    seconds: float = 0.0

    @property
    def final(self) -> list[Response]:
        """The final (non-1xx) responses, in order."""
        return [r for r in self.responses if r.status >= 200]

    def describe(self) -> str:
        parts = [r.describe() for r in self.responses]
        flags = [n for n in ("closed", "reset", "hung") if getattr(self, n)]
        if self.malformed:
            flags.append(f"malformed: {self.malformed}")
        return f"responses={parts} {' '.join(flags)} after {self.seconds:.2f}s"


class _Collector:
    """httptools callbacks: one `Response` per message."""

    def __init__(self) -> None:
        self.parser: Any = None
        self.responses: list[Response] = []
        self._name = b""

    def on_message_begin(self) -> None:
        self.responses.append(Response(status=0))

    def on_header(self, name: bytes, value: bytes) -> None:
        self.responses[-1].headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.responses[-1].status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self.responses[-1].body += body

    def on_message_complete(self) -> None:
        self.responses[-1].complete = True


def build_request(
    method: bytes,
    target: bytes,
    lines: list[bytes],
    body: bytes = b"",
    version: bytes = b"HTTP/1.1",
) -> bytes:
    """The request exactly as given: header `lines` are written as they are (`name: value`,
    or anything else), none is added, dropped, folded or fixed."""
    head = [method + b" " + target + b" " + version, *lines]
    return CRLF.join(head) + CRLF + CRLF + body


def exchange(
    port: int, raw: bytes, *, half_close: bool, timeout_s: float = 30.0, chunk: int = 1 << 16
) -> Outcome:
    """Send `raw` to 127.0.0.1:`port` and read the answer.

    Without `half_close` the exchange ends with the first final response (the request is
    complete and asked for `connection: close`); with it, once the server closes."""
    outcome = Outcome()
    collector = _Collector()
    parser = httptools.HttpResponseParser(collector)
    collector.parser = parser
    started = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
            _send(sock, raw, half_close, chunk, outcome)
            _receive(sock, parser, collector, half_close, outcome)
    except TimeoutError:
        outcome.hung = True
    outcome.responses = collector.responses
    outcome.seconds = time.monotonic() - started
    return outcome


def _send(sock: socket.socket, raw: bytes, half_close: bool, chunk: int, out: Outcome) -> None:
    try:
        for start in range(0, len(raw), chunk):
            sock.sendall(raw[start : start + chunk])
        if half_close:
            sock.shutdown(socket.SHUT_WR)
    except TimeoutError:
        raise
    except OSError:  # EPIPE, ECONNRESET, ENOTCONN: the server already closed
        out.reset = True  # it gave up on the request early: read what it said


def _receive(
    sock: socket.socket, parser: Any, collector: _Collector, half_close: bool, out: Outcome
) -> None:
    while True:
        try:
            data = sock.recv(1 << 16)
        except ConnectionResetError:
            out.reset = True
            return
        if not data:
            out.closed = True
            return
        try:
            parser.feed_data(data)
        except httptools.HttpParserError as exc:
            out.malformed = f"{type(exc).__name__}: {exc}"
            return
        done = [r for r in collector.responses if r.complete and r.status >= 200]
        if done and not half_close:
            return


def openai_error(response: Response) -> dict[str, Any] | None:
    """The `error` object of an OpenAI error envelope, or None if the body is not one."""
    content_type = response.header(b"content-type") or b""
    if not content_type.startswith(b"application/json"):
        return None
    try:
        doc = orjson.loads(response.body)
    except orjson.JSONDecodeError:
        return None
    error = doc.get("error") if isinstance(doc, dict) else None
    if not isinstance(error, dict) or set(error) != {"message", "type", "param", "code"}:
        return None
    well_typed = (
        isinstance(error["message"], str)
        and isinstance(error["type"], str)
        and (error["param"] is None or isinstance(error["param"], str))
        and (error["code"] is None or isinstance(error["code"], str))
    )
    return error if well_typed else None
