"""The JSON access log: one line per proxied request, encoded once, written off the loop.

Through structlog the line cost ~50 µs of event-loop CPU (the generic `redact` pass over
every field took most of it, then a flushed write per line). Its fields are a fixed set
of gateway-made values (ids, config names, enums, numbers; `Exchange.model` is a
configured name or "<unknown>", never the client's string), so this writer encodes the
line with one `orjson.dumps` and checks the encoded bytes once for anything secret-shaped,
for anything but short plain ASCII (a non-ASCII byte, a JSON escape, DEL, more than
`PLAIN_LINE_BYTES`: a policy version is any string its author wrote, bidi overrides and
megabytes included) and its field names against `FIELDS`; only a hit (never expected)
re-encodes through `gateway.logs.redact`, which cuts and escapes, so the redaction and
bounding guarantees are the structured log's. The line is
byte-for-byte the shape structlog wrote: the fields, then `event`, `level`, `timestamp`
(ISO 8601, UTC, `Z`).

Lines go to a bounded buffer that a writer thread drains to the log stream: a slow or
stalled reader of the stream (a full pipe) never blocks the event loop, and memory never
grows past `limit_bytes`; a line that does not fit is dropped and counted (`dropped`,
published as `owngate_access_log_dropped_total`). `close()` (run at exit) writes what is
buffered before the process ends.
"""

from __future__ import annotations

import atexit
import datetime
import threading
import time
from collections.abc import Callable
from typing import Any, Final

import orjson

from gateway.logs import redact

__all__ = [
    "DEFAULT_LIMIT_BYTES",
    "FIELDS",
    "PLAIN_LINE_BYTES",
    "AccessLog",
    "current",
    "dropped_total",
    "install",
]

DEFAULT_LIMIT_BYTES: Final = 1 << 20
"""The buffer's bound: ~3,000 lines, a few seconds of a stalled reader at full load."""

PLAIN_LINE_BYTES: Final = 2048
"""The longest line written as encoded; a longer one (only a value nobody expected makes
one: a line is ~350 bytes) goes through `redact`, which cuts every value."""
_BATCH_S: Final = 0.05
"""How long the writer gathers lines after the first before writing them: one wake-up and
one write per batch, not per line (a wake-up per line cost the loop as much as the
encoding); a line reaches the stream at most this much later."""
_CLOSE_WAIT_S: Final = 5.0
"""How long `close()` waits for the writer: a stalled stream must not hang the exit."""

FIELDS: Final = frozenset(
    {
        "request_id",
        "endpoint",
        "tenant",
        "model",
        "data_class",
        "data_class_defaulted",
        "policy",
        "backend",
        "fallback",
        "status",
        "stream",
        "upstream_error",
        "unserved",
        "duration_ms",
        "event",
        "level",
        "timestamp",
    }
)
"""The line's fields; any other name makes the line go through `redact` whole."""
_UTC: Final = datetime.UTC


class _Clock:
    """structlog's ISO timestamp (`2026-01-02T03:04:05.123456Z`, no fraction at a whole
    second), its date and time formatted once per second rather than per line."""

    def __init__(self) -> None:
        self._second, self._prefix = -1, ""

    def now(self) -> str:
        now = time.time()
        second = int(now)
        if second != self._second:
            stamp = datetime.datetime.fromtimestamp(second, _UTC)
            self._second, self._prefix = second, stamp.strftime("%Y-%m-%dT%H:%M:%S")
        micros = int((now - second) * 1_000_000)
        return f"{self._prefix}.{micros:06d}Z" if micros else f"{self._prefix}Z"


class AccessLog:
    """A bounded, thread-drained writer of access lines to `write` (bytes, one call per
    batch of whole lines)."""

    def __init__(
        self,
        write: Callable[[bytes], object],
        flush: Callable[[], object] = lambda: None,
        limit_bytes: int = DEFAULT_LIMIT_BYTES,
    ) -> None:
        self._write, self._flush, self._limit = write, flush, limit_bytes
        self._pending = bytearray()  # whole lines; guarded by _lock
        self._lock = threading.Lock()
        self._wake = threading.Event()  # set by the first line after a batch was taken
        self._closed = threading.Event()  # cuts a batch's gathering short
        self._closing = False
        self.dropped = 0
        self._clock = _Clock()
        self._thread = threading.Thread(target=self._drain, name="owngate-access-log", daemon=True)
        self._thread.start()

    def emit(self, fields: dict[str, Any]) -> None:
        """Queue the line for `fields` (the request's metadata; `fields` is consumed)."""
        fields["event"] = "request"
        fields["level"] = "info"
        fields["timestamp"] = self._clock.now()
        line = orjson.dumps(fields, option=orjson.OPT_APPEND_NEWLINE)
        # What `gateway.logs` masks starts with one of these (a superset of its patterns: a
        # hit only costs re-encoding through `redact`); four substring searches of the
        # lowered line cost a tenth of one case-insensitive regex search. `find`, not `in`:
        # a bytes `in` first tries its operand as an int (a TypeError made and cleared).
        lowered = line.lower()
        if (
            lowered.find(b"bearer") >= 0
            or lowered.find(b"basic") >= 0
            or lowered.find(b"og-") >= 0
            or lowered.find(b"sk-") >= 0
            or len(line) > PLAIN_LINE_BYTES
            or not line.isascii()  # a bidi override, a look-alike, an invisible
            or line.find(b"\\") >= 0  # a JSON escape: a control character, a quote
            or line.find(b"\x7f") >= 0  # DEL: ASCII, but not printable, and no JSON escape
            or not FIELDS.issuperset(fields)
        ):
            line = orjson.dumps(redact(None, "info", fields), option=orjson.OPT_APPEND_NEWLINE)
        with self._lock:
            if self._closing or len(self._pending) + len(line) > self._limit:
                self.dropped += 1
                return
            self._pending += line
        if not self._wake.is_set():
            self._wake.set()

    def close(self) -> None:
        """Write what is buffered and stop the writer (waiting at most a few seconds for a
        stalled stream; lines still unwritten then are counted as dropped)."""
        with self._lock:
            self._closing = True
        self._closed.set()
        self._wake.set()
        self._thread.join(_CLOSE_WAIT_S)
        with self._lock:
            self.dropped += self._pending.count(b"\n")
            self._pending.clear()

    def _drain(self) -> None:
        while True:
            self._wake.wait()
            self._closed.wait(_BATCH_S)
            self._wake.clear()  # before taking the lines: a later emit wakes us again
            with self._lock:
                chunk, closing = bytes(self._pending), self._closing
                self._pending.clear()
            if chunk:
                try:
                    self._write(chunk)
                    self._flush()
                except (OSError, ValueError):  # the stream is gone or closed: count, go on
                    with self._lock:
                        self.dropped += chunk.count(b"\n")
            if closing:
                return


_current: AccessLog | None = None
_dropped_before = 0  # lines dropped by writers replaced since


def install(writer: AccessLog | None) -> None:
    """Make `writer` this process's access log (None: structlog writes the line), closing
    the one before it; the last is closed at exit, so a clean stop loses nothing."""
    global _current, _dropped_before
    previous, _current = _current, writer
    if previous is not None:
        previous.close()
        _dropped_before += previous.dropped


def current() -> AccessLog | None:
    """The process's access-log writer, if the JSON log has one."""
    return _current


def dropped_total() -> int:
    """Access lines this process dropped (buffer full, stream gone)."""
    return _dropped_before + (_current.dropped if _current is not None else 0)


@atexit.register
def _close_at_exit() -> None:
    if _current is not None:
        _current.close()
