"""The `traceparent` an `owngate attest` sidecar passes on to its inference server.

The sidecar answers whoever reaches it (without mutual TLS, a client that bypassed the
gateway too), and the server's own tracing (vLLM's `--otlp-traces-endpoint`) reads the
field. It used to be relayed as it came: several copies, a comma-joined list, 7 KB of
text, bytes no trace context has. Only one copy in the form a gateway sends (version 00,
lower-case hex, non-zero ids) goes on now; anything else is dropped, the request still
relayed and countersigned.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from functools import partial
from pathlib import Path

from tests.helpers.attest import start_sidecar
from tests.helpers.raw_backend import Answer, RawBackend, json_answer
from tests.helpers.waiting import until

VALID = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
BODY = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'
DROPPED = {
    "two copies": [VALID, VALID],
    "a valid one and another": [VALID, b"zz-sinks3\xe9"],
    "a list": [VALID + b", " + VALID],
    "7 KB": [b"A" * 7000],
    "upper-case hex": [VALID.upper()],
    "a zero trace id": [b"00-" + b"0" * 32 + b"-00f067aa0ba902b7-01"],
    "a zero span id": [b"00-4bf92f3577b34da6a3ce929d0e0e4736-" + b"0" * 16 + b"-01"],
    "a later version's fields": [VALID + b"-extra"],
    "a tab inside": [VALID[:20] + b"\t" + VALID[20:]],
}


def _reached(raw: RawBackend, posts: int) -> bool:
    return len(raw.posts) >= posts


def _post(port: int, traceparents: list[bytes]) -> bytes:
    fields = b"".join(b"traceparent: %s\r\n" % value for value in traceparents)
    head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
    request = head + b"content-length: %d\r\n%s\r\n" % (len(BODY), fields) + BODY
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
    return answer


def test_only_one_well_formed_traceparent_reaches_the_backend(
    start_raw: Callable[[Answer], RawBackend], tmp_path: Path
) -> None:
    raw = start_raw(json_answer(b'{"id":"x","object":"chat.completion","choices":[]}'))
    sidecar = start_sidecar(tmp_path, "gpu", raw.url)
    port = sidecar.process.port
    try:
        cases = [("one valid", [VALID]), *DROPPED.items()]
        for number, (name, traceparents) in enumerate(cases, 1):
            answer = _post(port, traceparents)
            assert answer.startswith(b"HTTP/1.1 200 "), (name, answer[:200])
            assert b"x-owngate-attest: " in answer, name  # relayed and countersigned
            until(partial(_reached, raw, number), f"post {number} at the backend")
        sent = [post.header_values(b"traceparent") for post in raw.posts]
        assert sent[0] == [VALID]
        for (name, _), values in zip(DROPPED.items(), sent[1:], strict=True):
            assert values == [], name
    finally:
        assert sidecar.stop() == 0
