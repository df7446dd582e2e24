"""Shared by the log-truth tests (tests/integration/test_log_truth*.py): a stream request,
a backend event, and reading receipts, records and events back from what a client got."""

from __future__ import annotations

import asyncio
import base64
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway.provenance import write_signing_key
from tests.helpers.gateways import (
    HOSTED_ONLY_POLICY,
    Gateway,
    hosted_backend,
)
from tests.helpers.provenance import records
from tests.helpers.raw_backend import Answer, Post, sse_head
from tests.helpers.waiting import until

__all__ = [
    "CHAT",
    "DONE",
    "EVENT",
    "ORIGIN",
    "first_attempt_fails",
    "hosted_gateway",
    "records_when_one",
    "salt_of",
    "sse_events",
    "stream_receipt",
]

ORIGIN = "test.owngate/log-truth"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
EVENT = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
DONE = b"data: [DONE]\n\n"


def salt_of(receipt: bytes) -> tuple[str, bytes]:
    """The request id and response salt a receipt carries."""
    payload = json.loads(base64.b64decode(json.loads(receipt)["payload"]))
    return payload["request_id"], bytes.fromhex(payload["salts"]["response"])


def stream_receipt(body: bytes) -> bytes:
    line = body.rsplit(b"\n: owngate-receipt ", 1)[1]
    return base64.b64decode(line.removesuffix(b"\n\n"))


def records_when_one(log: Path) -> list[dict[str, Any]]:
    """The log's records once a checkpoint covers a completion."""
    until(lambda: any(r["type"] == "completion" for r in records(log)), "a completion")
    return records(log)


def hosted_gateway(
    start_gateway: Callable[..., Gateway], tmp_path: Path, url: str, model: str, **extra: Any
) -> Gateway:
    return logged_hosted_gateway(
        start_gateway,
        tmp_path,
        hosted_backend("hosted", url, model),
        environ={"HOSTED_KEY": "sk-test"},
        **extra,
    )


def logged_hosted_gateway(
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    backend: dict[str, Any],
    environ: dict[str, str],
    origin: str = ORIGIN,
    **extra: Any,
) -> Gateway:
    """A gateway whose policy allows `backend` (hosted) alone, its provenance log under
    `tmp_path / "log"` (origin `origin`), checkpointing every 20 ms."""
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "hosted.yaml").write_text(HOSTED_ONLY_POLICY)
    write_signing_key(tmp_path / "log.key", origin)
    return start_gateway(
        [backend],
        environ=environ,
        policy={"paths": [str(tmp_path / "policies")]},
        provenance={
            "dir": str(tmp_path / "log"),
            "origin": origin,
            "signing_key_file": str(tmp_path / "log.key"),
            "checkpoint_interval_ms": 20,
        },
        **extra,
    )


def sse_events(body: bytes) -> list[bytes]:
    """The events an SSE parser dispatches (their lines joined), comments left out: lines
    end in CRLF, LF or CR, and a blank line ends an event."""
    events: list[bytes] = []
    lines: list[bytes] = []
    for line in re.split(rb"\r\n|\r|\n", body):
        if not line and lines:
            events.append(b"\n".join(lines))
            lines = []
        elif line and not line.startswith(b":"):
            lines.append(line)
    return events


def first_attempt_fails() -> Answer:
    """A raw backend's answer for a failover: the first request any backend given this
    answer gets is a 503, every later one a stream of EVENT and DONE."""
    posts: list[int] = []

    async def answer(writer: asyncio.StreamWriter, _post: Post) -> bool:
        posts.append(1)
        if len(posts) == 1:
            writer.write(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n")
        else:
            writer.write(sse_head() + EVENT + DONE)
        await writer.drain()
        return False

    return answer
