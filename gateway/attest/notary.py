"""The sidecar's signing half: one counter, one key, one append-only log.

Each statement gets the next counter value, is signed at once (the answer waits only for
an Ed25519 signature, some 25-50 µs) and is queued for the sidecar's own log with group
commit, in counter order. The log is the C2SP tlog the gateway writes (checkpoints,
tiles), under the sidecar's own origin and key, so `owngate audit verify` reads it as is.
Statements signed but lost in a crash before their group commit are missing from the log,
which the cross-check (`owngate audit verify --attest-log`) reports rather than hides; their
counters were handed out all the same, so a counter is never taken from the log's size
alone: `CounterFile` (`attest-counter` in the log's directory) reserves counters on disk a
block at a time before they are used (one fsync per `COUNTER_BLOCK` statements), a restart
after a crash goes on past the reserved block, and a clean stop records the exact next
counter (no gap). Without that file a start goes on past the last counter the log holds
(`last_logged_counter`). A counter used twice would read as a replayed countersignature.

Per request this is on the sidecar's hot path, so the statement is built without the
`Statement` class's checks (its inputs are the relay's: a request id in a record's form,
receipt_payload.py `REQUEST_ID`, and two hex digests) and its time is formatted from a
per-second prefix; `tests/unit/test_attest_notary.py` checks the bytes equal
`Statement.payload()` and `sign_statement`'s envelope.
"""

from __future__ import annotations

import asyncio
import binascii
import errno
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType

from gateway.canonical import MAX_SAFE_INTEGER, canonical_json_of_plain
from gateway.logs import get_logger
from gateway.provenance import LogEntry, ProvenanceLog, Signer
from gateway.provenance.audit.reader import LogDirectory
from gateway.provenance.errors import MalformedError
from gateway.provenance.files import write_files_atomically
from gateway.provenance.formats.attestation import ATTESTATION_PAYLOAD_TYPE
from gateway.provenance.formats.layout import read_log_file
from gateway.provenance.formats.receipts import pae
from gateway.provenance.formats.records import parse_record
from gateway.provenance.formats.tiles import TILE_WIDTH

__all__ = [
    "COUNTER_BLOCK",
    "COUNTER_FILE",
    "CounterFile",
    "Notary",
    "last_logged_counter",
    "rfc3339_ms",
]

COUNTER_FILE = "attest-counter"  # in the log's directory
COUNTER_BLOCK = 1 << 16  # counters reserved per fsync; a crash skips at most this many
_MAX_COUNTER_FILE = 64  # what `CounterFile.write` writes: at most 16 digits and a newline

_PAE_PREFIX = pae(ATTESTATION_PAYLOAD_TYPE, b"")[: -len(b"0 ")]  # b"DSSEv1 N type "
# The statement's canonical JSON (RFC 8785: keys in code-unit order, no blanks) with its
# fields formatted in: what `canonical_json_of_plain(record)` writes for the relay's inputs
# (a request id in a record's form, hex digests, the time: none needs escaping; the key's
# JSON is made once), without building and encoding a dict per request. It escapes
# nothing: the relay's `REQUEST_ID` check is what keeps a client's text out of it
# (tests/unit/test_attest_request_id_gate.py), and a counter stays within 2**53.
_PAYLOAD = (
    '{"counter":%d,"key":%s,"request_commitment":"%s","request_id":"%s",'
    '"response_commitment":"%s","time":"%s","type":"attestation","v":1}'
)
_ENVELOPE = (
    b'{"payload":"%s","payloadType":"' + ATTESTATION_PAYLOAD_TYPE.encode() + b'",'
    b'"signatures":[{"keyid":%s,"sig":"%s"}]}'
)


_b64 = binascii.b2a_base64  # base64.b64encode without its Python frame (newline=False)
_NO_RECORD: Mapping[str, object] = MappingProxyType({})  # `encoded` is the record


