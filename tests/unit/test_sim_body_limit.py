"""The simulator (`owngate sim`, the demo's backend) reads a request body only up to
`SimSettings.max_body_bytes` (64 MiB by default; `--max-body-bytes`): anyone reaching
its port made it hold a body of any size in memory, sent with a declared length or
chunked. Past the bound it answers 413 in the imitated server's error shape and reads
no further; a declared length over it is refused before any byte is read."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import socket
from typing import Any

import orjson
import pytest

import gateway.sim.settings
from gateway.cli import sim as sim_cli
from gateway.serving import ServerThread
from gateway.sim import SimSettings, create_sim_app

MAX_BODY_BYTES = 64 << 20  # docs/simulator.md, "Request bodies"
CHAT = "/v1/chat/completions"
LIMIT = 4096
BODY = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})


def _settings(kind: str = "vllm", limit: int = LIMIT) -> SimSettings:
    base = SimSettings.for_kind(kind, models=("m",), zero_latency=True)  # type: ignore[arg-type]
    return dataclasses.replace(base, max_body_bytes=limit)


def _post(app: Any, chunks: list[bytes], declared: int | None) -> tuple[int, bytes, int]:
    """(status, body, bytes the app took from `receive`) of one POST to CHAT, its body
    sent as `chunks` (one message each) after `declared` as Content-Length, if given."""
    headers = [] if declared is None else [(b"content-length", str(declared).encode())]
    scope = {
        "type": "http",
        "method": "POST",
        "path": CHAT,
        "query_string": b"",
        "headers": headers,
    }
    pending = list(chunks)
    taken = 0
    status, parts = 0, []

    async def receive() -> dict[str, Any]:
        nonlocal taken
        if not pending:
            await asyncio.sleep(3600)  # the client sends nothing more
        chunk = pending.pop(0)
        taken += len(chunk)
        return {"type": "http.request", "body": chunk, "more_body": bool(pending)}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            parts.append(message.get("body", b""))

    asyncio.run(asyncio.wait_for(app(scope, receive, send), 10))
    return status, b"".join(parts), taken


def test_the_default_bound_is_64_mib() -> None:
    assert gateway.sim.settings.MAX_BODY_BYTES == MAX_BODY_BYTES
    assert SimSettings().max_body_bytes == SimSettings.for_kind("llamacpp").max_body_bytes
    assert SimSettings().max_body_bytes == MAX_BODY_BYTES
    with pytest.raises(ValueError, match="max_body_bytes"):
        SimSettings(max_body_bytes=0)


@pytest.mark.parametrize("kind", ["vllm", "llamacpp"])
def test_a_declared_length_over_the_bound_is_413_and_unread(kind: str) -> None:
    status, body, taken = _post(create_sim_app(_settings(kind)), [b"x" * 100], LIMIT + 1)
    assert status == 413
    assert taken == 0
    error = orjson.loads(body)["error"]
    assert error["code"] == 413 and str(LIMIT) in error["message"]


def test_a_chunked_body_is_read_no_further_than_the_bound() -> None:
    chunks = [b"x" * 1024] * 64  # 64 KiB sent, no declared length
    status, _, taken = _post(create_sim_app(_settings()), chunks, None)
    assert status == 413
    assert taken <= LIMIT + 1024  # stopped at the chunk that went past it


def test_a_body_within_the_bound_is_served_as_before() -> None:
    app = create_sim_app(_settings(limit=len(BODY)))
    status, body, _ = _post(app, [BODY[:10], BODY[10:]], None)
    assert status == 200, body
    assert orjson.loads(body)["object"] == "chat.completion"
    assert app.captured(CHAT)[-1].body == BODY


def test_413_on_the_wire_closes_the_connection() -> None:
    with ServerThread(create_sim_app(_settings())) as server:
        port = int(server.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            head = f"POST {CHAT} HTTP/1.1\r\nhost: a\r\ncontent-length: {1 << 30}\r\n\r\n"
            sock.sendall(head.encode() + b"x" * 1024)
            raw = b""
            while len(raw) < 65536 and (chunk := sock.recv(65536)):
                raw += chunk  # ends with the server's close
    assert raw.startswith(b"HTTP/1.1 413 "), raw[:200]
    assert b"connection: close" in raw.lower()


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    sim_cli.register(parser.add_subparsers())
    return parser.parse_args(["sim", *argv])


def test_the_cli_flag_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert sim_cli.build_settings(_parse([])).max_body_bytes == MAX_BODY_BYTES
    assert sim_cli.build_settings(_parse(["--max-body-bytes", "1000"])).max_body_bytes == 1000
    monkeypatch.setenv("OWNGATE_SIM_MAX_BODY_BYTES", "2000")
    assert sim_cli.build_settings(_parse([])).max_body_bytes == 2000
    with pytest.raises(SystemExit):
        _parse(["--max-body-bytes", "0"])
