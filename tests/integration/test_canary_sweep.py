"""A canary sweep of a real `owngate serve` with every output on, and of the processes
around it: no string a client or a backend chose reaches any of them verbatim.

Every client-controlled field of every request carries `CANARY` (path, query, header
names and values, trace context (traceparent, tracestate, baggage), referer and origin,
framing (chunk extensions and trailers, transfer and content codings, expectations, an
absolute-form target, the HTTP version), a wrong key, labels, model names known and not,
body keys and values, malformed JSON, control fields that get refused) on chat,
completions and embeddings, past a tenant's rate limit, and at the admin listener
without its token; so does every string the backends answer with (error bodies, header
names and values, the reason phrase, a hosted provider's `x-request-id`, answer text).
Then every output is searched: the gateway's stderr and stdout at `logging.level: debug`
in each `logging.format` (json and console: structlog, the access log, the stdlib lines
of uvicorn and the HTTP client libraries), its provenance log's files, the spans it
exports over OTLP, `/metrics`, the admin API's status, tenants, timeline and request
views, the `owngate attest` sidecar's output and log, the witness's output, and what
`owngate audit verify` / `show --records` print of the log, and `/readyz` of both
listeners. The heads of the requests the backends receive carry no client header (a
canary, or a client's trace id: the private ones get the gateway's own `traceparent`,
the hosted ones none, and none gets `tracestate` or `baggage`). What the clients get
back is their own request's business (docs/api.md) and is not searched. The strings of a
backend the log records by design, a hosted answer's `id` and the `model` a whole one
names (`upstream.response_id`, `upstream.model`, docs/provenance.md), are kept plain
here (a stream's chunks LiteLLM names after the model it asked for: theirs stay
canaries); the provider's `x-request-id` is recorded only in its documented form, which
a quote is out of.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from gateway.provenance import write_signing_key
from gateway.provenance.witness.state import WitnessState
from gateway.tenants import hash_api_key
from tests.helpers.attest import Sidecar, start_sidecar
from tests.helpers.gateways import LITELLM_WARNINGS
from tests.helpers.net import free_port, free_ports
from tests.helpers.otlp_receiver import Receiver, receiving
from tests.helpers.processes import GatewayProcess, ServerProcess, owngate_argv
from tests.helpers.raw_backend import Answer, Post, RawBackend
from tests.helpers.raw_http import build_request, exchange
from tests.helpers.waiting import until

pytestmark = LITELLM_WARNINGS

CANARY = "CANARY7f3a"
INJECTION = '\n{"forged":1}\x1b[31m\u202e"'  # a line break, an escape, a bidi override, a quote
KEY = "og-sweep-tenant-key-" + "s" * 24
SLOW_KEY = "og-sweep-slow-tenant-key-" + "s" * 24  # a tenant of one request a minute: 429
ADMIN_TOKEN = "og-sweep-admin-token-0123456789"
EU = {"region": "eu-west-1", "retention": {"days": 0, "zero_data_retention": True}}
# A valid W3C trace context (the spec's example trace id): the gateway links it, and
# sends its backends a trace of its own.
CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
ERRORS = {"e500": 500, "e429": 429, "e400": 400}
# What every answer of the backends carries in its head: names and values of their own.
BACKEND_HEAD = (
    b"x-echo-CANARY7f3a-name: CANARY7f3a-value\r\n"
    b'x-request-id: CANARY7f3a"request-id\r\n'  # a quote: out of the record's id form
    b"openai-request-id: CANARY7f3a request id\r\n"
    b"server: CANARY7f3a-server\r\n"
)


def _answer_to(post: Post) -> bytes:
    """A backend's answer by the body's model: errors quoting the whole request (as some
    servers do), or a whole answer or a stream whose text and fields are canaries."""
    try:
        model = str(json.loads(post.body).get("model"))
    except ValueError:
        model = "-"
    echo = (post.head + post.body).decode("utf-8", "replace")
    if model in ERRORS:
        text = f"{CANARY} {echo}{INJECTION}"
        body = orjson.dumps({"error": {"message": text, "type": CANARY, "code": CANARY}})
        content_type = b"application/json"
    elif b'"stream":true' in post.body.replace(b" ", b""):
        chunk = {"id": "chatcmpl-plain", "object": "chat.completion.chunk", "created": 1}
        delta = {"index": 0, "delta": {"content": CANARY}, "finish_reason": "stop"}
        usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
        body = b"".join(
            b"data: " + orjson.dumps(event) + b"\n\n"
            for event in (
                {**chunk, "model": CANARY, "choices": [delta]},
                {**chunk, "model": CANARY, "choices": [], "usage": usage},
            )
        )
        body += b": " + CANARY.encode() + b"\n\ndata: [DONE]\n\n"
        content_type = b"text/event-stream"
    else:
        message = {"role": "assistant", "content": CANARY + INJECTION}
        body = orjson.dumps(
            {
                "id": "chatcmpl-plain",
                "object": "chat.completion",
                "created": 1,
                "model": "plain-model",
                "system_fingerprint": CANARY,
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
            }
        )
        content_type = b"application/json"
    status = ERRORS.get(model, 200)
    head = b"HTTP/1.1 %d CANARY7f3a reason\r\ncontent-type: %s\r\ncontent-length: %d\r\n"
    return head % (status, content_type, len(body)) + BACKEND_HEAD + b"\r\n" + body


async def _answer(writer: asyncio.StreamWriter, post: Post) -> bool:
    writer.write(_answer_to(post))
    await writer.drain()
    return False


POLICY = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: sweep, version: "1"}
spec:
  tenants: [acme]
  residency: {allow: [eu]}
  retention: {max_days: zero}
  fallback:
    mode: when_private_unavailable
    to:
      - {backend: hosted-ok}
      - {backend: hosted-e500}
      - {backend: hosted-e429}
      - {backend: hosted-e400}
  data_classes:
    phi: {fallback: {mode: never}}
    public: {}
"""


