"""Two-party receipts in tests: `owngate attest` sidecars as processes, and logs rewritten
the way a compromised gateway or backend host (holding its own key) could rewrite them.
"""

from __future__ import annotations

import asyncio
import base64
import signal
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from gateway.provenance import (
    LogEntry,
    ProvenanceLog,
    Signer,
    commit,
    load_signer,
    write_signing_key,
)
from gateway.provenance.formats.attestation import Statement, parse_salts, sign_statement
from tests.helpers.gateways import Gateway
from tests.helpers.net import free_port
from tests.helpers.processes import ServerProcess, owngate_argv
from tests.helpers.provenance import completion_record, records
from tests.helpers.raw_backend import Post

__all__ = [
    "CHAT",
    "Sidecar",
    "SidecarTLS",
    "countersignature_comment",
    "rewrite_log",
    "served_chats",
    "start_sidecar",
]

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}


@dataclass
class Sidecar:
    process: ServerProcess
    vkey: str
    key_file: Path
    log: Path

    @property
    def url(self) -> str:
        return self.process.url

    def stop(self) -> int:
        """SIGTERM: it drains and signs a final checkpoint of its log; its exit code."""
        self.process.proc.send_signal(signal.SIGTERM)
        return self.process.proc.wait(timeout=30)


@dataclass(frozen=True)
class SidecarTLS:
    """The sidecar as its backend's mutual-TLS endpoint: `server` (certificate and key
    files) presented, client certificates chaining to `client_ca` required. `probe` is a
    client context the readiness check connects with (one holding a client certificate)."""

    server: tuple[Path, Path]
    client_ca: Path
    probe: ssl.SSLContext


def start_sidecar(
    directory: Path,
    name: str,
    backend_url: str,
    *,
    log: Path | None = None,
    port: int = 0,
    tls: SidecarTLS | None = None,
    client_pins: tuple[str, ...] | list[str] = (),
) -> Sidecar:
    """`owngate attest` in front of `backend_url`, with a new key named `name` (kept if
    it exists already: a restart) and its log in `directory/<name>-log` (or `log`), on
    `port` (default: a free one); over mutual TLS with `tls`, admitting only the client
    keys `client_pins` (`--client-pin`) when given."""
    directory.mkdir(parents=True, exist_ok=True)
    key_file = directory / f"{name}.key"
    vkey = load_signer(key_file).vkey if key_file.exists() else write_signing_key(key_file, name)
    log = log or directory / f"{name}-log"
    port = port or free_port()
    argv = owngate_argv(
        "attest",
        "--listen",
        f"127.0.0.1:{port}",
        "--backend",
        backend_url,
        "--key",
        str(key_file),
        "--log",
        str(log),
    )
    if tls is None:
        assert not client_pins, "a client pin needs the sidecar's mutual TLS"
        process = ServerProcess(f"attest-{name}-{port}", argv, directory, port)
        return Sidecar(process.wait_ready("/health"), vkey, key_file, log)
    cert, key = tls.server
    argv += ["--tls-cert", str(cert), "--tls-key", str(key), "--client-ca", str(tls.client_ca)]
    for pin in client_pins:
        argv += ["--client-pin", pin]
    process = ServerProcess(f"attest-{name}-{port}", argv, directory, port, scheme="https")
    return Sidecar(process.wait_ready("/health", verify=tls.probe), vkey, key_file, log)


def rewrite_log(
    source: Path,
    target: Path,
    key_file: Path,
    origin: str,
    edit: Callable[[list[dict[str, Any]]], list[dict[str, Any]]],
) -> None:
    """Write `edit(records of source)` as a new, validly signed log at `target`: what the
    holder of the log's key can always do. Each completion is linked anew to the latest
    open dispatch of its request, so the links verify."""
    entries = edit(records(source))

    async def write() -> None:
        log = await ProvenanceLog.open(target, origin, load_signer(key_file))
        opened: dict[str, LogEntry] = {}
        try:
            for record in entries:
                if record["type"] == "completion":
                    entry = opened.pop(record["request_id"])
                    record = {
                        **record,
                        "dispatch": {"index": entry.index, "hash": entry.leaf_hash.hex()},
                    }
                written = await log.append(record)
                if record["type"] == "dispatch":
                    opened[record["request_id"]] = written
        finally:
            await log.close()

    asyncio.run(write())


def served_chats(gateway: Gateway, log_dir: Path, count: int) -> list[str]:
    """`count` chat requests through `gateway`, whole answers and streams in turn, each
    answered 200; their request ids, once `log_dir`'s checkpoint covers each completion."""
    ids = []
    for stream in [index % 2 == 1 for index in range(count)]:
        response = httpx.post(
            f"{gateway.url}/v1/chat/completions",
            json={**CHAT, "stream": stream},
            headers=gateway.headers,
            timeout=30,
        )
        assert response.status_code == 200, response.text
        ids.append(response.headers["x-request-id"])
    for request_id in ids:
        completion_record(log_dir, request_id)
    return ids


def countersignature_comment(post: Post, signer: Signer, stream: bytes) -> bytes:
    """The SSE comment a sidecar holding `signer` ends `stream` with (`: owngate-attest
    <base64>` and its blank line), countersigning `post` as the gateway sent it (its
    request id and salts headers) and `stream` as the answer."""
    salts = parse_salts(post.header_values(b"x-owngate-salts")[0])
    assert salts is not None
    statement = Statement(
        post.header_values(b"x-request-id")[0].decode(),
        "2026-01-01T00:00:00.000Z",
        0,
        str(signer),
        commit("request", salts.request, post.body),
        commit("response", salts.response, stream),
    )
    return b": owngate-attest " + base64.b64encode(sign_statement(statement, signer)) + b"\n\n"
