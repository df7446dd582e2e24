"""The auditor's report of the live log (auditor): `GET /admin/v1/log/report?format=`.

What `owngate audit report URL --key VKEY --origin ORIGIN` writes for this gateway's log
served at `<admin URL>/log/`: the log verified with the log's own public keys, then its
figures, each with the command that reproduces it against that URL (`--json`: the
numbers; `html`: the self-contained file, as a download). Witness cosignatures are
`/admin/v1/log/cosignatures` (tlog-tiles does not serve `cosigned/`, so the report's
commands could not check them). Computed in a worker thread, one log scan at a time
(`scanning`: a report or a request lookup, requests.py): each reads the whole log.

The log is live: a checkpoint written while the report reads it (its history file first,
then the `checkpoint` file) can make one reading fail ("rollback", a changed entry).
`read_live` reads again, at most `ATTEMPTS` times in all, when a reading failed and the
log moved meanwhile (`log_state`: its checkpoint file or newest history entry changed),
as `owngate audit verify` does (`read_settled`); a failure on a log that did not move is
the report's answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, Depends, Query, Request, Response

from gateway.admin.auth import Caller, require
from gateway.admin.tiles import log_dir
from gateway.admin.work import in_thread
from gateway.api.runtime import Runtime
from gateway.errors import ErrorCode, GatewayError
from gateway.provenance.audit.reader import READINGS, log_state
from gateway.provenance.audit.report import Invocation, audit_report
from gateway.provenance.audit.report_html import render_html

__all__ = ["ATTEMPTS", "MAX_WAITING_REPORTS", "read_live", "router", "scanning"]

router = APIRouter(prefix="/admin/v1/log", tags=["auditor"])
_DOWNLOAD = 'attachment; filename="owngate-audit-report.html"'
ATTEMPTS = READINGS  # readings of a live log that moved while it was read, at most
# One log scan (a report, a request lookup) runs at a time (app.state.report_lock); this
# many may wait for it, and one more is told to retry: queued requests would hold memory
# and a worker each.
MAX_WAITING_REPORTS = 4


@contextlib.asynccontextmanager
async def scanning(request: Request) -> AsyncIterator[None]:
    """Hold the admin app's one log scan (429 `rate_limit_exceeded` when
    `MAX_WAITING_REPORTS` already wait for it): a scan reads the whole log in a worker
    thread, and several at once would take the GIL from the loop serving tenants."""
    state = request.app.state
    if state.report_waiting >= MAX_WAITING_REPORTS:
        raise GatewayError(
            ErrorCode.rate_limit_exceeded,
            f"{MAX_WAITING_REPORTS} log scans (audit reports, request lookups) are already "
            "waiting; retry when they are done",
        )
    lock: asyncio.Lock = state.report_lock
    state.report_waiting += 1
    try:
        await lock.acquire()
    finally:
        state.report_waiting -= 1
    try:
        yield
    finally:
        lock.release()


@router.get(
    "/report",
    response_class=Response,
    responses={
        200: {"content": {"application/json": {}, "text/html; charset=utf-8": {}}},
    },
    summary="The auditor's report of the live log (owngate audit report)",
)
async def report(
    request: Request,
    caller: Annotated[Caller, Depends(require("auditor"))],
    format: Annotated[Literal["json", "html"], Query()] = "json",
) -> Response:
    async with scanning(request):  # before anything else: past the bound, 429 at once
        return await _report(request, caller, format)


async def _report(request: Request, caller: Caller, format: str) -> Response:
    runtime: Runtime = request.app.state.control.runtime
    directory = log_dir(request)  # 404 without a log
    recorder = runtime.parts.recorder
    settings = runtime.config.provenance
    if recorder is None or not recorder.opened or settings is None:
        raise GatewayError(ErrorCode.provenance_unavailable, "the provenance log is not open")
    verifiers = recorder.verifiers
    flags = [arg for key in verifiers for arg in ("--key", key.vkey)]
    # After a key rotation the log's first checkpoints carry only a retired key the
    # gateway no longer loads: excused, as for an auditor holding only the current key
    # (their roots are still checked, and the current key covers every entry).
    flags += ["--origin", settings.origin, "--accept-earlier-keys"]
    run = Invocation(_served_at(request), tuple(flags))
    log = recorder.log

    async def reading() -> dict[str, Any]:
        await log.exports_idle()  # start between two checkpoints where one can
        scan = partial(
            audit_report,
            directory,
            verifiers,
            run,
            origin=settings.origin,
            accept_earlier_keys=True,
            now=time.time(),
        )
        found: dict[str, Any] = await in_thread(request, caller, scan)
        return found

    result = await read_live(reading, lambda: in_thread(request, caller, log_state, directory))
    if format == "html":
        html = await in_thread(request, caller, render_html, result)
        return Response(
            html,
            media_type="text/html; charset=utf-8",
            headers={"Content-Disposition": _DOWNLOAD},
        )
    return Response(orjson.dumps(result), media_type="application/json")


def _served_at(request: Request) -> str:
    """The URL the log is served under on this listener, from the socket's own address
    (never the client's Host header)."""
    host, port = request.scope.get("server") or ("127.0.0.1", 9090)
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{port}/log/"


async def read_live(
    reading: Callable[[], Awaitable[dict[str, Any]]],
    state: Callable[[], Awaitable[object]],
) -> dict[str, Any]:
    """`reading()`'s report; read again (`ATTEMPTS` in all) while it failed and `state()`
    moved during it."""
    for _ in range(ATTEMPTS - 1):
        before = await state()
        result = await reading()
        if result["verification"]["ok"] or await state() == before:
            return result
    return await reading()
