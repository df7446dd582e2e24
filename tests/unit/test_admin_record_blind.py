"""Every admin record holds `blind`, 32 random bytes of its own that no answer or receipt
gives (gateway/admin/control.py `act`).

An admin record is an entry of the same log as the tenants' requests, so it can be the
level-0 neighbour of a tenant's dispatch in the inclusion proof the tenant fetches
(`GET /v1/provenance/proofs/{id}`), and everything else in it is guessable by that tenant:
the action and subject (its own key revoked), the change digest (of its key's digest), a
time to the millisecond, the admin token's 48-bit digest prefix, and a request id, which
is an id and no secret. Without a blind the neighbour's leaf hash confirmed a guess of it:
when the tenant's key was revoked, and by which admin token."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

from gateway.admin.auth import Caller
from gateway.admin.control import AdminControl, act
from gateway.canonical import canonical_json
from gateway.provenance import parse_record
from gateway.provenance.formats.record_types import LogEntry


def _control(written: list[dict[str, object]]) -> AdminControl:
    """An admin control whose gateway's log keeps what is appended to it."""

    async def append(record: dict[str, object]) -> LogEntry:
        written.append(record)
        return LogEntry(len(written) - 1, bytes(32))

    recorder = SimpleNamespace(opened=True, log=SimpleNamespace(append=append))
    runtime = SimpleNamespace(parts=SimpleNamespace(recorder=recorder))

    async def reload() -> bool:
        return False

    return AdminControl(
        runtime=cast(Any, runtime),
        readiness=dict,
        reload=reload,
        drain=lambda: None,
        validate=lambda text: [],
    )


def test_every_admin_record_holds_a_blind_of_its_own() -> None:
    written: list[dict[str, object]] = []
    control = _control(written)
    caller = Caller(role="security", token="0123456789ab")
    change = {"tenant": "acme", "hash": "sha256:" + "ab" * 32}

    async def actions() -> None:
        for outcome in ({}, {"local": True}, {"failed": True}):
            await act(control, caller, "key_revoke", "acme", change, **outcome)
        await act(control, caller, "reload", "config", {"config": "c", "policy": "p"})

    asyncio.run(actions())
    assert len(written) == 4
    blinds = [record.get("blind") for record in written]
    assert all(isinstance(b, str) for b in blinds), f"an admin record without a blind: {blinds}"
    assert len(set(blinds)) == len(blinds), "two admin records share a blind"
    for record in written:
        parsed = parse_record(canonical_json(record))  # the closed schema takes it
        assert parsed.type == "admin"
        assert len(bytes.fromhex(parsed.data["blind"])) == 32
