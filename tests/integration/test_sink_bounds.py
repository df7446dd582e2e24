"""What thousands of distinct client strings leave in a real `owngate serve`'s sinks.

Model names, data-class labels, paths, API keys, request ids and W3C trace headers (a
valid `traceparent` each time, a `tracestate` of 1,000 list members, 8 KB, and
`baggage`), each new in every request: `/metrics` gains no series from the second wave
on (the first one adds the statuses the gateway answered: 400, 401, 404), the exported
spans hold none of the trace headers' text (a client's `traceparent` is a link with its
two ids, never its `tracestate`), and the private backend gets the gateway's own
`traceparent` and request id, never the client's.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx

from gateway.tenants import hash_api_key
from tests.helpers.gateways import ADMIN, backend
from tests.helpers.net import free_port
from tests.helpers.otlp_receiver import receiving
from tests.helpers.processes import GatewayProcess
from tests.helpers.raw_backend import Answer, RawBackend, json_answer

KEY = "sk-sinkbounds-tenant-key-0123"
MARK = "sinkmark"
POLICY = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: acme}
spec:
  tenants: [acme]
  residency: {allow: ["*"]}
  retention: {max_days: any, training: true}
  data_classes:
    public: {fallback: {mode: never}}
  fallback: {mode: never}
"""
ANSWER = (
    b'{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,'
    b'"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],'
    b'"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}'
)
CHAT = {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
TRACESTATE = ",".join(f"{MARK}{n}=v{n}" for n in range(1000))  # 1,000 members, ~11 KB
KINDS = 5


def _series(client: httpx.Client, url: str) -> set[str]:
    """Every series `/metrics` shows: its name and labels, without the value."""
    text = client.get(f"{url}/metrics").text
    return {line.rpartition(" ")[0] for line in text.splitlines() if line and line[0] != "#"}


def _wave(client: httpx.Client, url: str, first: int, count: int) -> dict[tuple[int, int], int]:
    """`count` requests, each with new client strings of one kind (by number)."""
    auth = {"authorization": f"Bearer {KEY}"}
    chat = f"{url}/v1/chat/completions"
    seen: dict[tuple[int, int], int] = {}
    for n in range(first, first + count):
        kind = n % KINDS
        if kind == 0:  # an unknown model name
            answer = client.post(chat, json={**CHAT, "model": f"{MARK}-model-{n}"}, headers=auth)
        elif kind == 1:  # an undeclared data-class label
            answer = client.post(chat, json=CHAT, headers={**auth, "x-data-class": f"{MARK}{n}"})
        elif kind == 2:  # a path the gateway does not serve
            answer = client.post(f"{url}/v1/{MARK}-{n}", json=CHAT, headers=auth)
        elif kind == 3:  # a wrong API key
            answer = client.post(chat, json=CHAT, headers={"authorization": f"Bearer {MARK}{n}"})
        else:  # served, with the client's own trace headers and request id
            traced = {
                **auth,
                "traceparent": f"00-{n + 1:032x}-{n + 1:016x}-01",
                "tracestate": TRACESTATE,
                "baggage": f"{MARK}=baggage{n}",
                "x-request-id": f"{MARK}-rid-{n}",
            }
            answer = client.post(chat, json=CHAT, headers=traced)
        seen[kind, answer.status_code] = seen.get((kind, answer.status_code), 0) + 1
    return seen


def test_distinct_client_strings_add_no_series_and_reach_no_span(
    start_raw: Callable[[Answer], RawBackend], tmp_path: Path
) -> None:
    raw = start_raw(json_answer(ANSWER))
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "acme.yaml").write_text(POLICY)
    config = {
        "listen": {"host": "127.0.0.1", "port": free_port()},
        "logging": {"format": "json", "level": "info", "access_log": True},
        "backends": [backend("gpu", raw.url, "m")],
        "tenants": [{"id": "acme", "api_key_hashes": [hash_api_key(KEY)], "models": ["*"]}],
        "policy": {"paths": [str(tmp_path / "policies")]},
        "admin": ADMIN,
    }
    with receiving() as receiver:
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
            "OTEL_BSP_SCHEDULE_DELAY": "600000",  # exported at the shutdown flush
            "OTEL_BSP_MAX_QUEUE_SIZE": "4096",
        }
        gateway = GatewayProcess(config, tmp_path / "gw", env=env).start()
        try:
            with httpx.Client(timeout=30) as client:
                first = _wave(client, gateway.url, 0, 5 * KINDS)
                before = _series(client, gateway.url)
                second = _wave(client, gateway.url, 5 * KINDS, 400 * KINDS)
                after = _series(client, gateway.url)
        finally:
            assert gateway.stop() == 0, gateway.output()
        spans, _ = receiver.spans()
        exported = b"".join(receiver.bodies)
    expected = {(0, 404), (1, 400), (2, 404), (3, 401), (4, 200)}
    assert set(first) == set(second) == expected, (first, second)
    assert after == before, sorted(after ^ before)
    assert not [each for each in after if MARK in each]
    # Spans: one request span per proxied request, one attempt span per served one; a
    # link per traced request, with the client's two ids and nothing of its tracestate.
    assert MARK.encode() not in exported
    links = [link for span in spans for link in span.links]
    assert len(links) == 405
    assert all(link.trace_state == "" for link in links)
    # The backend: the gateway's own traceparent (a new trace) and request id.
    assert len(raw.posts) == 405
    clients = {b"%032x" % (n + 1) for n in range(5 * KINDS + 400 * KINDS)}
    for post in raw.posts:
        (traceparent,) = post.header_values(b"traceparent")
        assert traceparent.split(b"-")[1] not in clients
        assert post.header_values(b"tracestate") == post.header_values(b"baggage") == []
        (request_id,) = post.header_values(b"x-request-id")
        assert request_id.startswith(b"req_")
    assert MARK not in gateway.stdout() + gateway.stderr()
