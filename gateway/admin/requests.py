"""A request's records in the provenance log, each with its inclusion proof (auditor):
`GET /admin/v1/log/requests/{request_id}`.

Read from the log directory as an auditor would (`LogDirectory`): every record of the
request that the latest checkpoint covers, and for each a C2SP tlog-proof against that
checkpoint (the record itself as its extra line, the very bytes the record was read
from: one reading of the log, `LogDirectory.find_request_entries`), which `owngate audit` and any
tlog-proof client check offline. The id is looked up only in the form a record's
request_id has (receipt_payload.py `REQUEST_ID`); any other is not found. Finding a
request scans the log (no index is kept): in a worker thread, off the event loop, and one
scan at a time with the audit report's (report.py `scanning`; past its waiting bound, 429).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, Field

from gateway.admin.auth import Caller, require
from gateway.admin.report import scanning
from gateway.admin.tiles import log_dir, log_problem
from gateway.admin.work import in_thread
from gateway.errors import ErrorCode, GatewayError
from gateway.provenance import LogDirectory, ProvenanceError, TlogProof
from gateway.provenance.formats.merkle import inclusion_proof
from gateway.provenance.formats.receipt_payload import REQUEST_ID
from gateway.provenance.formats.tiles import TileReader

__all__ = ["ProvedRecord", "RequestRecords", "router"]

router = APIRouter(prefix="/admin/v1/log", tags=["auditor"])


class ProvedRecord(BaseModel):
    index: int
    type: str
    record: dict[str, Any]
    proof: str = Field(description="c2sp.org/tlog-proof@v1 against the checkpoint")


class RequestRecords(BaseModel):
    request_id: str
    size: int = Field(description="tree size of the checkpoint the proofs are against")
    records: list[ProvedRecord]


@router.get("/requests/{request_id}", summary="A request's records, each with its inclusion proof")
async def request_records(
    request_id: str, request: Request, caller: Annotated[Caller, Depends(require("auditor"))]
) -> RequestRecords:
    if not REQUEST_ID.match(request_id):  # the form a record's request_id has
        raise GatewayError(ErrorCode.not_found, "not a request id")
    async with scanning(request):  # one log scan at a time, as a report
        return await in_thread(request, caller, _records, log_dir(request), request_id)


def _records(directory: Path, request_id: str) -> RequestRecords:
    try:
        log = LogDirectory(directory)
        note = log.latest_note()
        size = int(note.split(b"\n")[1])
        # One reading: each record is proved from the very bytes it was parsed from, never
        # a second reading of its bundle (which the operator may swap in between).
        found = log.find_request_entries(request_id, size)
        reader = TileReader(log.path, size)
        proved = []
        for index, entry, record in found:
            hashes = tuple(inclusion_proof(index, size, reader.node))
            proof = TlogProof(index, hashes, note, extra=entry).format()
            proved.append(
                ProvedRecord(index=index, type=record.type, record=record.data, proof=proof)
            )
    except (ProvenanceError, ValueError, IndexError) as exc:
        raise GatewayError(
            ErrorCode.not_found, f"the log cannot be read: {log_problem(exc, directory)}"
        ) from exc
    if not proved:
        raise GatewayError(ErrorCode.not_found, f"no record of {request_id!r} in the log yet")
    return RequestRecords(request_id=request_id, size=size, records=proved)
