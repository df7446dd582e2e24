"""What a client holding a tenant key tried against owngate's identifiers and the line
between tenants, over real sockets, and what it got (a red-team pass kept as
regressions).

Two tenants, `acme` and `other`, may both use `m`, served by one private raw backend
`gpu` that shows exactly which bytes reach it; the provenance log is on. A client sends
its own request ids (OpenAI's `x-client-request-id`, `idempotency-key`, an `x-request-id`
naming another tenant's request), the sidecar's and the gateway's own headers, hop-by-hop
headers naming them, path and method variants, and model names that are not the
configured one; it pipelines requests of both tenants on one connection. Each request
id is the gateway's, each receipt its own request's, and nothing of the client's
identifiers reaches the backend or the log.
"""

from __future__ import annotations

import asyncio
import base64
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httptools
import httpx
import orjson
import pytest

from gateway.provenance import load_signer, verify_receipt
from gateway.tenants import hash_api_key
from tests.helpers.audit_rig import settled
from tests.helpers.gateways import OTHER_KEY, TENANT_KEY, Gateway, backend, logged_gateway
from tests.helpers.independent_audit import Received, audit
from tests.helpers.provenance import assert_never_logged, records, request_records
from tests.helpers.raw_backend import Post, RawBackend
from tests.helpers.raw_http import Response, build_request, exchange
from tests.helpers.raw_socket import connect

ORIGIN = "gw.test/identifiers"
REQUEST_ID = re.compile(r"req_[0-9a-f]{24}")
ANSWER = b'{"id":"c","object":"chat.completion","choices":[],"usage":'
ANSWER += b'{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}'
EVENTS = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"hi"}}]}\n\ndata: [DONE]\n\n'
CHAT = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'
# The header names the gateway sends a private backend without `auth` or tracing.
SENT_NAMES = {b"host", b"accept-encoding", b"content-length", b"content-type", b"x-request-id"}


async def _answer(writer: asyncio.StreamWriter, post: Post) -> bool:
    """A whole JSON answer, or an SSE stream to a request asking for one; the
    connection stays open for the next request."""
    streams = orjson.loads(post.body).get("stream") is True
    kind, body = (b"text/event-stream", EVENTS) if streams else (b"application/json", ANSWER)
    head = b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n"
    writer.write(head % (kind, len(body)) + body)
    await writer.drain()
    return True


