"""The bytes a stream's response commitment covers, recovered from the stream as the
client received it (docs/provenance.md, "The body a client commits to").

A relayed SSE stream reaches the client as the backend's bytes (less the `owngate-`
comment lines the gateway removed), then what the gateway writes itself, which the
commitment does not cover: its receipt line `: owngate-receipt <base64>` and the blank
line after it, last; before it, an LF when the backend's bytes ended mid-line; and, on a
stream that broke off, its error event `data: {"error": ...}` and blank line, and before
that what ends the backend's unfinished event (nothing, an LF, or two).

Which of those line ends were the gateway's the received bytes cannot always tell (a
backend's `data: x` and the gateway's LF read exactly like a backend's `data: x\\n`), so
`committed_bodies` gives every candidate, the most likely first: each is the received
bytes with some of the gateway's trailing additions taken off, never anything else, so
a commitment that opens with one of them covers bytes the client received, up to where
the gateway's own additions begin. A body without a receipt line is its own candidate
(without one, the line ends the gateway wrote to end the backend's last event are
committed to: gateway/api/stream_writes.py `end_stream`).

An answer the backend countersigned is whole (the sidecar signs no stream that broke
off), so the gateway wrote nothing after its bytes but the receipt line:
`countersigned_body` is the one candidate such an answer opens with (`audit receipt
verify --response-body` and `audit open --receipt` alike).
"""

from __future__ import annotations

import json
import re

__all__ = [
    "committed_bodies",
    "countersigned_body",
    "gateway_error_problem",
    "stripped_error_event",
]

_RECEIPT_LINE = re.compile(rb": owngate-receipt [A-Za-z0-9+/]*={0,2}\n\n\Z")
_ERROR_EVENT = re.compile(rb'data: \{"error":\{[^\r\n]*\}\}\n\n\Z')
_LINE_ENDS = (b"\n", b"\r")


def committed_bodies(received: bytes) -> tuple[bytes, ...]:
    """The bodies a response commitment may cover, given the bytes a client received:
    `received` itself unless it ends with the gateway's receipt line; else the bytes
    before that line, without the line end and error event the gateway may have
    written before it (docs/provenance.md, "The body a client commits to")."""
    found = _RECEIPT_LINE.search(received)
    start = found.start() if found is not None else 0
    if found is None or (start and received[start - 1 : start] not in _LINE_ENDS):
        return (received,)
    body = received[:start]
    candidates = [body]
    # An LF the gateway wrote so its line starts a line: after bytes ending mid-line.
    if body.endswith(b"\n") and body[:-1] and body[-2:-1] not in _LINE_ENDS:
        candidates.append(body[:-1])
    event = _error_event(body)
    # after a blank line the gateway writes nothing, and one may end in a lone CR
    if event is not None and body[event.start() - 1 : event.start()] in (b"", *_LINE_ENDS):
        before = body[: event.start()]  # then what ended the backend's event: "", LF, 2 LF
        candidates += [
            before[: len(before) - cut] for cut in (0, 1, 2) if before.endswith(b"\n" * cut)
        ]
    return tuple(dict.fromkeys(candidates))


def countersigned_body(received: bytes) -> bytes:
    """The body a countersigned answer's commitment covers: `received` less the
    gateway's receipt line alone (no line end or error event the gateway may write
    before it after a stream that broke off, which is never countersigned)."""
    return committed_bodies(received)[0]


def stripped_error_event(received: bytes, opened: bytes) -> bytes | None:
    """The data of the error event `committed_bodies(received)` took off to reach
    `opened` (one of its candidates), or None when it took none off."""
    found = _RECEIPT_LINE.search(received)
    if found is None:
        return None
    event = _error_event(received[: found.start()])
    if event is None or len(opened) > event.start():
        return None
    return event.group()[len(b"data: ") : -2]


_ERROR_MEMBERS = {"message", "type", "param", "code"}


def gateway_error_problem(data: bytes) -> str | None:
    """Why an event's `data` is not the gateway's error (`gateway.errors.error_body`: an
    object of one member, `error`, the OpenAI error object of a message, type, param and
    code, nothing else), or None. An event merely shaped like it (a falsy `error`, other
    members SDKs read as content) is not the gateway's to add unhashed."""
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):  # RecursionError: a line nested past the stack
        return "its data is not JSON"
    error = value.get("error") if type(value) is dict and set(value) == {"error"} else None
    if type(error) is not dict or set(error) != _ERROR_MEMBERS:
        return "it is not an OpenAI error object alone"
    texts = (error["message"], error["type"], error["code"])
    if not all(type(text) is str and text for text in texts):
        return "its message, type or code is not text"
    if error["param"] is not None and type(error["param"]) is not str:
        return "its param is not text"
    return None


def _error_event(body: bytes) -> re.Match[bytes] | None:
    """`_ERROR_EVENT` where `search` finds it: at the first `data: {"error":{` of the
    body's last line. Searched from every one on that line, the pattern read the line to
    its end from each (quadratic: a backend's line of 64 KiB of them held the audit tool
    for hours)."""
    end = len(body) - 2  # past the line, its `\n\n`
    line = max(body.rfind(b"\n", 0, end), body.rfind(b"\r", 0, end)) + 1
    start = body.find(b'data: {"error":{', line)
    return None if start < 0 else _ERROR_EVENT.match(body, start)
