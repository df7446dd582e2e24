"""The sidecar's fast statement path (`gateway.attest.notary`) writes exactly the bytes the
reference `Statement` / `sign_statement` write, and logs exactly `Statement.record()`."""

from __future__ import annotations

import asyncio
import base64
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.attest import AttestRelay, AttestSettings
from gateway.attest.notary import COUNTER_BLOCK, COUNTER_FILE, Notary, rfc3339_ms
from gateway.provenance import Signer, write_signing_key
from gateway.provenance.audit.reader import LogDirectory
from gateway.provenance.formats.attestation import Statement, open_countersignature, sign_statement
from gateway.provenance.formats.receipt_payload import REQUEST_ID
from gateway.provenance.formats.records import format_time
from gateway.provenance.testing import seeded_signer

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ID = st.text("ABCXYZabcxyz0189._:-", min_size=1, max_size=128)
_HEX = st.text("0123456789abcdef", min_size=64, max_size=64)
_NS = st.integers(min_value=0, max_value=4_102_444_800 * 10**9)  # up to 2100


class _Log:
    """What the notary uses of a ProvenanceLog: its size, health and `append_soon`."""

    def __init__(self, size: int, loop: asyncio.AbstractEventLoop) -> None:
        self.size = size
        self.last_error = None
        self.records: list[dict[str, Any]] = []
        self.encoded: list[bytes] = []
        self._loop = loop

    def append_soon(
        self, record: dict[str, Any], *, checked: bool, encoded: bytes = b""
    ) -> asyncio.Future[Any]:
        assert checked and encoded  # the record is its encoding: `record` is not read
        self.records.append(record)
        self.encoded.append(encoded)
        return self._loop.create_future()