def _config(
    private: RawBackend,
    hosted: RawBackend,
    sidecar: Sidecar,
    witness: tuple[str, str],
    log_format: str,
) -> dict[str, Any]:
    port, admin_port = free_ports(2)
    # One backend per model: one's failures never open the breaker in front of another.
    private_backends: list[dict[str, Any]] = [
        {"id": f"gpu-{m}", "kind": "vllm", "base_url": private.url, "models": [{"name": m}]}
        for m in ("ok", *ERRORS)
    ]
    attested: dict[str, Any] = {"id": "att", "kind": "vllm", "base_url": sidecar.url}
    attested |= {"models": [{"name": "att"}], "attest": {"key": sidecar.vkey}}
    hosted_backends: list[dict[str, Any]] = [
        {
            "id": f"hosted-{m}",
            "kind": "hosted",
            "provider": "openai",
            "base_url": hosted.url + "/v1",
            "api_key_env": "HOSTED_KEY",
            "models": [{"name": f"hosted-{m}", "provider_model": f"openai/{m}"}],
        }
        for m in ("ok", *ERRORS)
    ]
    return {
        "listen": {"host": "127.0.0.1", "port": port},
        "logging": {"format": log_format, "level": "debug", "access_log": True},
        "backends": [
            {**b, "owner": "t", **EU} for b in (*private_backends, attested, *hosted_backends)
        ],
        "policy": {"paths": ["policies"]},
        "provenance": {
            "dir": "log",
            "origin": "sweep.test/log",
            "signing_key_file": "log.key",
            "checkpoint_interval_ms": 50,
            "witnesses": [{"url": witness[0], "vkey": witness[1]}],
        },
        "tenants": [
            {"id": "acme", "api_key_hashes": [hash_api_key(KEY)], "models": ["*"]},
            {
                "id": "slow",
                "api_key_hashes": [hash_api_key(SLOW_KEY)],
                "models": ["ok"],
                "limits": {"requests_per_minute": 1},
            },
        ],
        "admin": {
            "listen": {"host": "127.0.0.1", "port": admin_port},
            "token_hashes": [hash_api_key(ADMIN_TOKEN)],
        },
    }


