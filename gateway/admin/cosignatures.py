"""Witness cosignatures of the log's latest checkpoint (auditor):
`GET /admin/v1/log/cosignatures`.

For each configured witness (`provenance.witnesses`): the newest size it cosigned for
this gateway (what the cosigning reports, else the newest file in `cosigned/`), its
cosignature line there checked against its key (`valid`), the line's timestamp, and how
many entries it lags behind the latest checkpoint. `coverage` is the share of the latest
checkpoint every witness has cosigned (the laggard's size over the checkpoint's). Reads
at most one `cosigned/` file per witness, in a worker thread, and scans `cosigned/` for the
newest name without keeping a listing (it grows with the log's age). Both files are read
as `read_log_file` reads a log file, links not followed (gateway/admin/tiles.py says
why): a FIFO or a device there answers at once (the checkpoint: 503 naming it; a
`cosigned/` file: that witness's cosignature not valid) instead of holding the thread
for good, as `read_bytes()` did.
"""

from __future__ import annotations

import base64
import time
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, Field

from gateway.admin.auth import Caller, require
from gateway.admin.tiles import log_dir, log_problem
from gateway.admin.work import in_thread
from gateway.api.runtime import Runtime
from gateway.errors import ErrorCode, GatewayError
from gateway.provenance import ProvenanceError, Verifier, open_checkpoint
from gateway.provenance.formats.cosignature import CosignatureVerifier, find_cosignature
from gateway.provenance.formats.layout import (
    CHECKPOINT,
    cosigned_path,
    newest_cosigned,
    read_log_file,
)

__all__ = ["router"]

router = APIRouter(prefix="/admin/v1/log", tags=["auditor"])


class LatestCheckpoint(BaseModel):
    size: int
    root: str = Field(description="root hash, base64 (as in the checkpoint's text)")
    text: str = Field(description="the signed checkpoint note")


class WitnessCosignature(BaseModel):
    name: str
    key_id: str = Field(description="8 hex digits")
    cosigned_size: int | None = Field(description="the newest size it cosigned")
    timestamp: int | None = Field(description="its cosignature's time (POSIX seconds)")
    lag: int | None = Field(description="entries the latest checkpoint has beyond it")
    valid: bool = Field(description="its cosignature line on that checkpoint verifies")


class Cosignatures(BaseModel):
    checkpoint: LatestCheckpoint | None
    witnesses: list[WitnessCosignature]
    coverage: float | None = Field(
        description="the smallest cosigned size over the checkpoint's size (null: no witnesses)"
    )


@router.get("/cosignatures", summary="Witness cosignatures of the latest checkpoint")
async def cosignatures(
    request: Request, caller: Annotated[Caller, Depends(require("auditor"))]
) -> Cosignatures:
    runtime: Runtime = request.app.state.control.runtime
    directory = log_dir(request)  # 404 without a log
    recorder = runtime.parts.recorder
    if recorder is None or not recorder.opened:
        raise GatewayError(ErrorCode.provenance_unavailable, "the provenance log is not open")
    settings = runtime.config.provenance
    keys = [w.vkey for w in settings.witnesses] if settings is not None else []
    reported: dict[str, int | None] = {}
    if runtime.cosigning is not None:
        reported = {w.name: w.cosigned_size for w in runtime.cosigning.witnesses}
    found = await in_thread(request, caller, _read, directory, recorder.verifiers, keys, reported)
    return Cosignatures.model_validate(found)


def _read(
    directory: Path, verifiers: list[Verifier], keys: list[str], reported: dict[str, int | None]
) -> dict[str, Any]:
    checkpoint: dict[str, Any] | None = None
    try:
        note = read_log_file(directory / CHECKPOINT, follow=False)
    except FileNotFoundError:
        pass  # nothing logged yet
    except ProvenanceError as exc:  # not a regular file, or too large
        raise GatewayError(ErrorCode.provenance_unavailable, log_problem(exc, directory)) from None
    else:
        signed = open_checkpoint(note, verifiers)
        checkpoint = {
            "size": signed.checkpoint.size,
            "root": base64.b64encode(signed.checkpoint.root).decode(),
            "text": signed.note.decode(),
        }
    newest = newest_cosigned(directory)  # the folder grows with the log's age: none kept
    witnesses = []
    for key in keys:
        verifier = CosignatureVerifier(key)
        size = reported.get(str(verifier))
        if size is None and newest is not None:
            size = newest[0]
        witnesses.append(_witness(directory, verifier, size, checkpoint))
    coverage = None
    if witnesses and checkpoint is not None and checkpoint["size"]:
        sizes: list[int] = [w["cosigned_size"] or 0 for w in witnesses]
        coverage = min(min(sizes), checkpoint["size"]) / checkpoint["size"]
    return {"checkpoint": checkpoint, "witnesses": witnesses, "coverage": coverage}


def _witness(
    directory: Path,
    verifier: CosignatureVerifier,
    size: int | None,
    checkpoint: dict[str, Any] | None,
) -> dict[str, Any]:
    cosignature = None
    if size is not None:
        try:
            note = read_log_file(cosigned_path(directory, size), follow=False)
            cosignature = find_cosignature(note, verifier, now=time.time())
        except (OSError, ProvenanceError):
            cosignature = None
    valid = cosignature is not None
    cosigned = size if valid else None
    return {
        "name": verifier.name,
        "key_id": f"{verifier.key_id:08x}",
        "cosigned_size": cosigned,
        "timestamp": None if cosignature is None else cosignature.timestamp,
        "lag": None if cosigned is None or checkpoint is None else checkpoint["size"] - cosigned,
        "valid": valid,
    }
