"""What a witness answers a refused `add-checkpoint` with quotes the request bounded and
escaped: the first line, the origin and a signature's key name came back whole (a
256 KiB body, 200 KB of it in the answer) and raw (a bidi override from a key name)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from gateway.provenance.witness.app import create_witness_app
from tests.helpers.witness_rig import ORIGIN, open_witness

EMPTY_ROOT = b"47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU="
HOSTILE = {
    "first line": b"old " + b"A" * 200_000 + b"\n\n" + ORIGIN.encode() + b"\n0\nx\n",
    "origin": b"old 0\n\n"
    + ("\u202e" + "o" * 200_000).encode()
    + "\n0\nx\n\n\u2014 k AAAA\n".encode(),
    "key name": b"old 0\n\n"
    + ORIGIN.encode()
    + b"\n0\n"
    + EMPTY_ROOT
    + "\n\n\u2014 \u202eevil !!!\n".encode(),
}


async def _post(app: Any, body: bytes) -> tuple[int, bytes]:
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/add-checkpoint",
        "query_string": b"",
        "headers": [(b"content-length", str(len(body)).encode())],
        "client": ("127.0.0.1", 40000),
    }
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])


def test_a_refusal_quotes_the_request_bounded_and_escaped(tmp_path: Path) -> None:
    with open_witness(tmp_path / "witness.json") as witness:
        app = create_witness_app(witness)
        for name, body in HOSTILE.items():
            status, answer = asyncio.run(_post(app, body))
            assert status in (400, 404), (name, status)
            assert len(answer) <= 400, (name, len(answer))
            text = answer.decode("ascii")  # nothing but escapes of what is not ASCII
            assert text.endswith("\n") and "\n" not in text[:-1], (name, text)
            assert "\x1b" not in text and "\r" not in text, (name, text)
