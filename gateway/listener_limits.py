"""The public listener's limits, and the answers it gives for what passes them.

`ListenerLimits` is what one listener enforces (`listen.*` in gateway.yaml,
docs/configuration.md), `derived_max_connections` its default connection cap, and
`Refusal` what a parser callback raises to stop parsing; `refusal_answer` is the OpenAI
error the listener writes itself (never through the app) before it closes, and
`Refusals` counts refusals by reason and logs them at most every `_LOG_EVERY_S`. The
protocol that applies them is `gateway/listener.py`; the `owngate attest` sidecar's own
listener (`gateway/attest/`) applies the same limits with the same answers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import resource
from typing import TYPE_CHECKING

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE

from gateway.errors import ErrorCode, error_body
from gateway.logs import get_logger

if TYPE_CHECKING:
    from gateway.config.schema import ListenSettings

__all__ = [
    "ADMIN_MAX_CONNECTIONS",
    "LINGER_BYTES",
    "LINGER_S",
    "MAX_PIPELINED",
    "NO_TRAILERS",
    "NO_UPGRADE",
    "TOO_MANY_PIPELINED",
    "ListenerLimits",
    "Refusal",
    "Refusals",
    "cancel",
    "derived_max_connections",
    "framing_message",
    "framing_too_long_message",
    "head_size",
    "late_message",
    "refusal_answer",
    "refuse_framing",
    "too_long_message",
    "too_many_message",
]

_FD_HEADROOM = 64  # descriptors kept for log files, Redis, the listening socket, ...
_MAX_DERIVED_CONNECTIONS = 4096  # a head in progress holds up to ~max_header_bytes
LINGER_S = 2.0  # after a refusal: how long what the client still sends is dropped
LINGER_BYTES = 1 << 20  # ... and how much of it, at most
MAX_PIPELINED = 16  # requests a connection may queue behind the one being answered
_LOG_EVERY_S = 10.0
# The admin API's listener (`admin.listen`) runs in the same process with the public
# listener's limits, but at most this many connections: with the public cap (derived from
# the same open-file limit) it held as many again, taking the descriptors left for backend
# connections. A control plane has a few callers (a console opens some 6 at once). Past
# the cap, a connection waiting for a request makes room, as on the public listener
# (gateway/listener_room.py).
ADMIN_MAX_CONNECTIONS = 32


def cancel(*timers: asyncio.TimerHandle | None) -> None:
    """Cancel each of `timers` that is set. A connection's end cancels all of its own and
    uvicorn's keep-alive timer: uvicorn cancels that one only when the connection ended
    cleanly, so a client's reset left it holding the connection (its head, request cycle
    and transport, tens of KB) for `keepalive_timeout_s`, past the connection cap (no key
    needed: reset connections in a loop held 47 KB each, 140 MB per 3,000)."""
    for timer in timers:
        if timer is not None:
            timer.cancel()


def derived_max_connections(open_files_limit: int) -> int:
    """The default connection cap for a process whose open-file (soft) limit is
    `open_files_limit` (negative: unlimited). A client connection may hold one backend
    connection while its request runs, so clients get half of what the headroom leaves;
    with the common limit of 1024 that is 480. At most 4096 whatever the limit (containers
    often allow 2^20 files): each connection whose head is arriving holds up to
    `max_header_bytes`, about 150 MB for 4096 full 32 KB heads."""
    if open_files_limit < 0:
        return _MAX_DERIVED_CONNECTIONS
    return max(1, min((open_files_limit - _FD_HEADROOM) // 2, _MAX_DERIVED_CONNECTIONS))


@dataclasses.dataclass(frozen=True, slots=True)
class ListenerLimits:
    """The limits one listener enforces (see the module docstring)."""

    max_header_bytes: int
    max_headers: int
    header_timeout_s: float
    body_timeout_s: float
    max_connections: int
    write_timeout_s: float = 120.0

    @classmethod
    def from_config(cls, listen: ListenSettings) -> ListenerLimits:
        cap = listen.max_connections
        if cap is None:
            cap = derived_max_connections(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        return cls(
            max_header_bytes=listen.max_header_bytes,
            max_headers=listen.max_headers,
            header_timeout_s=listen.header_timeout_s,
            body_timeout_s=listen.body_timeout_s,
            max_connections=cap,
            write_timeout_s=listen.write_timeout_s,
        )


class Refusals:
    """What one listener refused, by reason, logged at most every `_LOG_EVERY_S`: an
    attacker opening connections must not be able to flood the log."""

    def __init__(self) -> None:
        self.totals: dict[str, int] = {}
        self._next_log = 0.0
        self._log = get_logger("owngate.listener")

    def note(self, reason: str, now: float) -> None:
        self.totals[reason] = self.totals.get(reason, 0) + 1
        if now >= self._next_log:
            self._next_log = now + _LOG_EVERY_S
            self._log.warning("listener limits enforced", latest=reason, totals=dict(self.totals))


class Refusal(Exception):
    """Raised in a parser callback to stop parsing; `data_received` answers it."""

    def __init__(
        self,
        code: ErrorCode,
        reason: str,
        message: str,
        headers: tuple[tuple[bytes, bytes], ...] = (),
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.headers = headers  # more header fields for the answer (`retry-after`)


NO_UPGRADE = (
    "Protocol upgrades (Upgrade with Connection: upgrade, CONNECT) are not supported; "
    "send the request as plain HTTP/1.1."
)


TOO_MANY_PIPELINED = f"More than {MAX_PIPELINED} requests were sent ahead of their answers."


NO_TRAILERS = "Trailer fields are not accepted; send every header before the body."

BAD_TRANSFER_CODING = (
    "Transfer-Encoding must be exactly chunked: no other transfer coding is supported."
)
TRANSFER_CODING_ON_1_0 = (
    "An HTTP/1.0 request cannot carry Transfer-Encoding; send Content-Length instead."
)
REPEATED_HOST = "The request has more than one Host header field."
CONTENT_CODING = (
    "Content-Encoding is not supported on requests; send the body uncompressed (identity)."
)
_VERSIONS = frozenset(("1.0", "1.1"))
UNSUPPORTED_VERSION = "Only requests in HTTP version 1.1 or 1.0 are accepted."


def refuse_framing(headers: list[tuple[bytes, bytes]], http_version: str) -> None:
    """Raise a 400 `Refusal` for a request head a proxy in front may frame otherwise
    than llhttp does (header names in lower case):

    - an HTTP version other than 1.0 and 1.1: llhttp also parses `HTTP/0.9` and
      `HTTP/2.0` request lines with headers, keep-alive and a chunked body, where a
      proxy reads an HTTP/0.9 request as ending with its request line and answers 505 to
      a major version it does not speak (RFC 9112 section 2.3; 400 here: the closed set
      of error codes has no 505);
    - a Transfer-Encoding other than `chunked` alone. llhttp reads a body as chunked
      whenever chunked is the last coding, so `identity, chunked` or `gzip, chunked`
      passed as plain chunked (the body never decoded), where a proxy in front may frame
      it otherwise. RFC 9112 section 6.1: a coding the server does not know is answered
      501 or 400 (400 here, as above), and an HTTP/1.0 request with Transfer-Encoding
      has faulty framing (400, as nginx answers it);
    - more than one Host field: RFC 9112 section 3.2 requires 400 (a proxy in front may
      route on one and a backend read the other; a missing Host is accepted, the gateway
      routes on nothing it says);
    - a Content-Encoding other than `identity`: the body would be read as plain JSON
      here and decoded by whatever reads it after (415, RFC 9110 section 8.4.1: so no
      component reads the body otherwise than the gateway checked and logged it)."""
    if http_version not in _VERSIONS:
        raise Refusal(ErrorCode.invalid_request, "version", UNSUPPORTED_VERSION)
    codings: list[bytes] = []
    hosts = 0
    for name, value in headers:
        if name == b"transfer-encoding":
            codings.extend(c.strip(b" \t").lower() for c in value.split(b","))
        elif name == b"host":
            hosts += 1
        elif name == b"content-encoding" and any(
            c.strip(b" \t").lower() not in (b"", b"identity") for c in value.split(b",")
        ):
            raise Refusal(ErrorCode.unsupported_media_type, "content_coding", CONTENT_CODING)
    if hosts > 1:
        raise Refusal(ErrorCode.invalid_request, "host", REPEATED_HOST)
    if not codings:
        return
    if http_version == "1.0":
        raise Refusal(ErrorCode.invalid_request, "transfer_coding", TRANSFER_CODING_ON_1_0)
    if [c for c in codings if c] != [b"chunked"]:  # empty list elements are allowed
        raise Refusal(ErrorCode.invalid_request, "transfer_coding", BAD_TRANSFER_CODING)


def too_many_message(limit: int) -> str:
    return f"The request has more than {limit} header fields."


def too_long_message(limit: int) -> str:
    return f"The request's header fields exceed {limit} bytes."


def framing_message(exc: httptools.HttpParserError) -> str:
    # llhttp's reasons are fixed strings ("Invalid header token"), never client bytes;
    # keep only what looks like one.
    reason = str(exc)
    if not (reason.isascii() and reason.isprintable() and len(reason) <= 80):
        reason = "malformed"
    return f"Invalid HTTP request received: {reason}."


def framing_too_long_message(limit: int) -> str:
    return f"The request's chunk framing or trailer fields exceed {limit} bytes."


def late_message(part: str, timeout_s: float) -> str:
    return f"The request {part} did not arrive within {timeout_s:g} s."


def head_size(method: bytes, url: bytes, headers: list[tuple[bytes, bytes]]) -> int:
    """A request head's size as sent: request line, header lines, the blank line."""
    size = len(method) + len(url) + 13  # " ", " HTTP/1.1\r\n", "\r\n"
    for name, value in headers:
        size += len(name) + len(value) + 4  # ": ", "\r\n"
    return size


def refusal_answer(
    code: ErrorCode, message: str, default_headers: list[tuple[bytes, bytes]]
) -> bytes:
    body = error_body(code, message)
    lines = [STATUS_LINE[code.status]]
    lines.extend(name + b": " + value + b"\r\n" for name, value in default_headers)
    lines.append(b"content-type: application/json\r\n")
    lines.append(b"content-length: %d\r\n" % len(body))
    lines.append(b"x-request-id: req_" + os.urandom(12).hex().encode() + b"\r\n")
    lines.append(b"connection: close\r\n\r\n")
    lines.append(body)
    return b"".join(lines)
