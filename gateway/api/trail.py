"""One request's provenance state while it is served (`Trail`): the salts and the
request commitment, the dispatch record once durable, the receipt being signed, and what
went to the client (hashed as it is relayed, the stream's tail kept to find its usage).
The relays feed it; the recorder (gateway/api/recorder.py) writes its records.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.api.usage_bound import over_bound
from gateway.api.usage_read import PastBounds, counts_in, read_json, utf8_document
from gateway.provenance import LogEntry, RecordError, Salts, Usage
from gateway.provenance.formats.attestation import Attestation
from gateway.provenance.formats.receipts import attach_countersignature
from gateway.provenance.formats.upstream_ids import UpstreamIds

__all__ = ["Trail", "usage_in"]

_TAIL = 4096  # bytes of a stream kept to find its usage chunk
_LINE_ENDS = re.compile(rb"\r\n|\r|\n")
# A JSON answer: whitespace before it allowed, and a UTF-8 byte order mark before that
# (httpx's `Response.json` skips it).
_JSON_OBJECT = re.compile(rb"(?:\xef\xbb\xbf)?[ \t\r\n]*\{")
# An escaped ASCII letter: `"\u0075sage"` is a `usage` key to a JSON parser.
_ESCAPED_LETTER = re.compile(rb"\\u00[4-7]")
_DONE = re.compile(rb"data: ?\[DONE\]")  # a line that ends a stream (gateway/api/sse.py)


@dataclass(slots=True)
class Trail:
    """One request's provenance state while it is served."""

    salts: Salts
    request_commitment: str
    dispatch: LogEntry | None = None
    refusal: LogEntry | None = None  # the refusal record, when nothing was dispatched
    receipt: asyncio.Future[bytes] | None = None  # the DSSE envelope, being signed
    receipt_failed: bool = False  # its signing raised: the answer goes without one
    response_hash: Any = field(default_factory=hashlib.sha256)
    # The stream's last pieces, at least its last `_TAIL` bytes when it has them (`tail`);
    # joined and trimmed only past twice that, not copied for each piece. A private
    # stream's relay (gateway/api/stream_relay.py) keeps none past its first: `streamed`
    # gives it the usage its client read, and `usage` then never reads the tail.
    _pieces: list[bytes] = field(default_factory=list)
    _held: int = 0
    whole: bytes | None = None
    prompt_bytes: int = 0  # the request body's size, for the token estimate and bound
    # The parsed request, for the bound on the tokens charged (gateway/api/usage_bound.py).
    ask: Mapping[str, Any] | None = None
    media: int | None = None  # its `counted_media` (None: counted when the bound is)
    sent_bytes: int = 0  # response bytes relayed to the client
    # A backend took the prompt (an attempt sent it and was not refused), whether or not
    # any answer came back: its prompt is charged even when nothing was relayed.
    offered: bool = False
    _usage: Usage | None = None
    _usage_read: bool = False
    _reported: Usage | None = None  # usage the backend reported out of the client's sight
    _watched: bool = False  # a private stream, read as its client read it: no tail parsed
    # `"backend"`: the backend's own error event reached the client (`streamed`).
    stream_error: str | None = None
    # An attested backend's verdict (gateway/api/attested.py), for the completion record,
    # and the countersignature it accepted, for the client's receipt.
    attestation: Attestation | None = None
    countersignature: bytes | None = None
    # The backend whose verdict is in `attestation`, not yet counted in the metric: it is
    # counted once the attempt ends (`attested.count_verdict`), as its record says it.
    judged_by: str | None = None
    upstream: UpstreamIds | None = None  # a hosted provider's ids for the answer
    # A failed attempt's completion (status, error, when it ended), held until the next
    # dispatch or the request's end (`Recorder.settle`): its status is then what the
    # client gets.
    held: tuple[int, str | None, float] | None = None
    # `usage_bound`'s last answer and what it was computed from (the usage, the request,
    # its size and the answer's): asked up to four times per request, computed once.
    _bound_of: tuple[Any, ...] | None = None
    _bound: int | None = None

    def relayed(self, data: bytes) -> None:
        """A piece of a stream went to the client."""
        self.response_hash.update(data)
        self.sent_bytes += len(data)
        self._pieces.append(data)
        self._held += len(data)
        if self._held > 2 * _TAIL:
            kept = b"".join(self._pieces)[-_TAIL:]
            self._pieces, self._held = [kept], len(kept)
        self._usage_read = False

    @property
    def tail(self) -> bytes:
        """The stream's last `_TAIL` bytes relayed (fewer when it is shorter)."""
        return b"".join(self._pieces)[-_TAIL:]

    def answered(self, data: bytes) -> None:
        """A whole (non-stream) answer went to the client."""
        self.response_hash.update(data)
        self.sent_bytes += len(data)
        self.whole = data
        self._usage_read = False

    def read_as(self, usage: Usage | None) -> None:
        """The whole answer fed to `answered` was read before it went out
        (`answer_reads.check_readable`): its usage is that, not read again."""
        self._usage, self._usage_read = usage, True

    def unsent(self) -> None:
        """The whole answer fed to `answered` did not go out after all (cancelled before
        it was sent): nothing was sent, and no countersignature of it is the client's
        (the sidecar's statement then counts as one the client left before, as for a
        stream). Its usage stays: the backend reported it."""
        self.response_hash = hashlib.sha256()
        self.sent_bytes = 0
        self.attestation = self.countersignature = None

    def cut_after(self) -> None:
        """The gateway's error event went out after the relayed stream (a drain or a
        forced shutdown cut it): a countersignature accepted of the stream covers bytes the
        client got with that event after them, not the answer it received, so it is not
        taken (`missing`, as for a stream that broke off after its comment)."""
        if self.attestation is not None and self.attestation.failure is None:
            self.attestation = Attestation(self.attestation.key, failure="missing")
        self.countersignature = None

    def reported(self, counts: Mapping[str, int]) -> None:
        """Usage the backend reported in its stream (`StreamWatch.usage`: also in a chunk
        held back from a client that did not ask for it)."""
        try:
            self._reported = Usage(
                counts.get("prompt_tokens", 0),
                counts.get("completion_tokens", 0),
                counts.get("total_tokens", 0),
            )
        except RecordError:  # e.g. negative counts: not usage
            self._reported = None

    def streamed(self, counts: Mapping[str, int] | None, *, backend_error: bool) -> None:
        """A private stream's end, read as its client read it (gateway/api/sse_events.py):
        the usage it was shown (or held back from it), none when None, and whether the
        backend's own error event reached it."""
        self._watched = True
        self._reported = None
        if counts is not None:
            self.reported(counts)
        self.stream_error = "backend" if backend_error else None

    def receipt_now(self) -> bytes | None:
        """`sealed_receipt` without waiting: the receipt if signed already, else None (an
        answer that cannot wait for it: uvicorn's forced shutdown, `TenantSurface._cut`)."""
        receipt = self.receipt
        if receipt is None or not receipt.done() or receipt.cancelled() or receipt.exception():
            return None
        if self.countersignature is not None:
            return attach_countersignature(receipt.result(), self.countersignature)
        return receipt.result()

    async def sealed_receipt(self) -> bytes | None:
        """The receipt of the current dispatch once signed (None if there is none, or its
        signing failed: the recorder logged that), with the backend's countersignature
        when one was accepted."""
        if self.receipt is None:
            return None
        try:
            receipt = await asyncio.shield(self.receipt)
        except Exception:  # noqa: BLE001 - Recorder._sealed logged and counted it
            self.receipt_failed = True  # the answer goes on, marked as without a receipt
            return None
        if self.countersignature is not None:
            return attach_countersignature(receipt, self.countersignature)
        return receipt

    def usage(self) -> Usage | None:
        """Token usage the backend reported for the answer seen so far (parsed once per
        answer); never an estimate."""
        if self._reported is not None or self._watched:
            return self._reported
        if not self._usage_read:
            if self.whole is not None:
                self._usage = _usage(self.whole, whole=True)
            else:
                self._usage = _usage(self.tail, whole=False)
            self._usage_read = True
        return self._usage

    def usage_bound(self) -> int | None:
        """The bound the reported usage was cut to when it exceeds what the request and
        the answer justify (gateway/api/usage_bound.py); None when it does not, or when
        none was reported."""
        usage = self.usage()
        if usage is None:
            return None
        answer_bytes = len(self.whole) if self.whole is not None else self.sent_bytes
        inputs = (usage, self.ask, self.media, self.prompt_bytes, answer_bytes)
        if inputs != self._bound_of:
            self._bound = over_bound(
                _reported_tokens(usage), self.ask, self.prompt_bytes, answer_bytes, self.media
            )
            self._bound_of = inputs
        return self._bound

    def charged_tokens(self) -> int:
        """Tokens to charge to the tenant's budget: the reported usage, never past the
        bound the request justifies (`usage_bound`); for an answer without usage, an
        estimate that errs high: a token per 4 bytes of the request body plus one per 4
        bytes relayed (SSE framing included). With nothing relayed, the prompt's share
        when a backend took the prompt (`offered`: the client left before the first
        byte, the backend did not answer in time), else 0."""
        usage = self.usage()
        if usage is not None:
            bound = self.usage_bound()
            return _reported_tokens(usage) if bound is None else bound
        if self.sent_bytes == 0 and not self.offered:
            return 0
        return -(-self.prompt_bytes // 4) + -(-self.sent_bytes // 4)


def _reported_tokens(usage: Usage) -> int:
    return max(usage.total_tokens, usage.prompt_tokens + usage.completion_tokens)


def _usage(data: bytes, *, whole: bool) -> Usage | None:
    """Token usage from a JSON answer, or from the last usage chunk of a stream's tail
    before its `[DONE]` (what a client reads; the same rules as `StreamWatch`), each read
    as the client's parser reads it (gateway/api/usage_read.py); `whole`: `data` is a
    whole answer, in whichever encoding `json.loads` tells (UTF-16, UTF-32), read as one
    document only, as the client's `json.loads` reads it (never its `data:` lines). A
    usage chunk past the read bounds (`PastBounds`) makes the usage unknown: none, never
    an earlier chunk's."""
    if whole:
        try:
            data = utf8_document(data)
        except ValueError:  # not text in the encoding it starts in: `json.loads` fails too
            return None
    if data.find(b'"usage"') < 0 and _ESCAPED_LETTER.search(data) is None:  # `find`: labels.py
        return None  # most streams carry none: parse nothing
    one = whole or _JSON_OBJECT.match(data) is not None
    candidates = [data] if one else _usage_lines(data)
    for candidate in candidates:
        try:
            doc = read_json(candidate, line=not one)
        except PastBounds:  # the client may read a usage here: not an earlier one
            return None
        except ValueError:
            continue
        # Counts as the backend wrote them, or none: "3", 3.9 or true is no count, and the
        # client was shown that usage object: none, never an earlier chunk's; so is a
        # usage that is no object (`7`, the SDK's `chunk.usage` then).
        if not isinstance(doc, dict) or doc.get("usage") is None:
            continue
        return usage_in(doc, candidate, line=not one)
    return None


def usage_in(doc: Any, data: bytes, *, line: bool = False) -> Usage | None:
    """The usage of `doc`, which `read_json` parsed from `data` (`line`: as for it): none
    unless its `usage` is an object of counts the record can state."""
    if not isinstance(doc, dict) or not isinstance(doc.get("usage"), dict):
        return None
    counts = counts_in(doc, data, line=line)
    if counts is None:
        return None
    try:
        return Usage(**counts)
    except RecordError:  # negative, or past 2**53
        return None


def _usage_lines(data: bytes) -> list[bytes]:
    """The values of a stream's `data:` lines holding `"usage"`, last first, up to its
    `[DONE]` line: `data:` with or without the space, lines ending in LF, CRLF or CR."""
    lines = _LINE_ENDS.split(data)
    for at, line in enumerate(lines):
        if _DONE.match(line):
            del lines[at:]
            break
    return [
        line[5:]
        for line in reversed(lines)
        if line.startswith(b"data:")
        and (b'"usage"' in line or _ESCAPED_LETTER.search(line) is not None)
    ]