def _requests() -> Iterator[tuple[str, dict[str, str], bytes]]:
    """(target, headers, body) of every request the sweep sends: canaries everywhere."""
    headers = {
        "authorization": f"Bearer {KEY}",
        "content-type": "application/json",
        "user-agent": CANARY,
        "x-request-id": CANARY,
        "forwarded": f"for={CANARY}",
        "accept": f"application/json, {CANARY}/x",
        "traceparent": f"00-{CANARY}-01",
        "tracestate": f"vendor={CANARY}",
        "baggage": f"user.id={CANARY}",
        "referer": f"https://{CANARY}.example/",
        "origin": f"https://{CANARY}.example",
        "x-forwarded-for": CANARY,
        f"x-owngate-{CANARY}": CANARY,
        f"x-{CANARY}": CANARY,
    }
    function = {"name": CANARY, "description": CANARY, "parameters": {"type": "object"}}
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": CANARY + INJECTION, "name": CANARY}],
        "user": CANARY + INJECTION,
        "metadata": {CANARY: CANARY},
        "stop": [CANARY],
        "tools": [{"type": "function", "function": function}],
        "response_format": {"type": "json_schema", "json_schema": {"name": CANARY}},
        CANARY: CANARY,
    }
    models = ("ok", *ERRORS, "att", *(f"hosted-{m}" for m in ("ok", *ERRORS)), CANARY)
    for model in models:
        for stream in (False, True):
            yield (
                "/v1/chat/completions",
                headers,
                orjson.dumps({**body, "model": model, "stream": stream}),
            )
    # A hosted provider refuses the unknown field (unsent_fields.py: 400, its name never
    # repeated): the same body without it is answered, so a hosted answer is recorded.
    served = {k: v for k, v in body.items() if k != CANARY}
    for stream in (False, True):
        yield (
            "/v1/chat/completions",
            headers,
            orjson.dumps({**served, "model": "hosted-ok", "stream": stream}),
        )
    chat = orjson.dumps({**body, "model": "ok"})
    for target, field in (("/v1/completions", "prompt"), ("/v1/embeddings", "input")):
        for model in ("ok", "e500", "e400", "hosted-ok", "hosted-e500", "hosted-e400", CANARY):
            fields = {field: CANARY, "user": CANARY, "metadata": {CANARY: CANARY}}
            yield target, headers, orjson.dumps({**fields, "model": model})
    traced = {**headers, "traceparent": f"00-{CLIENT_TRACE}-b7ad6b7169203331-01"}
    for model in ("ok", "hosted-ok"):
        yield "/v1/chat/completions", traced, orjson.dumps({**body, "model": model})
    for _ in range(3):  # past the slow tenant's limit
        yield "/v1/chat/completions", {**headers, "authorization": f"Bearer {SLOW_KEY}"}, chat
    yield "/v1/models", headers, b""
    for label in (CANARY + '"},{"forged":1', f"phi, {CANARY}", ""):
        yield "/v1/chat/completions", {**headers, "x-data-class": label}, chat
    yield "/v1/chat/completions", {**headers, "authorization": f"Bearer og-{CANARY}"}, chat
    yield "/v1/chat/completions", {**headers, "authorization": CANARY}, chat
    yield "/v1/chat/completions", {**headers, "content-type": CANARY}, chat
    yield f"/v1/{CANARY}?{CANARY}={CANARY}", headers, chat
    yield f"/v1/chat/completions?{CANARY}={CANARY}", headers, chat
    yield f"/v1/provenance/receipts/{CANARY}", headers, b""
    for refused in ({"stream": CANARY}, {"stream_options": CANARY}, {"model": [CANARY]}):
        yield "/v1/chat/completions", headers, orjson.dumps({**body, **refused})
    for raw in (b'{"model": "ok", "' + CANARY.encode() + b'": ', b'{"model": "ok", "model": "x"}'):
        yield "/v1/chat/completions", headers, raw
    yield "/v1/chat/completions", headers, b'{"model": "ok", "x": "' + b"x" * (9 << 20) + b'"}'


def _sweep(gateway: GatewayProcess, answers: list[int]) -> None:
    for target, headers, body in _requests():
        method = "GET" if target.startswith(("/v1/provenance/", "/v1/models")) else "POST"
        url = gateway.url + target
        answers.append(
            httpx.request(method, url, headers=headers, content=body, timeout=30).status_code
        )
    assert httpx.get(gateway.url + "/v1/chat/completions", timeout=10).status_code == 405
    for raw in (
        build_request(b"POST", b"/v1/chat/completions", [b"x-" + CANARY.encode() + b"\x01: v"]),
        build_request(CANARY.encode(), b"/" + CANARY.encode(), [b"host: x"]),
        build_request(b"POST", b"/", [b"content-length: " + CANARY.encode()]),
        build_request(b"POST", b"/", [b"x-big: " + CANARY.encode() * 4000]),
        *_framing(),
    ):
        outcome = exchange(gateway.port, raw, half_close=True, timeout_s=15)
        answers.extend(response.status for response in outcome.responses)


