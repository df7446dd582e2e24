"""The gateway's half of two-party receipts: checking an attested backend's
countersignature (docs/provenance.md, layer 3).

For a backend marked `attest` (gateway.yaml), the private relay sends the request's salts
(`x-owngate-salts`) beside its request id, and reads back the sidecar's countersignature:
the `x-owngate-attest` header of a whole answer, or the stream's final SSE comment
`: owngate-attest <base64>`, which `SseTail` takes out of the stream (the client gets it
inside its receipt instead, so the stream it sees is exactly the backend's, and so is the
response commitment both sides sign). Only the comment that ends the stream is the
sidecar's; any other `owngate-` line (the inference server's) is removed by the relay's
`CommentFilter` (gateway/sse_comments.py), and then the bytes the sidecar signed are
not the client's: its countersignature fails (`mismatch`). `Attester.judge` accepts
a countersignature only when it is signed by the configured key over this request id and
the gateway's own two commitments, with a counter this gateway has not seen from that
key before; anything else is recorded as a failure (`sig` null, a `failure` code),
counted in `owngate_attestations_total` and logged, never as a two-party statement. The
answer itself still goes out: a stream was already relayed, and a whole answer is
treated the same way.
"""

from __future__ import annotations

import base64
import binascii
import heapq

from gateway.api.metrics import GatewayMetrics
from gateway.api.trail import Trail
from gateway.logs import get_logger
from gateway.provenance import Verifier, commit_digest
from gateway.provenance.formats.attestation import (
    MAX_ENVELOPE,
    SSE_PREFIX,
    Attestation,
    AttestationFailure,
    check_countersignature,
)

__all__ = ["Attester", "SseTail", "count_verdict"]

_LINE_ENDS = b"\r\n"  # SSE ends a line with LF, CRLF or a bare CR
_WINDOW = 65536  # counters remembered per key, to refuse a replayed one
_MAX_TAIL = 2 * MAX_ENVELOPE  # the comment line (base64 of an envelope) and its framing


class Attester:
    """One attested backend's key and the counters seen from it."""

    def __init__(self, backend: str, vkey: str, metrics: GatewayMetrics) -> None:
        self.backend = backend
        self._verifier = Verifier(vkey)
        self._metrics = metrics
        # The counters remembered (a set to look up, a heap to forget the lowest first),
        # and the highest one forgotten: at or below it, a counter is refused unseen.
        self._seen: set[int] = set()
        self._lowest: list[int] = []
        self._forgotten = -1  # counters are 0..2**53
        self._events = get_logger("owngate.attest")

    def judge(self, trail: Trail, request_id: str, encoded: bytes | None) -> None:
        """Check the countersignature (base64 of the DSSE envelope, or None) against what
        the trail committed to, and put the verdict in the trail."""
        response = commit_digest("response", trail.salts.response, trail.response_hash.digest())
        try:
            envelope = None if encoded is None else _decode(encoded)
            counter = check_countersignature(
                envelope,
                self._verifier,
                request_id=request_id,
                request_commitment=trail.request_commitment,
                response_commitment=response,
            )
            self._fresh(counter.statement.counter)
        except AttestationFailure as failure:
            trail.attestation = Attestation(str(self._verifier), failure=failure.code)
            trail.judged_by = self.backend
            self._events.warning(
                "countersignature not accepted",
                request_id=request_id,
                backend=self.backend,
                failure=failure.code,
                reason=str(failure),
            )
            return
        trail.attestation = Attestation.accepted(counter)
        # Rebuilt from what was verified, not the bytes received: members the signature
        # does not cover (or a payload written another way) never reach the receipt.
        trail.countersignature = counter.envelope()
        trail.judged_by = self.backend

    def _fresh(self, counter: int) -> None:
        """Refuse a counter seen before from this key, or one at or below the highest
        counter forgotten (a replay too old to tell apart); remember it otherwise.

        Counters of concurrent requests arrive out of order (the sidecar takes one when it
        signs, the gateway judges when it has read the answer), so the lowest counter is
        forgotten first, not the first to arrive: then every counter ever accepted is
        either remembered or at or below `_forgotten`, and a valid late one is refused
        only once a higher one was forgotten (more than `_WINDOW` counters later)."""
        if counter <= self._forgotten:
            raise AttestationFailure(
                "replayed",
                f"counter {counter} is older than every counter remembered from this key",
            )
        if counter in self._seen:
            raise AttestationFailure("replayed", f"counter {counter} was already used")
        self._seen.add(counter)
        heapq.heappush(self._lowest, counter)
        if len(self._seen) > _WINDOW:
            self._forgotten = heapq.heappop(self._lowest)
            self._seen.discard(self._forgotten)


