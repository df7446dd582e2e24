"""A log entry must be its record's own RFC 8785 encoding (docs/provenance.md, "Records"):
an entry with a member written twice reads differently to different JSON parsers (owngate's
keeps the last, others the first or refuse), so the log's key holder could show owngate's
audit one backend and an independent verifier another. `audit verify` refuses any entry
that is not canonical, as an independent verifier written from the docs does."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import pytest

import gateway.provenance.formats.record_parser as record_parser  # its parser, replaced
import gateway.provenance.writer.queued as writer  # where a record is encoded
from gateway.canonical import canonical_json_of_plain
from gateway.cli.main import main
from gateway.provenance import ProvenanceLog, RecordError, parse_record
from gateway.provenance.testing import EXAMPLE_HOSTED, log_request, seeded_signer

SIGNER = seeded_signer("example.com/log")
HOSTED = canonical_json_of_plain({"id": EXAMPLE_HOSTED.id, "tier": "hosted"})


def _twice(entry: bytes) -> bytes:  # the hosted backend first, the private one last
    return entry.replace(b'{"backend":', b'{"backend":' + HOSTED + b',"backend":', 1)


def _spaced(entry: bytes) -> bytes:
    return json.dumps(json.loads(entry), sort_keys=True).encode()


def _reordered(entry: bytes) -> bytes:
    value = json.loads(entry)
    return json.dumps(dict(reversed(value.items())), separators=(",", ":")).encode()


def _escaped(entry: bytes) -> bytes:
    return entry.replace(b'"dispatch"', b'"\\u0064ispatch"', 1)


FORGERIES: dict[str, Callable[[bytes], bytes]] = {
    "member-twice": _twice,
    "whitespace": _spaced,
    "member-order": _reordered,
    "escape": _escaped,
}


def _log(path: Path, monkeypatch: pytest.MonkeyPatch, forge: Callable[[bytes], bytes]) -> None:
    """A log whose dispatch record the key holder wrote as `forge` makes it."""

    def encode(record: object) -> bytes:
        entry = canonical_json_of_plain(record)
        is_dispatch = isinstance(record, dict) and record.get("type") == "dispatch"
        return forge(entry) if is_dispatch else entry

    monkeypatch.setattr(writer, "canonical_json_of_plain", encode)

    async def write() -> None:
        log = await ProvenanceLog.open(path, SIGNER.name, SIGNER)
        await log_request(log, 1)
        await log.close()

    asyncio.run(write())


@pytest.mark.parametrize("forge", FORGERIES.values(), ids=FORGERIES.keys())
def test_audit_verify_refuses_an_entry_that_is_not_canonical(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    forge: Callable[[bytes], bytes],
) -> None:
    _log(tmp_path / "log", monkeypatch, forge)
    assert main(["audit", "verify", str(tmp_path / "log"), "--key", SIGNER.vkey]) == 1
    err = capsys.readouterr().err
    assert "entry 0: not a valid schema-v1 record" in err
    assert "not its record's RFC 8785 canonical encoding" in err


def test_a_canonical_log_still_verifies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _log(tmp_path / "log", monkeypatch, lambda entry: entry)
    assert main(["audit", "verify", str(tmp_path / "log"), "--key", SIGNER.vkey]) == 0
    assert "ok: example.com/log: 2 entries" in capsys.readouterr().out


ADMIN = {
    "v": 1,
    "type": "admin",
    "request_id": "adm_1",
    "time": "2026-01-01T00:00:00.000Z",
    "role": "auditor",
    "token": "loopback",
    "action": "drain",
    "subject": "gateway",
    "change_digest": "ab" * 32,
}
ENTRY = canonical_json_of_plain(ADMIN)
NOT_CANONICAL = {
    "member-twice": ENTRY.replace(b'{"action":', b'{"action":"reload","action":', 1),
    "whitespace": _spaced(ENTRY),
    "member-order": _reordered(ENTRY),
    "escape": ENTRY.replace(b'"drain"', b'"dr\\u0061in"', 1),
}


def test_parse_record_takes_the_canonical_entry() -> None:
    assert parse_record(ENTRY).data == ADMIN


@pytest.mark.parametrize("entry", NOT_CANONICAL.values(), ids=NOT_CANONICAL.keys())
def test_parse_record_refuses_what_is_not_canonical(entry: bytes) -> None:
    assert json.loads(entry) == ADMIN  # the same record to this (last-wins) parser
    with pytest.raises(RecordError, match="canonical"):
        parse_record(entry)


@pytest.mark.parametrize("entry", [b"[" * 50_000, b"1" * 5_000, b'{"a":' * 20_000])
def test_parse_record_refuses_what_the_stdlib_parser_cannot_read(
    entry: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An auditor's install without orjson parses with json.loads, which raises
    # RecursionError for deep nesting and a plain ValueError past 4,300 digits: neither
    # may escape as a crash (exit 2 or a traceback) instead of a failed record check.
    monkeypatch.setattr(record_parser, "_loads", json.loads)
    with pytest.raises(RecordError, match="entry is not JSON"):
        parse_record(entry)
