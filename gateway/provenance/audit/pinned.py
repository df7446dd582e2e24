"""Backend key pins (issue 15, layer 1): every dispatch record a log says went to a pinned
backend names, in `backend.peer.spki_sha256`, one of the keys its owner publishes.

Run after `verify_log` (the records are then known to be the signed log's). For each
dispatch record of the first `size` entries whose backend id is one of `pins`, the key
the backend presented on the connection that carried the request must be one of that
id's pins (several, across a rotation). A record of a pinned backend that names no key
(sent over plain HTTP, or written before the backend had `tls:`) fails as well: it says
nothing about who answered, unless its completion says the attempt sent nothing: the
connection to the backend was refused, its certificate was (the protection working), or
the gateway had no room to open one (`_NOTHING_SENT`). Records of the other backends are
not looked at.

What it proves: the gateway recorded, for each of those requests, a TLS connection whose
certificate held one of the owner's keys. Against a gateway that writes false records it
proves nothing (the two-party statements of `owngate attest` do: `attested.py`).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gateway.provenance.audit.reader import LogDirectory
from gateway.provenance.errors import LogVerificationError
from gateway.provenance.formats.record_checks import SPKI_PIN
from gateway.provenance.formats.records import Record

__all__ = ["PinnedSummary", "check_pinned", "check_pins", "is_spki_pin", "sent_nothing"]


def is_spki_pin(text: str) -> bool:
    """Whether `text` is a key pin as `tls.pin_spki_sha256` takes it: `sha256//` and the
    standard, canonical base64 of 32 bytes (as `curl --pinnedpubkey` writes it)."""
    if not SPKI_PIN.match(text):
        return False
    try:
        digest = base64.b64decode(text[8:], validate=True)
    except binascii.Error:
        return False
    return base64.b64encode(digest).decode("ascii") == text[8:]


# The failures of a private backend's attempt before any of the request was written (the
# completion's `error` is "<backend id>: <kind>"): gateway/api/private_failures.py
# `NOT_SENT`, which tests/unit/test_pinned_unsent.py holds this to.
_NOTHING_SENT = frozenset({"connect", "tls", "busy", "exhausted", "retired"})


@dataclass(slots=True)
class PinnedSummary:
    """Backend id -> the dispatch records naming it, each over one of its pinned keys;
    and the attempts that sent nothing (no connection: refused, or its certificate was)."""

    dispatches: dict[str, int] = field(default_factory=dict)
    unsent: dict[str, int] = field(default_factory=dict)


def check_pins(
    directory: str | Path, size: int, pins: Mapping[str, frozenset[str]], *, root: bytes
) -> PinnedSummary:
    """Check the dispatch records of a log `verify_log` found of `size` entries with
    `root` against `pins` (backend id -> the keys it may present); raises
    LogVerificationError naming the first record that names no key, or another key, with
    the key it carries and the pins, or when the records read here no longer hash to
    `root` (`LogDirectory.verified_records`). A record naming no key passes only when its
    completion says nothing was sent."""
    summary = PinnedSummary({backend: 0 for backend in pins}, {backend: 0 for backend in pins})
    keyless: dict[int, Record] = {}  # dispatch index -> a pinned backend's record naming none
    for index, record in LogDirectory(directory).verified_records(size, root):
        if record.type == "completion":
            dispatch = keyless.pop(record.data["dispatch"]["index"], None)
            if dispatch is None:
                continue
            backend = dispatch.data["backend"]["id"]
            if not sent_nothing(record.data, backend):
                check_pinned(dispatch, record.data["dispatch"]["index"], pins)  # raises
            summary.unsent[backend] += 1
            continue
        backend_of = record.data.get("backend") if record.type == "dispatch" else None
        if isinstance(backend_of, dict) and backend_of["id"] in pins and not backend_of.get("peer"):
            keyless[index] = record  # judged by its completion
            continue
        backend = check_pinned(record, index, pins)
        if backend is not None:
            summary.dispatches[backend] += 1
    for index in sorted(keyless)[:1]:  # no completion (yet): nothing says it sent nothing
        check_pinned(keyless[index], index, pins)  # raises
    return summary


def sent_nothing(completion: Mapping[str, object], backend: str) -> bool:
    """Whether a completion says its attempt on `backend` failed before a byte of the
    request was written: no answer, an error status (the attempt's error, which the client
    got if no other attempt served), and one of the failures that come before writing. A
    completion saying both that nothing was sent and that its attempt answered (a status
    below 400) contradicts itself, and is not taken for an attempt that sent nothing."""
    error, status = completion.get("error"), completion.get("status")
    if completion.get("response_commitment") is not None or not isinstance(error, str):
        return False
    if type(status) is not int or status < 400:
        return False
    name, _, kind = error.rpartition(": ")
    return name == backend and kind in _NOTHING_SENT


def check_pinned(record: Record, index: int, pins: Mapping[str, frozenset[str]]) -> str | None:
    """The backend id of the dispatch `record` (entry `index`) when `pins` has pins for
    it and the key it names is one of them; None for a record of another type or
    backend; LogVerificationError when it names no key, or another key."""
    if record.type != "dispatch":
        return None
    backend = record.data["backend"]
    allowed = pins.get(backend["id"])
    if allowed is None:
        return None
    who = f"request {record.request_id!r} (backend {backend['id']})"
    listed = ", ".join(sorted(allowed))
    peer = backend.get("peer")
    if peer is None:
        raise LogVerificationError(
            f"{who}: the record carries no backend.peer, so no key: the request went "
            "over a connection that named none (plain HTTP, or a record written before "
            f"the backend had tls:), not one presenting a pinned key ({listed})",
            index=index,
        )
    key = peer["spki_sha256"]
    if key not in allowed:
        raise LogVerificationError(
            f"{who}: the backend presented key {key} on the connection that carried "
            f"it, not one of its pins ({listed})",
            index=index,
        )
    return str(backend["id"])