def count_verdict(metrics: GatewayMetrics, trail: Trail) -> None:
    """Count the verdict of the attempt that just ended in `owngate_attestations_total`,
    once, as its completion record states it: a countersignature accepted and then not
    taken (a stream the gateway cut after it, `Trail.cut_after`) counts as `missing`,
    never `ok`; one no longer in the trail (the answer never went out) is not counted."""
    backend, trail.judged_by = trail.judged_by, None
    if backend is not None and trail.attestation is not None:
        metrics.attestation(backend, trail.attestation.failure or "ok")


def _decode(encoded: bytes) -> bytes:
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise AttestationFailure("malformed", "the countersignature is not base64") from exc


class SseTail:
    """Takes the sidecar's final `: owngate-attest` comment out of a relayed stream.

    The comment starts at a line start (after LF, CRLF or a bare CR: the backend's stream
    may end its last line with any of the three); bytes that could begin it (at most the
    prefix's length, after a line end) are held back until they can be told apart. From
    the prefix on, bytes are kept here (bounded) while they can still be the stream's end:
    that one line and the blank line after it, which is all the sidecar sends (always LF:
    a comment with a CR in it is not the sidecar's). A comment that turns
    out not to be the end (bytes follow it, it holds a CR, it outgrows the bound) is not
    the sidecar's: it goes back into the stream, where `CommentFilter` removes it as it
    removes every `owngate-` line a backend writes, and the stream after it is relayed.
    `countersignature` is the value of the comment that ended the stream.
    """

    def __init__(self) -> None:
        self._held = b""
        self._line_start = True  # whether the byte before `_held` ended a line
        self._tail: bytes | None = None  # the comment that may end the stream, so far
        self._released = False  # a comment was given back: not a well-framed last line

    def feed(self, data: bytes) -> bytes:
        """Bytes from the backend in; the bytes to relay out."""
        if self._tail is not None:
            buffer, found = self._tail + data, 0
            self._tail = None
        else:
            buffer = self._held + data if self._held else data
            self._held = b""
            found = 0 if self._line_start and buffer.startswith(SSE_PREFIX) else -1
            if found < 0:
                found = _find_comment(buffer, 1)
            if found < 0:
                return self._relay(buffer, 0, line_start=self._line_start)
        out = [buffer[:found]]
        while not _may_end(buffer, found):
            self._released = True
            following = _find_comment(buffer, found + 1)
            if following < 0:
                out.append(self._relay(buffer, found, line_start=False))
                return b"".join(out)
            out.append(buffer[found:following])
            found = following
        self._tail = buffer[found:]
        return b"".join(out)

    def _relay(self, buffer: bytes, start: int, *, line_start: bool) -> bytes:
        """`buffer[start:]`, less a last partial line that may begin the comment (held)."""
        last = max(buffer.rfind(b"\n", start), buffer.rfind(b"\r", start))
        partial = buffer[last + 1 :] if last >= 0 or line_start else b""
        if partial and SSE_PREFIX.startswith(partial):
            self._held, self._line_start = partial, True
            return buffer[start : len(buffer) - len(partial)]
        if len(buffer) > start:
            self._line_start = buffer[-1] in _LINE_ENDS
        return buffer[start:]

    def flush(self) -> bytes:
        """At the end of the stream: bytes held back that were not the comment after all."""
        rest, self._held = self._held, b""
        return rest

    @property
    def countersignature(self) -> bytes | None:
        """The comment's base64 value; None when the stream had none (`b"-"`, which no
        check accepts, when it had one that is not a single well-framed last line)."""
        if self._tail is None:
            return b"-" if self._released else None
        if not self._tail.endswith(b"\n\n"):
            return b"-"
        return self._tail[len(SSE_PREFIX) : -2]


def _find_comment(buffer: bytes, start: int) -> int:
    """Where the first `SSE_PREFIX` at a line start (after an LF or a bare CR, the line
    ends SSE allows besides CRLF, whose LF precedes it) at or past `start` begins, or -1."""
    at = buffer.find(SSE_PREFIX, start)
    while at >= 0 and buffer[at - 1] not in _LINE_ENDS:
        at = buffer.find(SSE_PREFIX, at + 1)
    return at


def _may_end(buffer: bytes, at: int) -> bool:
    """Whether `buffer[at:]` (from a comment's prefix) may still be the stream's end: one
    line (LF-ended, no CR) and at most the blank line after it, within the bound."""
    if len(buffer) - at > _MAX_TAIL:
        return False
    end = buffer.find(b"\n", at)
    if end < 0:
        return buffer.find(b"\r", at) < 0
    return buffer.find(b"\r", at, end) < 0 and buffer[end + 1 :] in (b"", b"\n")