def _framing() -> Iterator[bytes]:
    """Requests with a key whose framing carries the canary: a chunk extension and a
    trailer, a transfer coding, an expectation, a content coding, an absolute-form target
    and its host, an HTTP version."""
    canary = CANARY.encode()
    key = [b"host: x", b"authorization: Bearer " + KEY.encode()]
    chunked = [*key, b"content-type: application/json", b"transfer-encoding: chunked"]
    sized = [*key, b"content-type: application/json", b"content-length: 2"]
    chunks = b"2;" + canary + b"=x\r\n{}\r\n0\r\n" + canary + b": y\r\n\r\n"
    yield build_request(b"POST", b"/v1/chat/completions", chunked, chunks)
    yield build_request(b"POST", b"/v1/chat/completions", [*key, b"transfer-encoding: " + canary])
    for line in (b"expect: " + canary, b"content-encoding: " + canary):
        yield build_request(b"POST", b"/v1/chat/completions", [*sized, line], b"{}")
    target = b"http://" + canary + b"/v1/chat/completions"
    yield build_request(b"POST", target, [b"host: " + canary, *sized[1:]], b"{}")
    yield build_request(b"POST", b"/v1/chat/completions", sized, b"{}", b"HTTP/" + canary)


def _views(admin: str, answers: list[int]) -> list[str]:
    """What the admin API shows an operator, a security team and an auditor."""
    headers = {"authorization": f"Bearer {ADMIN_TOKEN}"}
    paths = ["status", "tenants", "policies", "timeline/backends", "timeline/policies"]
    paths += ["timeline/log", "log/cosignatures", "whoami", "keys", "log/report"]
    views = []
    for path in paths:
        answer = httpx.get(f"{admin}/admin/v1/{path}", headers=headers, timeout=30)
        assert answer.status_code == 200, (path, answer.text)
        views.append(answer.text)
    # Whoever reaches the admin listener without the token, or with a canary for one.
    strangers = (
        {"authorization": f"Bearer {CANARY}", "user-agent": CANARY, "origin": f"http://{CANARY}"},
        {"x-forwarded-for": CANARY, "host": CANARY, "referer": CANARY},
    )
    for target in (f"/admin/v1/{CANARY}", f"/{CANARY}?{CANARY}=1", "/admin/v1/status"):
        for stranger in strangers:
            answers.append(httpx.get(admin + target, headers=stranger, timeout=30).status_code)
    for target in ("/admin/v1/keys", "/admin/v1/reload"):
        stranger = {**strangers[0], "content-type": "application/json"}
        body = orjson.dumps({CANARY: CANARY, "tenant": CANARY})
        answer = httpx.post(admin + target, headers=stranger, content=body, timeout=30)
        answers.append(answer.status_code)
    port = int(admin.rsplit(":", 1)[1])
    for raw in (
        build_request(b"POST", b"/admin/v1/keys", [b"x-" + CANARY.encode() + b"\x01: v"]),
        build_request(CANARY.encode(), b"/" + CANARY.encode(), [b"host: x"]),
        build_request(b"POST", b"/admin/v1/keys", [b"content-length: " + CANARY.encode()]),
        build_request(b"GET", b"/admin/v1/status", [b"x-big: " + CANARY.encode() * 4000]),
    ):
        outcome = exchange(port, raw, half_close=True, timeout_s=15)
        answers.extend(response.status for response in outcome.responses)
    views.append(httpx.get(admin + "/readyz", timeout=30).text)
    log = httpx.get(f"{admin}/admin/v1/log/requests/none", headers=headers, timeout=30)
    views.append(log.text)
    answers.append(log.status_code)
    return views


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with receiving() as started:
        yield started


# Each log format, and what shows its access log line of a request.
FORMATS = {"json": b'"event":"request"', "console": b"] request "}