@pytest.fixture
def rig(
    start_raw: Callable[[Any], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> tuple[Gateway, RawBackend]:
    raw = start_raw(_answer)
    gateway = logged_gateway(
        start_gateway,
        tmp_path,
        [backend("gpu", raw.url, "m")],
        ORIGIN,
        tenants=[
            {"id": "acme", "api_key_hashes": [hash_api_key(TENANT_KEY)], "models": ["m"]},
            {"id": "other", "api_key_hashes": [hash_api_key(OTHER_KEY)], "models": ["m"]},
        ],
    )
    return gateway, raw


def _request(
    key: str,
    lines: list[bytes] = [],  # noqa: B006 - never mutated
    *,
    body: bytes = CHAT,
    target: bytes = b"/v1/chat/completions",
    method: bytes = b"POST",
) -> bytes:
    head = [
        b"host: 127.0.0.1",
        b"authorization: Bearer " + key.encode(),
        b"content-type: application/json",
        b"content-length: %d" % len(body),
    ]
    return build_request(method, target, head + lines, body)


def _send(gateway: Gateway, raw: bytes) -> Response:
    """The one final answer to `raw` (a request asking to close the connection)."""
    outcome = exchange(gateway.server.port, raw, half_close=False)
    assert len(outcome.final) == 1, outcome.describe()
    return outcome.final[0]


def _names(post: Post) -> set[bytes]:
    return {line.partition(b":")[0].lower() for line in post.head.split(b"\r\n")[1:] if line}


def _receipt(gateway: Gateway, key: str, request_id: str) -> httpx.Response:
    return httpx.get(
        f"{gateway.url}/v1/provenance/receipts/{request_id}",
        headers={"authorization": f"Bearer {key}"},
        timeout=10,
    )


def test_a_clients_request_ids_and_owngate_headers_reach_nothing(
    rig: tuple[Gateway, RawBackend], tmp_path: Path
) -> None:
    """`other` makes a request; `acme` then sends its id as its own `x-request-id`
    (twice, beside `..`, a long one and obs-text), `x-client-request-id` and
    `idempotency-key`, the sidecar's `x-owngate-salts`, a forged `x-owngate-receipt`,
    `connection` naming them all, `te: trailers`, `forwarded` and a `traceparent`. Its
    request gets a fresh id of the gateway's; the backend gets the gateway's five
    headers alone; `other`'s request keeps its two records and its receipt, which `acme`
    cannot read."""
    gateway, raw = rig
    theirs = _send(gateway, _request(OTHER_KEY, [b"connection: close"]))
    assert theirs.status == 200, theirs.describe()
    their_id = (theirs.header(b"x-request-id") or b"").decode()
    their_receipt = theirs.header(b"x-owngate-receipt")
    settled(tmp_path / "log", load_signer(tmp_path / "log.key").verifier().vkey, their_id)
    hostile = [
        b"x-request-id: " + their_id.encode(),
        b"x-request-id: ../../" + their_id.encode(),
        b"x-request-id: " + b"r" * 4000,
        b"x-request-id: req_\xe2\x80\xae" + their_id.encode()[4:],
        b"x-client-request-id: " + their_id.encode(),
        b"idempotency-key: " + their_id.encode(),
        b"x-owngate-salts: " + b"00" * 64,
        b"x-owngate-receipt: " + (their_receipt or b""),
        b"x-owngate-attest: Rk9SR0VE",
        b"connection: close, x-owngate-salts, x-request-id, te",
        b"te: trailers",
        b"forwarded: for=127.0.0.1;host=gpu",
        b"traceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    ]
    ours = _send(gateway, _request(TENANT_KEY, hostile))
    assert ours.status == 200, ours.describe()
    our_id = (ours.header(b"x-request-id") or b"").decode()
    assert REQUEST_ID.fullmatch(our_id) and our_id != their_id
    assert [k for k, _ in ours.headers].count(b"x-request-id") == 1
    assert ours.header(b"x-owngate-receipt") != their_receipt
    # The backend got the gateway's headers, with the gateway's id, and no client value.
    post = raw.posts[-1]
    assert _names(post) == SENT_NAMES, post.head
    assert post.header_values(b"x-request-id") == [our_id.encode()]
    assert their_id.encode() not in post.head and b"trailers" not in post.head
    # The log: each id names one request, of one tenant; each tenant reads its own receipt.
    settled(tmp_path / "log", load_signer(tmp_path / "log.key").verifier().vkey, our_id)
    logged = {(r["request_id"], r["type"], r.get("tenant")) for r in records(tmp_path / "log")}
    assert logged == {
        (their_id, "dispatch", "other"),
        (their_id, "completion", None),
        (our_id, "dispatch", "acme"),
        (our_id, "completion", None),
    }
    assert _receipt(gateway, OTHER_KEY, their_id).content == base64.b64decode(their_receipt or b"")
    assert _receipt(gateway, TENANT_KEY, their_id).status_code == 404
    assert _receipt(gateway, OTHER_KEY, our_id).status_code == 404
    assert _receipt(gateway, TENANT_KEY, our_id).status_code == 200


# Targets that reach the chat endpoint (uvicorn decodes percent-escapes; a query, an
# absolute form's host and a fragment say nothing), and ones that reach no endpoint.
SERVED = [
    b"/v1/chat/completions?model=other&tenant=other",
    b"/v1/chat%2Fcompletions",
    b"/v1/%63hat/completions",
    b"http://other.tenant/v1/chat/completions",
    b"/v1/chat/completions#frag",
]
UNKNOWN = [
    b"/v1//chat/completions",
    b"/v1/chat/completions/",
    b"//v1/chat/completions",
    b"/v1/chat/completions;tenant=other",
    b"/v1/chat/./completions",
    b"/v1/chat/../chat/completions",
    b"/V1/chat/completions",
    b"/v1/chat/completions%20",
    b"/v1/chat/completions%00",
    b"*",
]


def test_path_and_method_variants_are_the_endpoint_or_nothing(
    rig: tuple[Gateway, RawBackend], tmp_path: Path
) -> None:
    """A variant either is `/v1/chat/completions` (the backend gets exactly that target,
    no query, and the log holds the request under the key's tenant) or gets a 404 / 405
    that no backend hears of and the log never holds."""
    gateway, raw = rig
    served, refused = [], []
    for target in SERVED:
        answer = _send(gateway, _request(TENANT_KEY, [b"connection: close"], target=target))
        assert answer.status == 200, (target, answer.describe())
        assert raw.posts[-1].head.split(b"\r\n")[0] == b"POST /v1/chat/completions HTTP/1.1"
        served.append((answer.header(b"x-request-id") or b"").decode())
    assert len(raw.posts) == len(SERVED)
    variants = [(b"POST", t, 404) for t in UNKNOWN]
    # Under the provenance paths (GET only), whatever follows: nothing is served.
    variants.append((b"POST", b"/v1/provenance/../chat/completions", 405))
    variants += [(m, b"/v1/chat/completions", 405) for m in (b"GET", b"PUT", b"OPTIONS", b"HEAD")]
    for method, target, status in variants:
        lines = [b"connection: close"]
        answer = _send(gateway, _request(TENANT_KEY, lines, target=target, method=method))
        assert answer.status == status, (method, target, answer.describe())
        refused.append((answer.header(b"x-request-id") or b"").decode())
    assert len(raw.posts) == len(SERVED)
    for request_id in served:
        dispatch = request_records(tmp_path / "log", request_id, "dispatch")[0]
        assert (dispatch["tenant"], dispatch["model"]) == ("acme", "m")
    last = _send(gateway, _request(TENANT_KEY, [b"connection: close"]))
    for request_id in refused:
        assert_never_logged(
            tmp_path / "log", request_id, (last.header(b"x-request-id") or b"").decode()
        )


# `model` values that are not the configured name `m`: other JSON types, case, spaces,
# look-alike letters (fullwidth, Cyrillic), invisible characters, another tenant's name.
NOT_M: list[object] = [
    ["m"],
    {"name": "m"},
    1,
    True,
    None,
    "M",
    " m",
    "m ",
    "m\u0000",
    "\uff4d",
    "\u043c",
    "m\u200b",
    "other/m",
    "m:other",
]


def test_a_model_that_is_not_the_configured_name_reaches_no_backend(
    rig: tuple[Gateway, RawBackend], tmp_path: Path
) -> None:
    """Each is a 400 or a 404, no backend hears of it, and no dispatch is logged."""
    gateway, raw = rig
    ids = []
    for model in NOT_M:
        body = orjson.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]})
        answer = _send(gateway, _request(TENANT_KEY, [b"connection: close"], body=body))
        assert answer.status in (400, 404), (model, answer.describe())
        ids.append((answer.header(b"x-request-id") or b"").decode())
    assert raw.posts == []
    last = _send(gateway, _request(TENANT_KEY, [b"connection: close"]))
    last_id = (last.header(b"x-request-id") or b"").decode()
    request_records(tmp_path / "log", last_id, "completion")
    dispatched = {r["request_id"] for r in records(tmp_path / "log") if r["type"] == "dispatch"}
    assert dispatched == {last_id}


