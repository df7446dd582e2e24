"""Verifying a request receipt against the live log (auditor):
`POST /admin/v1/receipts/verify`.

The receipt as the client got it (the DSSE envelope as a JSON object or its text, or
the base64 of the `x-owngate-receipt` header; at most `MAX_RECEIPT_BYTES`) is checked
as `owngate audit receipt verify --log` checks it: its signature by one of the log's
keys (`verify_receipt`: the current and previous signing keys and the
`retired_verifier_keys` of the config), then that the log's latest signed checkpoint
covers the record it names, with an inclusion proof (`check_receipt_in_log`), and that
the key that signed it was the log's key when its entry was written
(`check_receipt_key`: a key a rotation retired signs no receipt after its retirement).
First, as `owngate audit receipt verify` does (`check_receipt_log_key`, the one rule): a
receipt claiming a log whose key is among those keys must be signed by a key named for
that log, never only by another one the log also trusts (a key named for another log).
A forged or altered receipt, or one the log does not hold, is an answer (`valid: false`
and the problem), not an error. Runs in a worker thread: the proof reads tiles from disk.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field

from gateway.admin.auth import Caller, require
from gateway.admin.tiles import log_dir, log_problem
from gateway.admin.work import in_thread
from gateway.api.runtime import Runtime
from gateway.errors import ErrorCode, GatewayError
from gateway.provenance import (
    LogDirectory,
    MalformedError,
    ProvenanceError,
    Verifier,
    verify_receipt,
)
from gateway.provenance.audit.receipt import check_receipt_in_log
from gateway.provenance.audit.receipt_keys import check_receipt_key, check_receipt_log_key
from gateway.provenance.formats.dsse import loads_strict
from gateway.provenance.formats.receipts import MAX_RECEIPT_BYTES

__all__ = ["MAX_RECEIPT_BYTES", "router"]

router = APIRouter(prefix="/admin/v1", tags=["auditor"])


class ReceiptCheck(BaseModel):
    model_config = ConfigDict(extra="forbid")

    receipt: dict[str, Any] | str = Field(
        description="the receipt: its DSSE envelope (JSON object or text), or the base64 "
        "of the x-owngate-receipt header"
    )


class Inclusion(BaseModel):
    checked: bool = Field(description="the record was proved in the latest checkpoint")
    checkpoint_size: int | None
    root: str | None = Field(description="the checkpoint's root hash (base64)")


class ReceiptVerdict(BaseModel):
    valid: bool
    problems: list[str]
    request_id: str | None
    backend: str | None = Field(description="the backend that served it; null: refused")
    region: str | None = Field(description="that backend's region, as the log records it")
    policy: dict[str, Any] | None = Field(description="the policy the record names")
    log_index: int | None
    inclusion: Inclusion


@router.post("/receipts/verify", summary="Check a receipt's signature and its record in the log")
async def verify(
    body: ReceiptCheck, request: Request, caller: Annotated[Caller, Depends(require("auditor"))]
) -> ReceiptVerdict:
    envelope = _envelope(body.receipt)
    runtime: Runtime = request.app.state.control.runtime
    recorder = runtime.parts.recorder
    directory = log_dir(request)  # 404 without a log
    if recorder is None or not recorder.opened:
        raise GatewayError(ErrorCode.provenance_unavailable, "the provenance log is not open")
    if isinstance(body.receipt, dict):
        # FastAPI's parse kept the last of duplicated member names; verify_receipt refuses
        # them (parsers differ on which one wins), so the body as sent is read for them.
        try:
            loads_strict(await request.body(), "receipt")
        except MalformedError as exc:
            return ReceiptVerdict.model_validate(_refused(str(exc)))
    # the keys a rotation retired too: the receipts they signed before it still verify
    keys = [*recorder.verifiers, *recorder.retired_verifiers]
    verdict = await in_thread(request, caller, _check, envelope, LogDirectory(directory), keys)
    return ReceiptVerdict.model_validate(verdict)


def _envelope(receipt: dict[str, Any] | str) -> bytes:
    """The envelope's bytes, at most MAX_RECEIPT_BYTES; a header's base64 decoded."""
    # json, not orjson: a client's object may hold what orjson refuses (integers past 64 bits);
    # a lone surrogate is kept (surrogatepass) for verify_receipt to refuse as not UTF-8
    data = (
        json.dumps(receipt).encode()
        if isinstance(receipt, dict)
        else receipt.strip().encode("utf-8", "surrogatepass")
    )
    if len(data) > MAX_RECEIPT_BYTES:
        raise GatewayError(
            ErrorCode.invalid_request,
            f"the receipt is over {MAX_RECEIPT_BYTES} bytes",
            param="receipt",
        )
    if isinstance(receipt, str) and not data.startswith(b"{"):
        try:
            return base64.b64decode(data, validate=True)
        except binascii.Error:
            pass  # neither JSON nor base64: verify_receipt names the problem
    return data


_UNCHECKED = {"checked": False, "checkpoint_size": None, "root": None}


def _refused(problem: str) -> dict[str, Any]:
    """The verdict on a receipt that is not one the log's keys signed."""
    return {
        "valid": False,
        "problems": [problem],
        "request_id": None,
        "backend": None,
        "region": None,
        "policy": None,
        "log_index": None,
        "inclusion": _UNCHECKED,
    }


def _check(envelope: bytes, log: LogDirectory, verifiers: list[Verifier]) -> dict[str, Any]:
    try:
        receipt = verify_receipt(envelope, verifiers)
    except ProvenanceError as exc:
        return _refused(str(exc))
    verdict: dict[str, Any] = {
        "valid": False,
        "problems": [],
        "request_id": receipt.request_id,
        "backend": receipt.backend or None,
        "region": None,
        "policy": {"digest": receipt.policy_digest},
        "log_index": receipt.index,
        "inclusion": _UNCHECKED,
    }
    try:  # the CLI's rule: a receipt of a log whose key is given is signed by that key
        check_receipt_log_key(envelope, receipt, verifiers)
    except ProvenanceError as exc:
        verdict["problems"] = [str(exc)]
        return verdict
    try:
        proved = check_receipt_in_log(log, receipt, verifiers)
    except (ProvenanceError, OSError, ValueError, IndexError) as exc:
        verdict["problems"] = [f"the log does not hold it: {log_problem(exc, log.path)}"]
        return verdict
    try:
        check_receipt_key(log, envelope, receipt, verifiers)
    except (ProvenanceError, OSError) as exc:
        verdict["problems"] = [f"not signed by the log's key for its entry: {exc}"]
        return verdict
    record = orjson.loads(proved.entry)  # the log's own record, proved: trusted from here
    backend = record.get("backend") if isinstance(record.get("backend"), dict) else {}
    verdict.update(
        valid=True,
        region=backend.get("region"),
        policy=record.get("policy") or verdict["policy"],
        inclusion={
            "checked": True,
            "checkpoint_size": proved.size,
            "root": base64.b64encode(proved.root).decode(),
        },
    )
    return verdict
