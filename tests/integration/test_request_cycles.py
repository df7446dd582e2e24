"""No request leaves its body in a reference cycle, whatever its outcome.

A request's body is held only while the body budget (gateway/body_budget.py) counts it.
An exception kept where the frames it was raised through can reach it (bound to a local
and raised, stored on an object those frames hold, left in a future) makes a reference
cycle through its traceback, and the frames up to the request's handler (the body among
their locals) stay alive after the budget released it, until the cyclic collector runs:
with CPython's default thresholds a few bodies at a time, with a raised young threshold
hundreds (docs/performance.md, perf16b). LiteLLM's and httpx's objects did the same to the
prompt a hosted call sent.

Each outcome runs with the collector off; once the request is over, a collection that
saves what it finds (`gc.DEBUG_SAVEALL`) must find nothing that holds the body's bytes
(or the prompt parsed from them, or the copy sent to a hosted provider).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import gateway.provenance.writer.segment_writer
from gateway.api.app import GatewayApp
from gateway.app import create_app
from gateway.provenance import write_signing_key
from gateway.serving import ServerThread
from gateway.tenants import hash_api_key
from tests.helpers.cycles import holders
from tests.helpers.gateways import (
    EU_ZERO,
    LITELLM_WARNINGS,
    TENANT_KEY,
    backend,
    gateway_config,
    hosted_backend,
)
from tests.helpers.log_truth import ORIGIN
from tests.helpers.provenance import FailingDisk
from tests.helpers.raw_backend import ERROR_BODY, Post, RawBackend, json_answer, sse_head
from tests.helpers.raw_socket import WAIT_S, parse, read_to_end
from tests.helpers.waiting import until

pytestmark = LITELLM_WARNINGS

MARK = "CYCLE-MARK-5d1e"
TIGHT_KEY = "og-test-tight-tenant-key-5d1e0"
PROMPT = MARK * 8_000  # 120 KB: any holder of it is one of the request's
POLICY = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: hosted, version: "1"}
spec:
  tenants: [acme, tight]
  residency: {allow: [eu]}
  retention: {max_days: zero}
  fallback:
    mode: when_private_unavailable
    to:
      - {backend: h400}
      - {backend: h500}
      - {backend: h200}
      - {backend: hbreaks}
      - {backend: r400}
      - {backend: r500}
      - {backend: rslow}
"""
_WHOLE = json.dumps(
    {
        "id": "x",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
).encode()


async def _never(_writer: asyncio.StreamWriter, _post: Post) -> bool:
    await asyncio.sleep(WAIT_S)
    return False


async def _breaks(writer: asyncio.StreamWriter, _post: Post) -> bool:
    delta = {"role": "assistant", "content": "hi"}
    chunk = {
        "id": "x",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
    }
    writer.write(sse_head() + b"data: " + json.dumps(chunk).encode() + b"\n\n")
    await writer.drain()
    writer.transport.abort()  # broken off after the client saw its first chunk
    return False


_ANSWERS: dict[str, Any] = {
    "p400": json_answer(ERROR_BODY, b"400 Bad Request"),
    "p503": json_answer(ERROR_BODY, b"503 Service Unavailable"),
    "p429": json_answer(ERROR_BODY, b"429 Too Many Requests"),
    "p500": json_answer(ERROR_BODY, b"500 Internal Server Error"),
    "p200": json_answer(_WHOLE),
    "slow": _never,
    "breaks": _breaks,
    "h400": json_answer(ERROR_BODY, b"400 Bad Request"),
    "h500": json_answer(ERROR_BODY, b"500 Internal Server Error"),
    "h200": json_answer(_WHOLE),
    "hx": json_answer(_WHOLE),
    "hbreaks": _breaks,
    "r400": json_answer(ERROR_BODY, b"400 Bad Request"),
    "r500": json_answer(ERROR_BODY, b"500 Internal Server Error"),
    "rslow": _never,
}


def _bridged(id: str, url: str, model: str) -> dict[str, Any]:
    """A hosted backend whose model LiteLLM sends through its chat-to-Responses bridge
    (`openai/responses/...`: gateway/upstream/responses_bridge.py)."""
    return hosted_backend(
        id, url, models=[{"name": model, "provider_model": f"openai/responses/{model}"}]
    )


@dataclass
class Stack:
    app: GatewayApp
    server: ServerThread
    backends: dict[str, RawBackend]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("cycles")
    (tmp / "policies").mkdir()
    (tmp / "policies" / "hosted.yaml").write_text(POLICY)
    write_signing_key(tmp / "log.key", ORIGIN)
    raw = {name: RawBackend(answer).start() for name, answer in _ANSWERS.items()}
    try:
        config = gateway_config(
            [
                backend("p400", raw["p400"].url, "refused", **EU_ZERO),
                backend("p503", raw["p503"].url, "failing", **EU_ZERO),
                backend("p429", raw["p429"].url, "busy", **EU_ZERO),
                backend("p500", raw["p500"].url, "failover", **EU_ZERO),
                backend("p200", raw["p200"].url, "ok", **EU_ZERO),
                backend("slow", raw["slow"].url, "slow", first_byte_timeout_s=0.3, **EU_ZERO),
                backend("breaks", raw["breaks"].url, "breaks", **EU_ZERO),
                hosted_backend("h400", raw["h400"].url + "/v1", "h-refused"),
                hosted_backend("h500", raw["h500"].url + "/v1", "h-failing"),
                hosted_backend("h200", raw["h200"].url + "/v1", "h-ok", "failover"),
                hosted_backend("hx", raw["hx"].url + "/v1", "h-denied"),
                hosted_backend("hbreaks", raw["hbreaks"].url + "/v1", "h-breaks"),
                _bridged("r400", raw["r400"].url + "/v1", "r-refused"),
                _bridged("r500", raw["r500"].url + "/v1", "r-failing"),
                _bridged("rslow", raw["rslow"].url + "/v1", "r-slow"),
            ],
            policy={"paths": [str(tmp / "policies")]},
            limits={"first_byte_timeout_s": 2.0},  # a hosted call's wait (`r-slow`)
            tenants=[
                {"id": "acme", "api_key_hashes": [hash_api_key(TENANT_KEY)], "models": ["*"]},
                {  # a budget the prompt passes outright: refused at admission (429)
                    "id": "tight",
                    "api_key_hashes": [hash_api_key(TIGHT_KEY)],
                    "models": ["*"],
                    "limits": {"tokens_per_minute": 1},
                },
            ],
            provenance={
                "dir": str(tmp / "log"),
                "origin": ORIGIN,
                "signing_key_file": str(tmp / "log.key"),
            },
        )
        app = create_app(config, environ={"HOSTED_KEY": "sk-cycles-0123456789"})
        with ServerThread(app, listen=config.listen) as server:
            stack = Stack(app, server, raw)
            for model in ("ok", "h-ok", "refused"):  # LiteLLM loaded, connections pooled
                _post(stack, model)
            gc.collect()
            gc.freeze()  # what is there now is not walked by each test's collections
            yield stack
    finally:
        gc.unfreeze()
        for one in raw.values():
            one.stop()


def _post(
    stack: Stack,
    model: str,
    *,
    stream: bool = False,
    leave: bool = False,
    key: str = TENANT_KEY,
    endpoint: str = "chat/completions",
    **extra: Any,
) -> int:
    """One request (a chat unless `endpoint` says) carrying PROMPT; its status (0: the
    client left before any)."""
    doc: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": PROMPT}]}
    if endpoint == "embeddings":
        doc = {"model": model, "input": PROMPT}
    elif endpoint == "completions":
        doc = {"model": model, "prompt": PROMPT, "max_tokens": 2, "stream": stream}
    else:
        doc.update(max_tokens=2, stream=stream)
    doc.update(extra)
    body = json.dumps(doc).encode()
    head = (
        b"POST /v1/%s HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
        b"authorization: Bearer %s\r\nconnection: close\r\ncontent-length: %d\r\n\r\n"
    ) % (endpoint.encode(), key.encode(), len(body))
    server = stack.server
    with socket.create_connection((server.host, server.port), timeout=WAIT_S) as sock:
        sock.sendall(head + body)
        if leave:
            until(lambda: len(stack.app.serving) == 1, "the request being served")
            return 0
        return parse(read_to_end(sock))[0]


# (what happens, request, the status the client gets)
OUTCOMES = [
    ("served", {"model": "ok"}, 200),
    ("backend refuses (400)", {"model": "refused"}, 400),
    ("backend fails (503), nothing else serves", {"model": "failing"}, 503),
    ("backend busy (429), nothing else serves", {"model": "busy"}, 503),
    ("embeddings refused (400)", {"model": "refused", "endpoint": "embeddings"}, 400),
    ("completions refused (400)", {"model": "refused", "endpoint": "completions"}, 400),
    ("hosted completions fail (500)", {"model": "h-failing", "endpoint": "completions"}, 503),
    ("backend fails (500), a hosted one serves", {"model": "failover"}, 200),  # p500, h200
    ("no first byte in time", {"model": "slow"}, 504),
    ("stream broken off mid-way", {"model": "breaks", "stream": True}, 200),
    ("policy refuses", {"model": "h-denied"}, 404),  # not in the tenant's /v1/models
    ("unknown model", {"model": "nope"}, 404),
    ("control field refused before dispatch", {"model": "ok", "api_base": "http://x"}, 400),
    ("client leaves mid-request", {"model": "slow", "leave": True}, 0),
    ("hosted served", {"model": "h-ok"}, 200),
    ("hosted refuses (400)", {"model": "h-refused"}, 400),
    ("hosted fails (500)", {"model": "h-failing"}, 503),
    ("hosted stream fails (500)", {"model": "h-failing", "stream": True}, 503),
    ("hosted stream broken off mid-way", {"model": "h-breaks", "stream": True}, 200),
    ("token budget refuses (429)", {"model": "ok", "key": TIGHT_KEY}, 429),
    ("bridged refuses (400)", {"model": "r-refused"}, 400),
    ("bridged fails (500)", {"model": "r-failing"}, 503),
    ("bridged stream refused (400)", {"model": "r-refused", "stream": True}, 400),
    ("bridged stream fails (500)", {"model": "r-failing", "stream": True}, 503),
    ("bridged times out", {"model": "r-slow"}, 504),  # a timeout: 504, as a private one's
    ("bridged stream times out", {"model": "r-slow", "stream": True}, 504),
]


@pytest.mark.parametrize(
    ("request_kw", "status"), [o[1:] for o in OUTCOMES], ids=[o[0] for o in OUTCOMES]
)
def test_no_reference_cycle_holds_the_body(
    stack: Stack, collector_off: None, request_kw: dict[str, Any], status: int
) -> None:
    holders(MARK, len(PROMPT) // 2)  # what was there before
    tried = {name: len(raw.posts) for name, raw in stack.backends.items()}
    assert _post(stack, **request_kw) == status
    if request_kw["model"] == "failover":  # failed over: the private backend was tried first
        assert len(stack.backends["p500"].posts) == tried["p500"] + 1
        assert len(stack.backends["h200"].posts) == tried["h200"] + 1
    app = stack.app
    until(
        lambda: not app.serving and app.bodies.held == 0,
        "the request over, its body released",
        detail=lambda: (len(app.serving), app.bodies.held),
    )
    assert holders(MARK, len(PROMPT) // 2) == []


def test_the_check_sees_a_cycle_holding_the_body(collector_off: None) -> None:
    """The check itself: a frame that holds the body and an exception raised from it."""

    def refuse(body: bytes) -> None:
        error = ValueError("refused")
        raise error

    with contextlib.suppress(ValueError):
        refuse((MARK * 8_000).encode())
    assert holders(MARK, len(PROMPT) // 2) == ["frame refuse"]


class _OwnDisk(FailingDisk):
    """`FailingDisk` for the segments opened under `root` only: the module's gateway
    (`stack`), which may run in this process meanwhile, keeps writing."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root, self.fds = str(root), set[int]()

    def open(self, path: Any, *args: Any) -> int:
        fd = os.open(path, *args)
        if str(path).startswith(self.root):
            self.fds.add(fd)
        return fd

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        if fd not in self.fds:
            return os.pwrite(fd, data, offset)
        return super().pwrite(fd, data, offset)


def test_a_log_that_cannot_be_written_leaves_no_cycle_holding_the_body(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, collector_off: None
) -> None:
    """The dispatch record refused by the disk (503): the log's futures hold its error."""
    write_signing_key(tmp_path / "log.key", ORIGIN)
    raw = RawBackend(json_answer(_WHOLE)).start()
    disk = _OwnDisk(tmp_path)
    monkeypatch.setattr(gateway.provenance.writer.segment_writer, "os", disk)
    try:
        config = gateway_config(
            [backend("p200", raw.url, "ok")],
            provenance={
                "dir": str(tmp_path / "log"),
                "origin": ORIGIN,
                "signing_key_file": str(tmp_path / "log.key"),
            },
        )
        app = create_app(config, environ={})
        with ServerThread(app, listen=config.listen) as server:
            stack = Stack(app, server, {"p200": raw})
            assert _post(stack, "ok") == 200
            holders(MARK, len(PROMPT) // 2)
            disk.failing = True
            assert _post(stack, "ok") == 503
            until(
                lambda: not app.serving and app.bodies.held == 0,
                "the request over, its body released",
            )
            assert holders(MARK, len(PROMPT) // 2) == []
    finally:
        raw.stop()
