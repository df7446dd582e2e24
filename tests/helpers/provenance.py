"""Reading a provenance log back in tests, the auditor CLI in-process, and a failing disk."""

from __future__ import annotations

import argparse
import errno
import os
from pathlib import Path
from typing import Any

import orjson

from gateway.cli import audit
from gateway.provenance import LogDirectory
from tests.helpers.waiting import until

__all__ = [
    "FailingDisk",
    "completion_record",
    "log_bytes",
    "records",
    "request_records",
    "run_audit",
]


def run_audit(argv: list[str]) -> int:
    """`owngate audit ARGV...` in this process; its exit code."""
    parser = argparse.ArgumentParser(prog="owngate")
    audit.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["audit", *argv])
    result: int = args.handler(args)
    return result


def records(log_dir: Path) -> list[dict[str, Any]]:
    """Every record the latest signed checkpoint covers (none before the first)."""
    directory = LogDirectory(log_dir)
    note = directory.latest_note()
    total = int(note.decode().split("\n")[1]) if note else 0
    return [orjson.loads(entry) for entry in directory.bundle(0, total)] if total else []


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
