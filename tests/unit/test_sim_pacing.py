"""The simulator's paced streams (`token_interval_s`): one write per token, on a schedule.

The app is driven in-process on a `VirtualClock`, so the test reads when each write was
made without waiting for real time.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import orjson
import pytest

from gateway.sim import SimSettings, VirtualClock, create_sim_app

INTERVAL = 0.02


def _stream(settings: SimSettings, max_tokens: int) -> list[tuple[float, dict[str, Any]]]:
    """(clock time, ASGI message) of every message the app sends for one chat stream."""
    clock = VirtualClock(100.0)
    app = create_sim_app(settings, clock=clock)
    body = orjson.dumps(
        {
            "model": "sim-model",
            "messages": [{"role": "user", "content": "pace me"}],
            "max_tokens": max_tokens,
            "stream": True,
        }
    )
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json")],
        "http_version": "1.1",
        "scheme": "http",
        "server": ("127.0.0.1", 8000),
        "client": ("127.0.0.1", 9000),
    }
    sent: list[tuple[float, dict[str, Any]]] = []
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # the client never leaves
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append((clock.now(), message))

    asyncio.run(asyncio.wait_for(app(scope, receive, send), timeout=10.0))
    return sent


def _events(body: bytes) -> list[bytes]:
    return [e for e in body.split(b"\n\n") if e]


def test_paced_stream_writes_each_token_alone_on_schedule() -> None:
    settings = SimSettings(zero_latency=True, token_interval_s=INTERVAL)
    sent = _stream(settings, max_tokens=5)
    assert sent[0][1]["type"] == "http.response.start"
    bodies = [(at, m["body"]) for at, m in sent[1:]]
    start = bodies[0][0]
    # role + first token together at once, then one token per write, INTERVAL apart
    assert [len(_events(body)) for _, body in bodies[:5]] == [2, 1, 1, 1, 1]
    for index, (at, _) in enumerate(bodies[:5]):
        assert at - start == pytest.approx(index * INTERVAL)
    role = orjson.loads(_events(bodies[0][1])[0][6:])
    assert role["choices"][0]["delta"]["role"] == "assistant"
    token_events = [event for _, body in bodies[:5] for event in _events(body)][1:]
    contents = [orjson.loads(e[6:])["choices"][0]["delta"]["content"] for e in token_events]
    assert len(contents) == 5 and all(contents)
    # the finish chunk and [DONE] right after the last token, ending the response
    assert bodies[5][0] == pytest.approx(bodies[4][0])
    assert _events(bodies[5][1])[-1] == b"data: [DONE]"
    assert sent[-1][1].get("more_body", False) is False


def test_unpaced_zero_latency_stream_takes_no_time() -> None:
    sent = _stream(SimSettings(zero_latency=True), max_tokens=5)
    assert {at for at, _ in sent} == {100.0}
    assert len(sent) == 1 + 1 + 5 + 1  # start, role, one message per token, end


@pytest.mark.parametrize(
    "changes",
    [
        {"token_interval_s": -0.01},
        {"token_interval_s": float("nan")},
        {"token_interval_s": 0.02, "coalesce_chunks": True},
    ],
)
def test_bad_pacing_is_refused(changes: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="token_interval_s"):
        dataclasses.replace(SimSettings(zero_latency=True), **changes)
