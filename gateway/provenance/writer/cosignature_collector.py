"""Witness cosignatures on the log's checkpoints, obtained in the background.

`Cosigning` follows a `ProvenanceLog`: whenever a new checkpoint is signed, each
configured witness (C2SP tlog-witness) is sent it with a consistency proof from the size
that witness last cosigned (a restarted gateway learns that size from the witness's 409).
The witness's verified cosignature lines are appended to the checkpoint note and stored
under the log directory:

    LOGDIR/cosigned/<size:020d>   the checkpoint of that size (the log's note, byte for byte)
                                  followed by every witness cosignature line obtained for it

A witness that fails (down, slow, refusing) is retried with exponential backoff, logged,
counted and reported (`status()`, for the readiness detail and metrics); nothing here ever blocks
or fails an append, so requests keep flowing while a witness is away. Only the newest
checkpoint is sent: a witness that was away cosigns the latest tree when it returns (one
consistency proof covers the whole gap).

Standard library only (plus this package), like the rest of `gateway.provenance`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from gateway.provenance.errors import MalformedError, ProvenanceError
from gateway.provenance.files import write_files_atomically
from gateway.provenance.formats.cosignature import parse_cosignature_line
from gateway.provenance.formats.layout import (
    COSIGNED,
    cosigned_path,
    list_cosigned,
    read_log_file,
)
from gateway.provenance.witness.client import FAILURE_REASONS, WitnessClient, failure_reason
from gateway.provenance.writer.log import ProvenanceLog
from gateway.provenance.writer.store import SignedNote

__all__ = [
    "COSIGNED",
    "FAILURE_REASONS",
    "Cosigning",
    "WitnessStatus",
    "cosigned_path",
    "failure_reason",
    "list_cosigned",
    "merge_cosigned",
]


def merge_cosigned(note: bytes, stored: bytes | None, cosigned: bytes) -> bytes:
    """`note` with the witness lines of `stored` (an earlier file) and `cosigned`: the
    newest cosignature of each witness key, in the order the witnesses first came.

    Both are `note` with lines appended; a stored file for another note is replaced. One
    line per witness, however often it cosigned this size again (each gateway restart asks
    once more): a note holds at most MAX_SIGNATURES signature lines, and past that an
    auditor cannot read the file at all.
    """
    newest: dict[tuple[str, int] | str, tuple[int, str]] = {}  # witness -> (time, line)
    for source in (stored, cosigned):
        if source is None or not source.startswith(note):
            continue
        for line in source[len(note) :].decode("utf-8").splitlines():
            try:
                cosignature = parse_cosignature_line(line)
            except MalformedError:
                newest.setdefault(line, (0, line))  # not ours to judge: kept once, as it was
                continue
            key = (cosignature.name, cosignature.key_id)
            if key not in newest or cosignature.timestamp > newest[key][0]:
                newest[key] = (cosignature.timestamp, line)
    lines = [line for _, line in newest.values()]
    return note + "".join(f"{line}\n" for line in lines).encode("utf-8")


class EventLog(Protocol):
    """Where failures and recoveries are reported (a structlog logger fits)."""

    def info(self, event: str, **fields: Any) -> Any: ...

    def warning(self, event: str, **fields: Any) -> Any: ...


@dataclass(slots=True)
class WitnessStatus:
    """What the gateway knows about one witness, for the readiness detail and metrics."""

    name: str
    url: str
    cosigned_size: int | None = None  # the newest size this witness cosigned for us
    cosignatures: int = 0  # checkpoints cosigned since start
    failures: int = 0  # failed attempts since start
    consecutive_failures: int = 0
    last_error: str | None = None
    last_failure: str | None = None  # its reason, one of FAILURE_REASONS
    failures_by_reason: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(FAILURE_REASONS, 0)
    )
    last_success: float | None = None  # clock() of the last cosignature

    @property
    def state(self) -> str:
        if self.consecutive_failures:
            return "degraded"
        return "ok" if self.cosigned_size is not None else "pending"

    def detail(self, now: float) -> dict[str, Any]:
        age = None if self.last_success is None else round(now - self.last_success, 3)
        return {
            "url": self.url,
            "state": self.state,
            "cosigned_size": self.cosigned_size,
            "cosignatures": self.cosignatures,
            "failures": self.failures,
            "consecutive_failures": self.consecutive_failures,
            "last_error": self.last_error,
            "last_failure": self.last_failure,
            "last_success_age_s": age,
        }


class Cosigning:
    """Keeps every witness's cosignature on the log's newest checkpoint. `await run()`."""

    def __init__(
        self,
        log: ProvenanceLog,
        directory: Path,
        witnesses: Sequence[WitnessClient],
        *,
        retry_min_s: float = 0.5,
        retry_max_s: float = 60.0,
        poll_s: float = 0.2,
        events: EventLog | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = log
        self._directory = directory
        self._clients = tuple(witnesses)
        self._retry_min_s = retry_min_s
        self._retry_max_s = max(retry_max_s, retry_min_s)
        self._poll_s = poll_s
        self._events = events
        self._clock = clock
        self._store_lock = asyncio.Lock()
        self.witnesses = [WitnessStatus(str(c.verifier), c.url) for c in self._clients]

    @property
    def degraded(self) -> bool:
        return any(w.state == "degraded" for w in self.witnesses)

    def status(self) -> dict[str, Any]:
        now = self._clock()
        return {
            "state": "degraded" if self.degraded else "ok",
            "witnesses": {w.name: w.detail(now) for w in self.witnesses},
        }

    async def run(self) -> None:
        """Follow the log until cancelled, one loop per witness."""
        await asyncio.gather(
            *(self._follow(c, s) for c, s in zip(self._clients, self.witnesses, strict=True))
        )

    async def _follow(self, client: WitnessClient, status: WitnessStatus) -> None:
        while True:  # until cancelled; every round sleeps
            latest = self._log.latest_checkpoint()
            if latest is None or latest.checkpoint.size in (0, status.cosigned_size):
                await asyncio.sleep(self._poll_s)
                continue
            if await self.cosign_once(client, status, latest):
                await asyncio.sleep(self._poll_s)
            else:
                await asyncio.sleep(self._backoff(status.consecutive_failures))

    def _backoff(self, failures: int) -> float:
        return float(min(self._retry_max_s, self._retry_min_s * 2 ** min(failures - 1, 16)))

    async def cosign_once(
        self, client: WitnessClient, status: WitnessStatus, latest: SignedNote
    ) -> bool:
        """Ask one witness to cosign `latest` and store the result; False on failure."""
        size = latest.checkpoint.size
        try:
            cosigned = await client.cosign(latest.note, size, self._log.consistency_proof)
            await self._store(latest.note, size, cosigned)
        except (ProvenanceError, ValueError, OSError) as exc:
            # WitnessError (down, refused), a bad cosignature (SignatureError), a size the
            # log has not signed (ValueError: rollback or fork on one side), or the
            # cosigned file could not be written (OSError). All are retried.
            status.failures += 1
            status.consecutive_failures += 1
            status.last_error = error = _shown_error(exc)
            status.last_failure = reason = failure_reason(exc)
            status.failures_by_reason[reason] += 1
            if self._events is not None:
                self._events.warning(
                    "witness cosignature failed",
                    witness=status.name,
                    url=status.url,
                    size=size,
                    attempt=status.consecutive_failures,
                    reason=reason,
                    retry_in_s=self._backoff(status.consecutive_failures),
                    error=error,
                )
            return False
        if status.consecutive_failures and self._events is not None:
            self._events.info("witness cosigning resumed", witness=status.name, size=size)
        status.cosigned_size = size
        status.cosignatures += 1
        status.consecutive_failures = 0
        status.last_error = None
        status.last_failure = None
        status.last_success = self._clock()
        return True

    async def _store(self, note: bytes, size: int, cosigned: bytes) -> None:
        path = cosigned_path(self._directory, size)
        async with self._store_lock:  # witnesses of the same size merge, never overwrite
            await asyncio.to_thread(_write_merged, self._directory, path, note, cosigned)


def _write_merged(directory: Path, path: Path, note: bytes, cosigned: bytes) -> None:
    stored = None
    with contextlib.suppress(FileNotFoundError):
        # A note's bound, as the admin API serves it; a FIFO or a device there is a
        # MalformedError (the store fails and is retried), never a wait or a whole read.
        stored = read_log_file(path)
    write_files_atomically([(path, merge_cosigned(note, stored, cosigned))], root=directory)


_ERROR_CHARS = 300
"""How much of a witness failure's text is logged and shown (`last_error`)."""


def _shown_error(exc: BaseException, limit: int = _ERROR_CHARS) -> str:
    """A witness failure as the log and the readiness detail show it. Its text quotes
    the witness's answer (a refusal's body, a malformed signature line, a key name: up
    to 64 KiB that a hostile witness chooses, every retry): at most `limit` characters,
    ASCII, every other character escaped, so no line break, terminal escape or bidi
    override of the witness's reaches a log verbatim."""
    text = str(exc)
    shown = ascii(text[:limit])[1:-1]
    return shown + "..." if len(text) > limit else shown
