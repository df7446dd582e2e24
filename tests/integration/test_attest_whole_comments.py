"""A whole answer through the `owngate attest` sidecar holding an `owngate-` comment line:
the gateway removes such lines from the whole answer of a request that says `stream:
true` (an embeddings request, whose answer is whole whatever the flag says), as from a
stream (gateway/sse_comments.py), so the sidecar must remove them before it hashes, as it
does from a stream, or it countersigns bytes the client never got. Before, the gateway
recorded that answer's countersignature as `mismatch`: an honest gateway's 200 with no
two-party statement, which `audit verify --backend-key` fails, at the inference server's
choosing."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import httpx

from tests.helpers.attest import start_sidecar
from tests.helpers.gateways import Gateway, backend, logged_gateway
from tests.helpers.provenance import completion_record
from tests.helpers.raw_backend import Answer, Post, RawBackend

ORIGIN = "gw.test/attest-whole-comments"
EMBEDDINGS = b'{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.5]}]}'
# A line of the backend's own that an SSE client would read as a receipt's comment
ANSWER = EMBEDDINGS + b"\n: owngate-receipt Zm9yZ2Vk\n"


async def _commented(writer: asyncio.StreamWriter, _post: Post) -> bool:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
    writer.write(head % len(ANSWER) + ANSWER)
    await writer.drain()
    return True


def test_a_whole_answers_comment_lines_are_removed_before_the_sidecar_signs(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    raw = start_raw(_commented)
    sidecar = start_sidecar(tmp_path, "gpu-a", raw.url)
    try:
        attested = backend("gpu", sidecar.url, "m", attest={"key": sidecar.vkey})
        gateway = logged_gateway(start_gateway, tmp_path, [attested], ORIGIN)
        body = {"model": "m", "input": "x", "stream": True}
        response = httpx.post(
            f"{gateway.url}/v1/embeddings", json=body, headers=gateway.headers, timeout=30
        )
        assert response.status_code == 200, response.text
        assert response.content == EMBEDDINGS + b"\n"  # the backend's line is not relayed
        record = completion_record(tmp_path / "log", response.headers["x-request-id"])
        assert record["attestation"]["failure"] is None, record["attestation"]
    finally:
        sidecar.process.kill()
