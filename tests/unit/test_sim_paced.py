"""The simulator's paced streams (`token_interval_s`), on virtual time: one write per token,
the interval between writes, none after the last; a client that leaves ends the pacing."""

from __future__ import annotations

import argparse
import asyncio
import itertools
from typing import Any

import orjson
import pytest

from gateway.asgi import Message
from gateway.cli import sim as sim_cli
from gateway.sim import SimSettings, VirtualClock, create_sim_app


def _scope() -> dict[str, Any]:
    return {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json")],
    }


async def _stream(
    settings: SimSettings, max_tokens: int, leave_after: int | None = None
) -> tuple[list[tuple[float, bytes]], VirtualClock]:
    """POST a stream to a simulator on virtual time: (virtual time, body) per write."""
    clock = VirtualClock()
    app = create_sim_app(settings, clock=clock)
    body = orjson.dumps(
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens, "stream": True}
    )
    writes: list[tuple[float, bytes]] = []
    left = asyncio.Event()
    requested = False

    async def receive() -> dict[str, Any]:
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": body, "more_body": False}
        await left.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        if message["type"] == "http.response.body":
            writes.append((clock.now(), message["body"]))
            if leave_after is not None and len(writes) == leave_after:
                left.set()

    await asyncio.wait_for(app(_scope(), receive, send), 10)
    return writes, clock


def test_a_paced_stream_writes_one_token_per_write_interval_apart() -> None:
    settings = SimSettings(models=("m",), zero_latency=True, token_interval_s=0.02)
    writes, _ = asyncio.run(_stream(settings, max_tokens=5))
    assert len(writes) == 5 + 1  # five tokens, then the finish chunk and [DONE]
    first = writes[0][1]
    assert first.count(b"data:") == 2 and b'"role":"assistant"' in first  # role + token
    for _, chunk in writes[1:5]:
        assert chunk.count(b"data:") == 1 and b'"content"' in chunk
    assert writes[5][1].endswith(b"data: [DONE]\n\n")
    times = [t for t, _ in writes]
    gaps = [round(b - a, 9) for a, b in itertools.pairwise(times)]
    assert gaps == [0.02, 0.02, 0.02, 0.02, 0.0]  # no pause before the first or the end


def test_unpaced_zero_latency_streams_never_wait() -> None:
    settings = SimSettings(models=("m",), zero_latency=True)
    writes, clock = asyncio.run(_stream(settings, max_tokens=5))
    assert clock.now() == 0.0
    assert len(writes) == 1 + 5 + 1  # role, tokens, end: one message each


def test_a_client_that_leaves_ends_a_paced_stream() -> None:
    settings = SimSettings(models=("m",), zero_latency=True, token_interval_s=0.5)
    writes, clock = asyncio.run(_stream(settings, max_tokens=1000, leave_after=3))
    # the disconnect lands a few loop turns later: a few more tokens, not the 1,000
    assert 3 <= len(writes) <= 10
    assert clock.now() <= 5.0


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"token_interval_s": -0.1}, "token_interval_s must be >= 0"),
        ({"token_interval_s": 0.02, "coalesce_chunks": True}, "not with coalesce_chunks"),
    ],
)
def test_bad_pacing_settings(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SimSettings(zero_latency=True, **changes)


def test_the_cli_flag_and_its_environment_default(monkeypatch: pytest.MonkeyPatch) -> None:
    parser = argparse.ArgumentParser(prog="owngate")
    sim_cli.register(parser.add_subparsers())
    args = parser.parse_args(["sim", "--zero-latency", "--token-interval", "0.02"])
    assert sim_cli.build_settings(args).token_interval_s == 0.02
    monkeypatch.setenv("OWNGATE_SIM_TOKEN_INTERVAL", "0.05")
    parser = argparse.ArgumentParser(prog="owngate")
    sim_cli.register(parser.add_subparsers())
    assert sim_cli.build_settings(parser.parse_args(["sim"])).token_interval_s == 0.05