class _Answers:
    """httptools callbacks collecting the answers on one connection."""

    def __init__(self) -> None:
        self.parser: Any = None
        self.answers: list[Response] = []

    def on_message_begin(self) -> None:
        self.answers.append(Response(status=0))

    def on_header(self, name: bytes, value: bytes) -> None:
        self.answers[-1].headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.answers[-1].status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self.answers[-1].body += body


def test_pipelined_requests_of_two_tenants_each_get_their_own_receipt(
    rig: tuple[Gateway, RawBackend], tmp_path: Path
) -> None:
    """Three requests in one write on one connection (`acme` streaming, `other`, `acme`
    whole): three ids, each answer's receipt names its own request, and the independent
    audit finds each answer, its receipt and the log in agreement, under its tenant."""
    gateway, _ = rig
    bodies = [
        b'{"model":"m","stream":true,"messages":[{"role":"user","content":"one"}]}',
        b'{"model":"m","messages":[{"role":"user","content":"two"}]}',
        b'{"model":"m","messages":[{"role":"user","content":"three"}]}',
    ]
    keys = [TENANT_KEY, OTHER_KEY, TENANT_KEY]
    data = b"".join(
        _request(k, [b"connection: close"] if i == 2 else [], body=b)
        for i, (k, b) in enumerate(zip(keys, bodies, strict=True))
    )
    collector = _Answers()
    parser = httptools.HttpResponseParser(collector)
    collector.parser = parser
    with connect(gateway.server) as sock:
        sock.sendall(data)
        while chunk := sock.recv(65536):
            parser.feed_data(chunk)
    assert [a.status for a in collector.answers] == [200, 200, 200]
    vkey = load_signer(tmp_path / "log.key").verifier().vkey
    ids = [(a.header(b"x-request-id") or b"").decode() for a in collector.answers]
    assert len(set(ids)) == 3
    for answer, key, body, tenant in zip(
        collector.answers, keys, bodies, ["acme", "other", "acme"], strict=True
    ):
        headers = {k.decode(): v.decode() for k, v in answer.headers}
        received = Received(answer.status, headers, answer.body, body)
        request_id = headers["x-request-id"]
        settled(tmp_path / "log", vkey, request_id)
        later = _receipt(gateway, key, request_id)
        assert later.status_code == 200
        assert audit(received, tmp_path / "log", vkey, later_receipt=later.content) == []
        assert verify_receipt(later.content, [load_signer(tmp_path / "log.key").verifier()])
        dispatch = request_records(tmp_path / "log", request_id, "dispatch")[0]
        assert dispatch["tenant"] == tenant
