"""The sidecar's signing half: one counter, one key, one append-only log.

Each statement gets the next counter value, is signed at once (the answer waits only for
an Ed25519 signature, some 50 µs) and is queued for the sidecar's own log with group
commit, in counter order. The log is the C2SP tlog the gateway writes (checkpoints,
tiles), under the sidecar's own origin and key, so `owngate audit verify` reads it as is.
The counter continues from the log's size after a restart; statements signed but lost in
a crash before their group commit are missing from the log, which the cross-check
(`owngate audit verify --attest-log`) reports rather than hides.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime

from gateway.logs import get_logger
from gateway.provenance import LogEntry, ProvenanceLog, Signer
from gateway.provenance.formats.attestation import Statement, sign_statement
from gateway.provenance.formats.records import format_time

__all__ = ["Notary"]


class Notary:
    """Countersigns statements and logs them; built on an open log."""

    def __init__(
        self,
        signer: Signer,
        log: ProvenanceLog,
        *,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._signer = signer
        self._key = str(signer)
        self._log = log
        self._now = now
        self._next = log.size
        self._events = get_logger("owngate.attest")

    @property
    def writable(self) -> bool:
        """Whether the log takes entries: the sidecar refuses to serve when it does not."""
        return self._log.last_error is None

    def countersign(
        self, request_id: str, request_commitment: str, response_commitment: str
    ) -> bytes:
        """The signed envelope of the next statement (also queued for the log)."""
        statement = Statement(
            request_id,
            format_time(self._now()),
            self._next,
            self._key,
            request_commitment,
            response_commitment,
        )
        self._next += 1
        envelope = sign_statement(statement, self._signer)
        written = self._log.append_soon(statement.record(), checked=True)
        written.add_done_callback(lambda done: self._logged(done, statement.counter))
        return envelope

    def _logged(self, written: asyncio.Future[LogEntry], counter: int) -> None:
        error = None if written.cancelled() else written.exception()
        if error is not None:
            self._events.error("statement not logged", counter=counter, reason=type(error).__name__)