class _Clock:
    """RFC 3339 UTC with milliseconds (`format_time`'s form) from `time.time_ns()`, the
    date and time of day formatted once per second."""

    __slots__ = ("_prefix", "_second")

    def __init__(self) -> None:
        self._second = -1
        self._prefix = b""

    def format(self, ns: int) -> bytes:
        second, rest = divmod(ns, 1_000_000_000)
        if second != self._second:
            self._prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)).encode()
            self._second = second
        return b"%s.%03dZ" % (self._prefix, rest // 1_000_000)


def rfc3339_ms(ns: int) -> str:
    """`ns` (nanoseconds since the epoch) as a statement time, e.g. 2026-01-31T12:00:00.250Z."""
    return _Clock().format(ns).decode()


def last_logged_counter(log_dir: Path, size: int) -> int:
    """The counter of the last statement in the sidecar's open log of `size` entries (its
    tiles are written when it opens), -1 when it has none. ValueError when that entry is
    not a statement: the sidecar must not start counting on a log it cannot read."""
    if size == 0:
        return -1
    bundle = LogDirectory(log_dir).bundle((size - 1) // TILE_WIDTH, size)
    data = parse_record(bundle[(size - 1) % TILE_WIDTH]).data
    counter = data.get("counter") if data.get("type") == "attestation" else None
    if type(counter) is not int:
        raise ValueError(f"{log_dir}: its last entry is not a statement")
    return counter


class CounterFile:
    """The first counter not yet reserved, kept durably in one small file."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> int:
        """The reserved bound (0 when the file does not exist); ValueError when it is not
        a number, which must stop the sidecar rather than restart the count."""
        try:
            text = read_log_file(self.path, _MAX_COUNTER_FILE).strip()
        except FileNotFoundError:
            return 0
        except MalformedError as exc:  # a FIFO, a device or larger: not waited on, not read
            raise ValueError(f"{self.path} does not hold a counter ({exc})") from exc
        # A statement's counter is at most 2**53 (JCS numbers): `_PAYLOAD`'s %d would
        # write a larger one as is, which no gateway accepts (and a JCS verifier reads as
        # another number), so a bound past it stops the sidecar.
        if not (text.isdigit() and len(text) <= 16) or int(text) > MAX_SAFE_INTEGER:
            raise ValueError(f"{self.path} does not hold a counter")
        return int(text)

    def write(self, bound: int) -> None:
        write_files_atomically([(self.path, b"%d\n" % bound)], root=self.path.parent)


class Notary:
    """Countersigns statements and logs them; built on an open log, with `counters` (a
    `CounterFile`) so that no counter is used twice across restarts, and `logged`, the
    last counter the log holds (`last_logged_counter`), in case that file is gone."""

    def __init__(
        self,
        signer: Signer,
        log: ProvenanceLog,
        *,
        now_ns: Callable[[], int] = time.time_ns,
        counters: CounterFile | None = None,
        logged: int = -1,
    ) -> None:
        self._signer = signer
        self._sign = signer.sign
        self._key = str(signer)
        self._key_json = canonical_json_of_plain(self._key)
        self._key_text = self._key_json.decode()  # for `_PAYLOAD`
        self._log = log
        self._now_ns = now_ns
        self._clock = _Clock()
        # Past the log's size and the last counter it holds (`logged`: crashes leave gaps,
        # so the size alone is below it), and past what the counter file reserved.
        self._next = max(log.size, logged + 1)
        self._counters = counters
        self._reserved = sys.maxsize  # counters below it may be handed out
        if counters is not None:
            self._next = max(self._next, counters.read())
            self._reserve()
        if self._next > MAX_SAFE_INTEGER:
            raise ValueError(f"no statement counter left (the next is {self._next} > 2**53)")
        self._events = get_logger("owngate.attest")
        # Statements handed out that the log then refused for good (a disk that did not
        # take them again before the sidecar stopped): the stop reports them (exit 4).
        self.unlogged = 0

    def unwritable(self) -> str | None:
        """What the sidecar cannot write (its log, or its counter file when a block must
        be reserved and cannot be), None when it may countersign: it refuses otherwise."""
        if self._log.last_error is not None:
            return "log"
        if self._next >= self._reserved:
            try:
                self._reserve()
            except OSError as exc:
                return f"counter file ({type(exc).__name__})"
        return None

    def countersign(
        self, request_id: bytes, request_commitment: str, response_commitment: str
    ) -> bytes:
        """The signed envelope (canonical JSON) of the next statement, also queued for the
        log. `request_id` must match `REQUEST_ID` (A-Za-z0-9._:-: no JSON escaping needed)."""
        counter = self._next
        if counter >= self._reserved:
            self._reserve()  # raises OSError when it cannot: nothing is signed then
        self._next = counter + 1
        request_id_text = request_id.decode("ascii")
        now = self._clock.format(self._now_ns()).decode("ascii")
        payload = (
            _PAYLOAD
            % (
                counter,
                self._key_text,
                request_commitment,
                request_id_text,
                response_commitment,
                now,
            )
        ).encode()
        signature = self._sign(b"%s%d %s" % (_PAE_PREFIX, len(payload), payload))
        # Logged as encoded: no record dict is built per statement (append_soon reads
        # only `encoded` when it is given with checked=True).
        written = self._log.append_soon(_NO_RECORD, checked=True, encoded=payload)
        written.add_done_callback(self._logged)
        return _ENVELOPE % (
            _b64(payload, newline=False),
            self._key_json,
            _b64(signature, newline=False),
        )

    def close(self) -> None:
        """At a stop, after the log's: the next start goes on at the exact counter. A
        disk that refuses the counter file is logged, not raised: the bound reserved
        ahead is on it, so the next start goes on past that (counters skipped, none used
        twice), and the stop still reports what else failed (before: a traceback, exit 1,
        the statements lost untold)."""
        if self._counters is not None:
            try:
                self._counters.write(self._next)
            except OSError as exc:
                self._events.error("counter file not saved", reason=type(exc).__name__)
                return
            self._reserved = self._next

    def _reserve(self) -> None:
        assert self._counters is not None
        if self._next > MAX_SAFE_INTEGER:  # what a statement's counter may be: nothing signed
            raise OSError(errno.EOVERFLOW, "no statement counter left past 2**53")
        bound = min(self._next + COUNTER_BLOCK, MAX_SAFE_INTEGER + 1)
        self._counters.write(bound)
        self._reserved = bound

    def _logged(self, written: asyncio.Future[LogEntry]) -> None:
        error = None if written.cancelled() else written.exception()
        if error is not None:
            self.unlogged += 1
            self._events.error("statement not logged", reason=type(error).__name__)