@pytest.mark.parametrize("log_format", FORMATS)
def test_no_client_or_backend_string_reaches_any_output(
    start_raw: Callable[[Answer], RawBackend], receiver: Receiver, tmp_path: Path, log_format: str
) -> None:
    private, hosted = start_raw(_answer), start_raw(_answer)
    sidecar = start_sidecar(tmp_path / "attest", "sweep-sidecar", start_raw(_answer).url)
    directory = tmp_path / "gw"
    (directory / "policies").mkdir(parents=True)
    (directory / "policies" / "sweep.yaml").write_text(POLICY)
    vkey = write_signing_key(directory / "log.key", "sweep.test/log")
    witness_key = write_signing_key(tmp_path / "witness.key", "witness.test/sweep")
    WitnessState.open(tmp_path / "witness.json", new=True).close()
    witness_port = free_port()
    argv = owngate_argv("witness", "serve", "--key", str(tmp_path / "witness.key"))
    argv += ["--log", vkey, "--state", str(tmp_path / "witness.json"), "--log-level", "debug"]
    witness = ServerProcess("witness", [*argv, "--port", str(witness_port)], tmp_path, witness_port)
    env = {
        "NO_COLOR": "1",
        "HOSTED_KEY": "test-key",
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_BSP_SCHEDULE_DELAY": "600000",  # the spans come in the flush at shutdown
    }
    config = _config(private, hosted, sidecar, (witness.url, witness_key), log_format)
    gateway = GatewayProcess(config, directory, env=env)
    answers: list[int] = []
    try:
        until(lambda: _answers(witness), "the witness answering", timeout=30, interval=0.05)
        gateway.start()
        _sweep(gateway, answers)
        # a client that reaches the witness itself
        for target in ("/add-checkpoint", "/" + CANARY):
            httpx.post(
                witness.url + target, content=CANARY.encode() + INJECTION.encode(), timeout=10
            )
        metrics = httpx.get(gateway.url + "/metrics", timeout=10).text
        metrics += httpx.get(gateway.url + "/readyz", timeout=10).text
        views = _views(f"http://127.0.0.1:{config['admin']['listen']['port']}", answers)
    finally:
        assert gateway.stop() == 0, gateway.output()
        assert sidecar.stop() == 0
        witness.proc.send_signal(signal.SIGTERM)
        witness.proc.wait(timeout=30)
    assert 500 not in answers, answers
    assert {200, 400, 401, 404, 413, 415, 429, 431, 502, 503} <= set(answers), answers
    # No client header reaches a backend, hosted or private (its body is the request's own
    # business): neither a canary nor a trace context of the client's (tracestate, baggage).
    for post in hosted.posts + private.posts:
        head = post.head.lower()
        assert CANARY.lower().encode() not in head and b"forged" not in head, post.head
        assert CLIENT_TRACE.encode() not in head, post.head
        assert b"\nbaggage:" not in head and b"\ntracestate:" not in head, post.head
    audits = [
        subprocess.run(
            owngate_argv("audit", *verb, str(directory / "log")),
            capture_output=True,
            timeout=120,
            check=False,
        )
        for verb in (["verify", "--key", vkey], ["show", "--records"])
    ]
    assert [audit.returncode for audit in audits] == [0, 0], audits[0].stdout[-2000:]
    outputs = {
        "gateway": b"\n".join(gateway.written()),
        "spans": b"".join(receiver.bodies),
        "metrics": metrics.encode(),
        "admin API": "\n".join(views).encode(),
        "sidecar": sidecar.process.log.read_bytes()
        + b"".join(p.read_bytes() for p in sidecar.log.rglob("*") if p.is_file()),
        "witness": witness.log.read_bytes(),
        "audit": b"".join(audit.stdout + audit.stderr for audit in audits),
    }
    assert FORMATS[log_format] in outputs["gateway"] and receiver.bodies  # they are on
    assert b'"upstream"' in outputs["gateway"]  # a hosted answer was recorded
    for name, data in outputs.items():
        # any letter case: a label is lowercased before it is judged
        assert CANARY.upper().encode() not in data.upper(), (name, _around(data))
        assert b"forged" not in data, name


def _answers(server: ServerProcess) -> bool:
    """Whether `server` answers HTTP at all yet (the witness has no page that is 200)."""
    assert server.proc.poll() is None, server.output()
    try:
        return httpx.get(server.url + "/", timeout=2).status_code > 0
    except httpx.TransportError:
        return False


def _around(data: bytes) -> bytes:
    at = data.upper().find(CANARY.upper().encode())
    return data[max(0, at - 300) : at + 100]
