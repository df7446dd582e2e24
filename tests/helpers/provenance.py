"""Reading a provenance log back in tests, the auditor CLI in-process, and a failing disk."""

from __future__ import annotations

import argparse
import base64
import contextlib
import errno
import io
import os
import socket
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import orjson

from gateway.cli import audit
from gateway.provenance import LogDirectory
from gateway.provenance.formats.tiles import TILE_WIDTH
from tests.helpers.waiting import until

__all__ = [
    "FailingDisk",
    "batch_receipts",
    "completion_record",
    "log_bytes",
    "records",
    "request_records",
    "run_audit",
]


def batch_receipts(
    send: Callable[[], httpx.Response], *, concurrency: int = 16, rounds: int = 10
) -> list[tuple[httpx.Response, bytes]]:
    """Answers with their batch (v2) receipts: requests sent `concurrency` at a time, so
    that their dispatch records share committed batches (a receipt alone in its batch is
    v1), until a round yields some; at most `rounds` rounds."""
    with ThreadPoolExecutor(concurrency) as pool:
        for _ in range(rounds):
            answers = list(pool.map(lambda _: send(), range(concurrency)))
            found = []
            for answer in answers:
                assert answer.status_code == 200, answer.text
                envelope = base64.b64decode(answer.headers["x-owngate-receipt"])
                if orjson.loads(envelope).get("batch") is not None:
                    found.append((answer, envelope))
            if found:
                return found
    raise AssertionError(f"no batch receipt in {rounds} rounds of {concurrency} requests")


def run_audit(argv: list[str]) -> int:
    """`owngate audit ARGV...` in this process; its exit code."""
    parser = argparse.ArgumentParser(prog="owngate")
    audit.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["audit", *argv])
    result: int = args.handler(args)
    return result


def run_audit_output(argv: list[str]) -> tuple[int, str]:
    """`run_audit`, with what it printed (stdout and stderr), for a failure's message."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        code = run_audit(argv)
    return code, printed.getvalue()


def records(log_dir: Path) -> list[dict[str, Any]]:
    """Every record the latest signed checkpoint covers (none before the first)."""
    directory = LogDirectory(log_dir)
    note = directory.latest_note()
    total = int(note.decode().split("\n")[1]) if note else 0
    bundles = (total + TILE_WIDTH - 1) // TILE_WIDTH  # a bundle holds TILE_WIDTH entries
    return [orjson.loads(e) for b in range(bundles) for e in directory.bundle(b, total)]


def request_records(
    log_dir: Path, request_id: str, type: str | None = None, within_s: float = 20.0
) -> list[dict[str, Any]]:
    """The records of `request_id` (of `type`, if given), once a signed checkpoint covers
    at least one of them; fails the test when none is covered `within_s`."""
    found: list[dict[str, Any]] = []

    def covered() -> bool:
        found[:] = [
            record
            for record in records(log_dir)
            if record["request_id"] == request_id and type in (None, record["type"])
        ]
        return bool(found)

    until(covered, f"a signed {type or ''} record of {request_id}", timeout=within_s, interval=0.02)
    return found


def completion_record(log_dir: Path, request_id: str) -> dict[str, Any]:
    """The completion record of `request_id`, once a checkpoint covers it."""
    return request_records(log_dir, request_id, "completion")[0]


def assert_never_logged(log_dir: Path, request_id: str, later_id: str) -> None:
    """`request_id` has no record in the log once a checkpoint covers the completion of
    `later_id`, a request sent after it and served."""
    completion_record(log_dir, later_id)
    assert request_id not in {record["request_id"] for record in records(log_dir)}


def log_bytes(log_dir: Path) -> bytes:
    """Every byte of every file of the log, in path order."""
    return b"".join(p.read_bytes() for p in sorted(log_dir.rglob("*")) if p.is_file())


class FailingDisk:
    """`os` for the write-ahead segment: writes land but fail (EIO) while `failing`."""

    def __init__(self) -> None:
        self.failing = False

    def __getattr__(self, name: str) -> object:
        return getattr(os, name)

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        written = os.pwrite(fd, data, offset)
        if self.failing:
            raise OSError(errno.EIO, "Input/output error")
        return written


class Held:
    """Wraps a store method run on a log thread: while `hung` it blocks until `release`
    (bounded: 60 s), a hung disk under a snapshot or a checkpoint export."""

    def __init__(self, method: Any) -> None:
        self.method = method
        self.hung = True
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self, *args: Any) -> Any:
        if self.hung:
            self.entered.set()
            self.release.wait(60)
        return self.method(*args)


def socket_in_place(path: Path) -> None:
    """Replace the file at `path` with a UNIX socket file (bound at a short path, then
    moved: a bind takes at most 107 bytes of path, a test's tmp path can be longer)."""
    path.unlink()
    with tempfile.TemporaryDirectory(dir="/tmp") as short:
        with socket.socket(socket.AF_UNIX) as bound:
            bound.bind(f"{short}/s")
        os.rename(f"{short}/s", path)
