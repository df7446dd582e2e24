"""A stream that carries an error event is a failed request to every benchmark client.

vLLM ends a stream that fails after its first tokens with `data: {"error": ...}` and then
`data: [DONE]`; a gateway relays both. The OpenAI SDK raises at the error event, so the
client got no answer: counted as completed, such streams made a failing target look
like a fast one (fewer tokens, an early end) and let its verdicts be judged. Each client
(the overhead load generator, the seed-load client, the workloads' vLLM-compatible
client, the instruction counter's load, the routing benchmark's replay) is driven
against a scripted backend that answers exactly that; each must count every such stream
as an error. A clean stream from the same backend must still count as completed, so the
checks cannot pass by failing everything.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from owngate_bench import instructions, loadgen, openloop, seedclient, workloads_client
from owngate_bench.arrivals import TraceRequest, write_trace
from owngate_bench.loadspec import LoadSpec
from owngate_bench.seedclient import SeedSpec
from owngate_bench.workloads_client import ClientSpec
from tests.helpers.raw_backend import Post, RawBackend

pytestmark = pytest.mark.bench

_CONTENT = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
_ERROR = b'data: {"error":{"message":"engine died","type":"internal_error","code":500}}\n\n'
_DONE = b"data: [DONE]\n\n"
_REQUESTS = 3


def _backend(events: bytes) -> RawBackend:
    async def answer(writer: asyncio.StreamWriter, post: Post) -> bool:
        head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        writer.write(head + b"content-length: %d\r\n\r\n" % len(events) + events)
        await writer.drain()
        return b"connection: close" not in post.head.lower()

    return RawBackend(answer).start()


@pytest.fixture(params=["error event", "clean"])
def stream(request: pytest.FixtureRequest) -> Iterator[tuple[RawBackend, bool]]:
    failing = request.param == "error event"
    body = _CONTENT * 3 + (_ERROR if failing else _CONTENT) + _DONE
    backend = _backend(body)
    try:
        yield backend, failing
    finally:
        backend.stop()


def test_the_overhead_load_generator_counts_an_error_event_as_an_error(
    stream: tuple[RawBackend, bool],
) -> None:
    backend, failing = stream
    spec = LoadSpec(
        host="127.0.0.1",
        port=backend.port,
        api_key="sk-test",
        model="m",
        stream=True,
        concurrency=1,
        duration_s=10.0,
        max_requests=_REQUESTS,
        warmup_s=0.0,
        warmup_requests=0,
        grace_s=10.0,
    )
    result = loadgen.run_spec(spec)
    if failing:
        assert result["requests"] == 0, result
        assert result["error_kinds"] == {"error_event": _REQUESTS}, result
    else:
        assert (result["requests"], result["errors"]) == (_REQUESTS, 0), result


def test_the_seed_load_client_counts_an_error_event_as_an_error(
    stream: tuple[RawBackend, bool],
) -> None:
    backend, failing = stream
    spec = SeedSpec(
        host="127.0.0.1",
        port=backend.port,
        api_key="sk-test",
        model="m",
        rate=20.0,
        duration_s=2.0,
        max_tokens=4,
        warmup_s=0.0,
        grace_s=10.0,
        max_requests=_REQUESTS,
        connections=1,
    )
    result = seedclient.run_spec(spec)
    assert result["requests"] == _REQUESTS, result
    if failing:
        assert result["outcomes"] == {"error_event": _REQUESTS}, result
        assert result["errors"] == _REQUESTS
    else:
        assert (result["outcomes"], result["errors"]) == ({"ok": _REQUESTS}, 0), result


def test_the_workloads_client_counts_an_error_event_as_a_failed_request(
    stream: tuple[RawBackend, bool],
) -> None:
    backend, failing = stream
    spec = ClientSpec(
        host="127.0.0.1",
        port=backend.port,
        model="m",
        input_len=16,
        output_len=4,
        num_prompts=_REQUESTS,
        request_rate=math.inf,
        max_concurrency=1,
        seed=1,
        arrival_seed=2,
        timeout_s=10.0,
    )
    summary = asyncio.run(workloads_client._run(spec))
    if failing:
        assert (summary["completed"], summary["failed"]) == (0, _REQUESTS), summary
        assert summary["errors"][0].startswith("error event in the stream"), summary
    else:
        assert (summary["completed"], summary["failed"]) == (_REQUESTS, 0), summary


def test_the_instruction_counters_load_fails_on_an_error_event(
    stream: tuple[RawBackend, bool],
) -> None:
    backend, failing = stream
    body = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}'
    if failing:
        with pytest.raises(RuntimeError, match="error event"):
            instructions._load(backend.port, "sk-test", body, _REQUESTS, 1)
    else:
        assert (
            instructions._load(backend.port, "sk-test", body, _REQUESTS, 1) == 4 * _REQUESTS
        )  # its `data: {` events


def test_the_routing_replay_counts_an_error_event_as_an_error(
    stream: tuple[RawBackend, bool], tmp_path: Path
) -> None:
    backend, failing = stream
    trace = tmp_path / "trace.jsonl"
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    write_trace(trace, [TraceRequest(0.01 * i, "chat", body) for i in range(_REQUESTS)])
    spec = openloop.ReplaySpec(
        host="127.0.0.1",
        port=backend.port,
        api_key="sk-test",
        trace=str(trace),
        grace_s=10.0,
        connections=1,
    )
    outcomes = [row[3] for row in openloop.replay(spec)["requests"]]
    assert outcomes == ["error_event" if failing else "ok"] * _REQUESTS
