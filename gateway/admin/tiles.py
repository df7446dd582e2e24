"""The provenance log over HTTP, exactly as C2SP tlog-tiles lays it out (auditor role):
`GET /log/checkpoint`, `/log/tile/<L>/<N>[.p/<W>]` and `/log/tile/entries/<N>[.p/<W>]`,
served from the log directory, so a tlog-tiles client (or `owngate audit verify URL`)
audits a live replica without file access.

Paths are parsed strictly before any file is touched: the level is 0..63, the index is
in its canonical `x000/…/000` form of at most 7 groups (every uint64 index; a longer
one would cost a conversion of thousands of digits, which Python refuses past 4300),
a partial width is 1..255; anything else is 404, so
no request names a file outside the tile tree. Full tiles and bundles never change once
written (`Cache-Control: private, immutable`: the auditor's client may keep them, a
shared cache may not); partial ones and the checkpoint do.

A file is read as an auditor reads a log file (`read_log_file`: a regular file, bounded by
what its kind holds), and never through a symbolic link: the gateway writes none, and one
planted in the log directory (by whoever may write there) would serve the file it names
(the signing key) to any auditor token. A FIFO, a device, a link or an oversized file is
503 `provenance_unavailable` naming it, at once; before, `read_bytes()` on a FIFO held a
thread waiting for a writer for good, and `/dev/zero` was read until memory ran out.

Each read runs in the admin API's log-read threads (`app.state.log_reads`, an `AdminWork`
of `LOG_READS`, gateway/admin/work.py): at most 8 files read at once, 4 of them one admin
token's; past either, a read waits its turn in a short line, fair across tokens
(gateway/admin/read_line.py), and is 429 `rate_limit_exceeded` with `retry-after: 1`
only past that. These were sync routes, run in anyio's default 40 threads without a
bound: one auditor token could hold every one of them (up to 40 bundles of 16 MiB read
at once) and leave other auditors, and whatever else of the gateway runs in anyio's
threads, waiting. An entry bundle longer than one chunk is streamed from the open file
as its client takes it (gateway/admin/log_stream.py), never held whole for a slow reader.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response

from gateway.admin.auth import Caller, require
from gateway.admin.log_stream import CHUNK, OpenLogFile, StreamedLogFile, open_streamed
from gateway.admin.work import AdminWork
from gateway.api.runtime import Runtime
from gateway.errors import ErrorCode, GatewayError
from gateway.provenance.errors import MalformedError
from gateway.provenance.formats.layout import CHECKPOINT, MAX_NOTE_FILE, read_log_file
from gateway.provenance.formats.tiles import (
    TILE_WIDTH,
    entries_path,
    file_limit,
    index_path,
    tile_path,
)

__all__ = ["log_dir", "log_problem", "parse_tile_path", "router"]

router = APIRouter(prefix="/log", tags=["log"])

_TILE = re.compile(
    r"tile/(entries|[0-9]|[1-5][0-9]|6[0-3])/((?:x[0-9]{3}/){0,6}[0-9]{3})(?:\.p/([0-9]{1,3}))?"
)
# `private`: only the auditor's own client may keep a tile. `public` let a shared cache
# (a caching proxy in front of the listener) store a tile fetched with a token and
# serve it to a later request without one (RFC 9111 3.5).
_IMMUTABLE = "private, max-age=31536000, immutable"
_CHANGING = "no-cache"
_OCTETS = "application/octet-stream"
_Auditor = Annotated[Caller, Depends(require("auditor"))]


def parse_tile_path(path: str) -> tuple[str, bool] | None:
    """The canonical relative file name of a tlog-tiles tile or bundle path and whether
    it is a full one, or None when `path` is not exactly such a path."""
    found = _TILE.fullmatch(path)
    if found is None:
        return None
    level, digits, width_text = found.groups()
    index = int(digits.replace("x", "").replace("/", ""))
    if index_path(index) != digits:
        return None  # not canonical (e.g. a needless x000/ group)
    width = TILE_WIDTH
    if width_text is not None:
        width = int(width_text)
        if not 0 < width < TILE_WIDTH or width_text != str(width):
            return None
    name = entries_path(index, width) if level == "entries" else tile_path(int(level), index, width)
    return name, width == TILE_WIDTH


def log_dir(request: Request) -> Path:
    runtime: Runtime = request.app.state.control.runtime
    settings = runtime.config.provenance
    if settings is None:
        raise GatewayError(ErrorCode.not_found, "this gateway keeps no provenance log")
    return runtime.config_dir / settings.dir


def log_problem(error: Exception, directory: Path) -> str:
    """Why reading the log at `directory` failed, as an admin client is told it: the
    error's text with the directory's path on this host written as `log` (a reader's
    error names its files: the gateway's layout is not the client's business)."""
    return str(error).replace(str(directory), "log")


async def _read(
    request: Request, caller: Caller, name: str, what: str, limit: int
) -> bytes | OpenLogFile:
    """The log file `name` (`_file`), read in one of the admin's log-read threads for
    `caller` (429 when none comes free in time); a file that may be longer than a chunk
    is opened for streaming instead, its first chunk read."""
    directory = log_dir(request)
    reads: AdminWork = request.app.state.log_reads
    return await reads.run(caller.token, _file, directory, name, what, limit)


def _file(directory: Path, name: str, what: str, limit: int) -> bytes | OpenLogFile:
    try:
        if limit > CHUNK:  # an entry bundle, the checkpoint: may be longer than a chunk
            return open_streamed(directory / name, limit)
        return read_log_file(directory / name, limit, follow=False)
    except (FileNotFoundError, NotADirectoryError):
        raise GatewayError(ErrorCode.not_found, f"no {what} in the log") from None
    except MalformedError as exc:  # not a regular file, or larger than its kind holds
        raise GatewayError(ErrorCode.provenance_unavailable, log_problem(exc, directory)) from None


@router.get(
    "/checkpoint",
    response_class=Response,
    responses={200: {"content": {"text/plain; charset=utf-8": {}}}},
    summary="The latest signed checkpoint (a signed note)",
)
async def checkpoint(request: Request, caller: _Auditor) -> Response:
    data = await _read(request, caller, CHECKPOINT, "checkpoint yet", MAX_NOTE_FILE)
    return _answer(request, data, "text/plain; charset=utf-8", {"Cache-Control": _CHANGING})


@router.get(
    "/tile/{path:path}",
    response_class=Response,
    responses={200: {"content": {_OCTETS: {}}}, 404: {"description": "no such tile"}},
    summary="A Merkle tile or an entry bundle (tlog-tiles)",
)
async def tile(path: str, request: Request, caller: _Auditor) -> Response:
    parsed = parse_tile_path(f"tile/{path}")
    if parsed is None:
        raise GatewayError(ErrorCode.not_found, "not a tlog-tiles tile path")
    name, full = parsed
    data = await _read(request, caller, name, f"tile {name}", file_limit(name))
    return _answer(request, data, _OCTETS, {"Cache-Control": _IMMUTABLE if full else _CHANGING})


def _answer(
    request: Request, data: bytes | OpenLogFile, media_type: str, headers: dict[str, str]
) -> Response:
    if isinstance(data, OpenLogFile):
        return StreamedLogFile(data, request.app.state.log_reads, media_type, headers)
    return Response(data, media_type=media_type, headers=headers)