@given(_NS)
def test_the_time_is_format_time_of_the_same_instant(ns: int) -> None:
    moment = _EPOCH + timedelta(microseconds=ns // 1000)
    assert rfc3339_ms(ns) == format_time(moment)


@settings(max_examples=60, deadline=None)
@given(_ID, _HEX, _HEX, st.integers(0, 2**40), st.lists(_NS, min_size=1, max_size=3))
def test_the_envelope_and_record_are_the_reference_ones(
    request_id: str, request_commitment: str, response_commitment: str, size: int, times: list[int]
) -> None:
    signer = seeded_signer("gpu-a.example/attest", 3)
    loop = asyncio.new_event_loop()
    try:
        _check(signer, _Log(size, loop), request_id, request_commitment, response_commitment, times)
    finally:
        loop.close()


@settings(max_examples=30, deadline=None)
@given(st.text(st.characters(exclude_categories=("Z", "C"), exclude_characters="+"), max_size=20))
def test_a_key_name_that_json_escapes_or_is_not_ascii_is_in_the_reference_bytes(
    name: str,
) -> None:
    """The statement is formatted from a template (notary.py `_PAYLOAD`), not encoded from
    its record: a key whose JSON needs escapes (`"`, `\\`) or is not ASCII is still
    written as `Statement.payload()` and `sign_statement` write it."""
    signer = seeded_signer("gpu-" + name, 5)
    loop = asyncio.new_event_loop()
    try:
        _check(signer, _Log(7, loop), "chatcmpl-abc", "ab" * 32, "cd" * 32, [10**18])
    finally:
        loop.close()


@settings(max_examples=60, deadline=None)
@given(
    st.from_regex(REQUEST_ID, fullmatch=True),
    st.one_of(st.integers(0, 2**53), st.integers(2**53 - 16, 2**53)),
    _NS,
)
def test_any_request_id_the_relay_admits_and_any_counter_are_the_reference_bytes(
    request_id: str, counter: int, ns: int
) -> None:
    """Every id in a record's form (the relay's gate, `REQUEST_ID`: the template escapes
    nothing) and counters up to 2**53 (`%d` is JCS's number form there)."""
    loop = asyncio.new_event_loop()
    try:
        signer = seeded_signer("gpu-a.example/attest", 3)
        _check(signer, _Log(counter, loop), request_id, "ab" * 32, "cd" * 32, [ns])
    finally:
        loop.close()


def _check(
    signer: Signer,
    log: _Log,
    request_id: str,
    request_commitment: str,
    response_commitment: str,
    times: list[int],
) -> None:
    clock = iter(sorted(times))
    notary = Notary(signer, log, now_ns=lambda: next(clock))  # type: ignore[arg-type]
    for number, ns in enumerate(sorted(times)):
        envelope = notary.countersign(request_id.encode(), request_commitment, response_commitment)
        statement = Statement(
            request_id,
            rfc3339_ms(ns),
            log.size + number,
            str(signer),
            request_commitment,
            response_commitment,
        )
        assert envelope == sign_statement(statement, signer)  # Ed25519 is deterministic
        # the statement is encoded once: the log is handed the bytes that were signed, the
        # record's canonical JSON, which it logs as given (no record dict is built for it)
        assert log.encoded[number] == statement.payload()
        assert json.loads(log.encoded[number]) == statement.record()
        assert open_countersignature(envelope).statement == statement


def test_the_log_holds_the_signed_payloads_byte_for_byte(tmp_path: Path) -> None:
    """The notary hands the log the statement bytes it signed: each entry of the
    sidecar's log is exactly the payload of the countersignature its client got."""
    key = tmp_path / "sidecar.key"
    write_signing_key(key, "sidecar")
    settings = AttestSettings(backend="http://127.0.0.1:9", key_file=key, log_dir=tmp_path / "log")

    async def countersign(count: int) -> list[bytes]:
        relay = AttestRelay(settings)
        assert await relay.open() is None
        envelopes = [
            relay.notary.countersign(b"r-%d" % n, "ab" * 32, "cd" * 32) for n in range(count)
        ]
        await relay.close()
        return envelopes

    envelopes = asyncio.run(countersign(3))
    entries = LogDirectory(tmp_path / "log").bundle(0, 3)
    assert entries == [base64.b64decode(json.loads(e)["payload"]) for e in envelopes]


def test_a_restart_after_a_crash_never_reuses_a_counter(tmp_path: Path) -> None:
    """Statements signed but not yet in the log when the sidecar dies (their group commit
    had not come) were handed out all the same: after the restart the counter goes on
    past them, never from the log's size (a counter used twice reads as a replay)."""
    key = tmp_path / "sidecar.key"
    write_signing_key(key, "sidecar")
    settings = AttestSettings(
        backend="http://127.0.0.1:9", key_file=key, log_dir=tmp_path / "log", flush_ms=60_000
    )
    commitment = "ab" * 32

    async def crash_after(count: int) -> list[int]:
        relay = AttestRelay(settings)
        assert await relay.open() is None
        envelopes = [relay.notary.countersign(b"r", commitment, commitment) for _ in range(count)]
        assert relay._log is not None
        await relay._log.abort()  # as a crash: the queued statements are never written
        await relay._pool.close()
        return [open_countersignature(e).statement.counter for e in envelopes]

    async def clean(count: int) -> list[int]:
        relay = AttestRelay(settings)
        assert await relay.open() is None
        envelopes = [relay.notary.countersign(b"r", commitment, commitment) for _ in range(count)]
        await relay.close()
        return [open_countersignature(e).statement.counter for e in envelopes]

    first = asyncio.run(crash_after(3))
    second = asyncio.run(crash_after(2))
    assert min(second) > max(first)
    third = asyncio.run(clean(2))
    assert min(third) > max(second)
    fourth = asyncio.run(clean(1))
    assert fourth == [third[-1] + 1]  # after a clean stop the counter goes on without a gap


def test_without_its_counter_file_a_sidecar_goes_on_past_its_last_logged_counter(
    tmp_path: Path,
) -> None:
    """The counter file is what keeps counters unique across a crash; a sidecar whose
    file is gone (deleted, a volume that did not keep it) started again from the log's
    size, below counters its log already holds after an earlier crash's gap: the log
    then holds a counter going backwards and, later, one used twice, which the audit
    reads as replays. It now goes on past the last counter its log holds."""
    key = tmp_path / "sidecar.key"
    write_signing_key(key, "sidecar")
    settings = AttestSettings(backend="http://127.0.0.1:9", key_file=key, log_dir=tmp_path / "log")
    commitment = "ab" * 32

    async def run(count: int, *, crash: bool) -> list[int]:
        relay = AttestRelay(settings)
        assert await relay.open() is None
        envelopes = [relay.notary.countersign(b"r", commitment, commitment) for _ in range(count)]
        assert relay._log is not None
        if crash:
            await relay._log.abort()
            await relay._pool.close()
        else:
            await relay.close()
        return [open_countersignature(e).statement.counter for e in envelopes]

    asyncio.run(run(2, crash=False))  # counters 0, 1, logged
    asyncio.run(run(0, crash=True))  # a crash: the next start skips the reserved block
    logged = asyncio.run(run(1, crash=False))  # logged past the gap
    assert logged[0] >= COUNTER_BLOCK
    (tmp_path / "log" / COUNTER_FILE).unlink()
    after = asyncio.run(run(1, crash=False))
    assert after == [logged[0] + 1]


def test_no_statement_is_signed_with_a_counter_past_2_53(tmp_path: Path) -> None:
    """A statement's counter is at most 2**53 (`Statement`; JCS numbers): the template's
    %d (as orjson before it) wrote a larger one as is, a statement every gateway refuses
    as malformed. A counter file past it stops the start; at 2**53 one statement is
    signed, then none (before: 2**53 + 1 signed and logged)."""
    key = tmp_path / "sidecar.key"
    write_signing_key(key, "sidecar")
    settings = AttestSettings(backend="http://127.0.0.1:9", key_file=key, log_dir=tmp_path / "log")
    (tmp_path / "log").mkdir()
    counters = tmp_path / "log" / COUNTER_FILE
    commitment = "ab" * 32

    async def start(bound: int) -> tuple[AttestRelay, str | None]:
        counters.write_text(f"{bound}\n")
        relay = AttestRelay(settings)
        return relay, await relay.open()

    async def past() -> str | None:
        relay, error = await start(2**53 + 1)
        await relay.close()
        return error

    assert f"{counters} does not hold a counter" in str(asyncio.run(past()))

    async def at_the_last() -> list[int]:
        relay, error = await start(2**53)
        assert error is None
        try:
            first = open_countersignature(relay.notary.countersign(b"r", commitment, commitment))
            with pytest.raises(OSError, match="no statement counter left"):
                relay.notary.countersign(b"r", commitment, commitment)
        finally:
            await relay.close()
        return [first.statement.counter]

    assert asyncio.run(at_the_last()) == [2**53]
