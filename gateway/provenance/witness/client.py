"""Asking a C2SP tlog-witness for cosignatures: one HTTP/1.1 exchange, standard library only.

`request_cosignature` sends one add-checkpoint request and returns the witness's
cosignature lines; a refusal raises `WitnessError` with the code matching the spec's
status (a 409 carries the witness's `known_size`), a network failure or timeout raises
`WitnessError("unavailable")`. `WitnessClient` adds what a log needs around it: it keeps
the size the witness last cosigned, builds the consistency proof from there, adopts the
size a 409 reports and retries once, and verifies the answer against the witness's key.

One connection per request (`Connection: close`): a log asks once per checkpoint, so a
keep-alive pool would buy nothing. `https://` URLs use the system trust store.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Awaitable, Callable, Sequence
from urllib.parse import urlsplit

from gateway.provenance.errors import MalformedError, ProvenanceError, SignatureError
from gateway.provenance.formats.cosignature import CosignatureVerifier, attach_cosignatures
from gateway.provenance.witness.app import STATUS
from gateway.provenance.witness.lookup import open_witness_connection
from gateway.provenance.witness.witness import AddCheckpoint, WitnessCode, WitnessError
from gateway.tls_options import os_roots_context

__all__ = [
    "CLOSE_S",
    "FAILURE_REASONS",
    "MAX_AHEAD_S",
    "MAX_ANSWER",
    "MAX_BEHIND_S",
    "MAX_LINE",
    "MAX_RESPONSE",
    "Prover",
    "WitnessClient",
    "failure_reason",
    "request_cosignature",
]

MAX_RESPONSE = 64 * 1024
#: the longest line (status, header, chunk size) of an answer
MAX_LINE = 8 * 1024
#: everything read of one answer: head, chunk framing and body
MAX_ANSWER = MAX_RESPONSE + 16 * 1024
#: how long a witness may take to end the connection once its answer is read
CLOSE_S = 1.0
_HEX = b"0123456789abcdefABCDEF"
_CODES: dict[int, WitnessCode] = {status: code for code, status in STATUS.items()}
#: how far a cosignature's time may be from the gateway's clock: this much after its answer
#: came (well within an auditor's 300 s, so a clock a little behind the gateway's still
#: accepts what was stored), or this much before its request was sent (a replayed answer)
MAX_AHEAD_S = 60.0
MAX_BEHIND_S = 300.0
#: builds the consistency proof from the first size to the second (0 < first < second).
Prover = Callable[[int, int], Awaitable[Sequence[bytes]]]


def _is_number(text: str, digits: int) -> bool:
    """ASCII decimal of at most `digits` digits: int() takes it, without surprises (it
    also takes '٣', '1_0' and ' 7', and raises ValueError past 4300 digits)."""
    return 0 < len(text) <= digits and text.isascii() and text.isdigit()


class _Answer:
    """The witness's answer as it is read, within `MAX_ANSWER` bytes in all: the status
    line, the headers, chunk framing and body together. Every line is at most `MAX_LINE`.

    The body alone was bounded before, not what framed it: 100 header lines of 64 KiB each
    (6.4 MB held) or chunk-size lines padded with 60 KB extensions around 1-byte chunks
    (gigabytes read until the timeout, on the gateway's event loop) passed."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self._reader = reader
        self.left = MAX_ANSWER

    def _take(self, data: bytes) -> bytes:
        self.left -= len(data)
        if self.left < 0:
            raise MalformedError(f"witness answer is larger than {MAX_ANSWER} bytes in all")
        return data

    async def line(self) -> bytes:
        try:
            return self._take(await self._reader.readline())
        except ValueError as exc:  # the stream's line limit (MAX_LINE)
            raise MalformedError(
                f"a line of the witness answer is longer than {MAX_LINE} bytes"
            ) from exc

    async def exactly(self, size: int) -> bytes:
        if size > self.left:  # checked before reading: readexactly buffers all of it
            raise MalformedError(f"witness answer is larger than {MAX_ANSWER} bytes in all")
        return self._take(await self._reader.readexactly(size))

    async def some(self, size: int) -> bytes:
        return self._take(await self._reader.read(min(size, self.left + 1)))


async def _read_head(answer: _Answer) -> tuple[int, dict[str, str]]:
    status_line = (await answer.line()).decode("latin-1")
    parts = status_line.rstrip("\r\n").split(" ", 2)  # the reason phrase may be absent
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not _is_number(parts[1], 3):
        raise MalformedError(f"not an HTTP/1.x status line: {status_line.strip()[:80]!r}")
    headers: dict[str, str] = {}
    for _ in range(100):  # a witness answer has a handful of headers
        line = (await answer.line()).decode("latin-1")
        if line in ("\r\n", "\n", ""):
            return int(parts[1]), headers
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    raise MalformedError("more than 100 response headers")


def _too_large() -> MalformedError:
    return MalformedError(f"witness answer is larger than {MAX_RESPONSE} bytes")


async def _read_chunked(answer: _Answer) -> bytes:
    body = bytearray()
    while True:  # bounded: each round reads at least one byte of MAX_ANSWER, or ends
        size_line = (await answer.line()).split(b";")[0].strip()
        if not size_line or len(size_line) > 16 or size_line.strip(_HEX):
            raise MalformedError("malformed chunk size in the witness answer")
        size = int(size_line, 16)
        if size == 0:
            return bytes(body)
        # Checked before reading: readexactly buffers all `size` bytes, so a chunk header
        # of a terabyte from a hostile witness would grow the gateway's memory until the
        # timeout.
        if size > MAX_RESPONSE - len(body):
            raise _too_large()
        body += await answer.exactly(size)
        await answer.exactly(2)  # the chunk's CRLF


async def _read_body(answer: _Answer, headers: dict[str, str]) -> bytes:
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return await _read_chunked(answer)
    length = headers.get("content-length")
    if length is not None:
        if not _is_number(length, 9) or int(length) > MAX_RESPONSE:
            raise MalformedError(f"witness answer has a bad or too large length {length[:40]!r}")
        return await answer.exactly(int(length))
    body = bytearray()  # we sent Connection: close: the answer ends where the stream does
    while len(body) <= MAX_RESPONSE:  # bounded: each round adds at least one byte or ends
        part = await answer.some(MAX_RESPONSE + 1 - len(body))
        if not part:
            return bytes(body)
        body += part
    raise _too_large()


async def _exchange(
    url: str, body: bytes
) -> tuple[int, dict[str, str], bytes, asyncio.StreamWriter]:
    """One request and its answer; the connection is left for the caller to `_close`
    (or aborted, when the exchange fails)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"witness URL {url!r} is not an http(s) URL")
    secure = parts.scheme == "https"
    port = parts.port or (443 if secure else 80)
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    authority = host if parts.port is None else f"{host}:{parts.port}"
    path = parts.path.rstrip("/") + "/add-checkpoint"
    reader, writer = await open_witness_connection(
        parts.hostname, port, os_roots_context() if secure else None, MAX_LINE
    )
    try:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {authority}\r\n"
            f"Content-Type: text/plain; charset=utf-8\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n"
        )
        writer.write(head.encode("latin-1") + body)
        await writer.drain()
        answer = _Answer(reader)
        status, headers = await _read_head(answer)
        content = await _read_body(answer, headers)
    except BaseException:
        # Failed, cut or timed out: dropped at once. A graceful close waits for the peer's
        # TLS close_notify, up to asyncio's 30 s shutdown timeout, after `timeout` ran out.
        writer.transport.abort()
        raise
    return status, headers, content, writer


async def _close(writer: asyncio.StreamWriter) -> None:
    """End a connection whose answer is read, outside the exchange's timeout: a witness
    that does not end it (no TLS close_notify) costs CLOSE_S, and cannot take back the
    answer by making the exchange time out."""
    writer.close()
    try:
        async with asyncio.timeout(CLOSE_S):
            await writer.wait_closed()
    except (OSError, TimeoutError):
        writer.transport.abort()


def _interpret(url: str, status: int, content: bytes) -> bytes:
    text = content.decode("utf-8", "replace").strip()
    if status == 200:
        if not content.endswith(b"\n") or not all(
            line.startswith("\u2014 ") for line in content.decode("utf-8", "replace").splitlines()
        ):
            raise WitnessError(
                "unavailable",
                f"witness {url} answered 200 without cosignatures",
                reason="bad_answer",
            )
        return content
    code = _CODES.get(status)
    if code == "conflict":
        known = int(text) if _is_number(text, 20) else None  # a uint64
        raise WitnessError(
            "conflict", f"witness {url}: 409, it last cosigned size {text}", known_size=known
        )
    if code is None:
        raise WitnessError(
            "unavailable", f"witness {url} answered {status}: {text[:200]}", reason="bad_status"
        )
    raise WitnessError(code, f"witness {url} refused the checkpoint ({status}): {text[:200]}")


async def request_cosignature(
    witness_url: str,
    old_size: int,
    proof: Sequence[bytes],
    checkpoint_note: bytes,
    *,
    timeout: float,
) -> bytes:
    """POST one add-checkpoint request to `witness_url` (its submission prefix).

    Returns the answer's cosignature lines, unverified: check them with
    `attach_cosignatures` or `verify_cosignature`. Raises WitnessError, or ValueError for
    a URL that is not http(s).
    """
    body = AddCheckpoint(old_size, tuple(proof), checkpoint_note).encode()
    writer: asyncio.StreamWriter | None = None
    try:
        async with asyncio.timeout(timeout):
            status, _, content, writer = await _exchange(witness_url, body)
    except TimeoutError as exc:
        if writer is not None:  # the time ran out just as the exchange ended
            writer.transport.abort()
        raise WitnessError(
            "unavailable",
            f"witness {witness_url} did not answer within {timeout:g}s",
            reason="timeout",
        ) from exc
    except ssl.SSLError as exc:  # its certificate, or the handshake
        raise WitnessError("unavailable", f"witness {witness_url}: {exc}", reason="tls") from exc
    except OSError as exc:
        raise WitnessError(
            "unavailable", f"witness {witness_url}: {exc}", reason="unreachable"
        ) from exc
    except (asyncio.IncompleteReadError, MalformedError) as exc:
        raise WitnessError(
            "unavailable", f"witness {witness_url}: {exc}", reason="bad_answer"
        ) from exc
    await _close(writer)
    return _interpret(witness_url, status, content)


#: why a cosigning attempt failed: the label `reason` of `owngate_witness_failures_total`
#: and `last_failure` in the readiness detail (a fixed set: nothing a witness says)
FAILURE_REASONS = (
    "timeout",  # no whole answer within the witness's timeout_s
    "unreachable",  # connection refused, reset, no route, name not resolved
    "tls",  # its certificate or the handshake failed
    "bad_answer",  # not a well-formed answer within the bounds, or a 200 without cosignatures
    "bad_status",  # a status the spec does not give a witness (a redirect: not followed)
    "malformed",  # the witness's refusals, by the spec's codes: 400
    "untrusted",  # 403
    "unknown_log",  # 404
    "conflict",  # 409 that a retry from its size did not settle
    "inconsistent",  # 422
    "unavailable",  # 503
    "bad_cosignature",  # no valid line by its key, or one dated too far from the request
    "log",  # the log could not prove the witness's size (a size it never signed)
    "store",  # the cosigned file could not be written
)


def failure_reason(exc: BaseException) -> str:
    """What went wrong, by an exception of `WitnessClient.cosign` (or of storing what it
    returned: OSError), as one of FAILURE_REASONS."""
    if isinstance(exc, WitnessError):
        return exc.reason if exc.reason in FAILURE_REASONS else "bad_answer"
    if isinstance(exc, SignatureError):
        return "bad_cosignature"
    if isinstance(exc, ProvenanceError):
        return "bad_answer"  # a malformed cosignature line
    if isinstance(exc, OSError):
        return "store"
    return "log"  # ValueError: a size the log has not signed


class WitnessClient:
    """One witness as a log sees it: its URL, its key and the size it last cosigned.

    `cosign(note, size, prove)` returns `note` with the witness's verified cosignature
    appended. Not safe for concurrent calls: a log cosigns its checkpoints in order.
    """

    def __init__(
        self,
        url: str,
        vkey: str,
        *,
        timeout: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.url = url
        self.verifier = CosignatureVerifier(vkey)
        self.timeout = timeout
        self.old_size = 0  # unknown until the first answer; a 409 tells the real one
        self._clock = clock

    async def cosign(self, note: bytes, size: int, prove: Prover) -> bytes:
        for attempt in range(2):  # the second try only after a 409 taught the witness's size
            asked = self._clock()
            old = self.old_size
            proof = await prove(old, size) if 0 < old < size else ()
            try:
                lines = await request_cosignature(self.url, old, proof, note, timeout=self.timeout)
            except WitnessError as error:
                known = error.known_size
                if attempt or error.code != "conflict" or known is None or known > size:
                    raise
                self.old_size = known
                continue
            cosigned = attach_cosignatures(
                note,
                lines,
                self.verifier,
                now=self._clock(),
                future_skew=MAX_AHEAD_S,
                not_before=asked - MAX_BEHIND_S,
            )
            self.old_size = size
            return cosigned
        raise AssertionError("unreachable: the loop returns or raises")  # pragma: no cover
