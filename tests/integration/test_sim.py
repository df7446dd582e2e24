"""The simulator over real sockets: OpenAI shapes, queueing, metrics, faults, capture.

Each test runs a `SimApp` on a uvicorn `ServerThread` and talks to it with httpx or the
official `openai` SDK. Timed tests use small latencies and bounded polling loops.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import math
import ssl
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import httpx
import openai
import orjson
import pytest
from openai import OpenAI

import gateway.sim
from gateway.cli import sim as sim_cli
from gateway.serving import ServerThread
from gateway.sim import Faults, Kind, SimApp, SimSettings, create_sim_app
from tests.helpers.waiting import until, until_async

CHAT = "/v1/chat/completions"
HELLO: list[Any] = [{"role": "user", "content": "Hello, simulator! How are you today?"}]
HELLO_TOKENS = math.ceil(len(b"Hello, simulator! How are you today?") / 4)


@dataclasses.dataclass
class Sim:
    """One running simulator and clients bound to it."""

    app: SimApp
    url: str
    http: httpx.Client
    openai: OpenAI


Start = Callable[[SimSettings], Sim]


@pytest.fixture(scope="module")
def tls() -> ssl.SSLContext:
    # Built once: every httpx client otherwise loads the CA store (~30 ms), unused on http://.
    return ssl.create_default_context()


class Servers:
    """Simulators on real sockets with clients bound to them, stopped on `close`."""

    def __init__(self, tls: ssl.SSLContext) -> None:
        self._tls = tls
        self._stack = ExitStack()
        self._started: dict[SimSettings, Sim] = {}

    def start(self, settings: SimSettings) -> Sim:
        app = create_sim_app(settings)
        server = self._stack.enter_context(ServerThread(app))
        # Entered after the server, so closed before it: the server then stops without
        # waiting for idle keep-alive connections.
        http = self._stack.enter_context(
            httpx.Client(base_url=server.url, verify=self._tls, timeout=10)
        )
        client = self._stack.enter_context(
            OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=10)
        )
        return Sim(app, server.url, http, client)

    def reuse(self, settings: SimSettings) -> Sim:
        """A server with these settings, started once and kept for the module."""
        if settings not in self._started:
            self._started[settings] = self.start(settings)
        return self._started[settings]

    def close(self) -> None:
        self._stack.close()


@pytest.fixture
def sim(tls: ssl.SSLContext) -> Iterator[Start]:
    """Fresh simulators, for tests that change faults or read counters."""
    servers = Servers(tls)
    try:
        yield servers.start
    finally:
        servers.close()


@pytest.fixture(scope="module")
def shared(tls: ssl.SSLContext) -> Iterator[Start]:
    """Simulators shared by the module's read-only tests (one per distinct settings)."""
    servers = Servers(tls)
    try:
        yield servers.reuse
    finally:
        servers.close()


def fast(kind: Kind = "vllm", **changes: Any) -> SimSettings:
    """Timed settings quick enough for tests: 2 ms decode steps, instant prefill."""
    base = SimSettings.for_kind(kind, models=("sim-a", "sim-b"))
    tuned = dataclasses.replace(base, decode_tokens_per_s=500.0, prefill_tokens_per_s=1e6)
    return dataclasses.replace(tuned, **changes)


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in metrics")


def test_public_surface() -> None:
    for name in gateway.sim.__all__:
        assert hasattr(gateway.sim, name), name
    assert {"SimSettings", "Faults", "create_sim_app", "SimApp", "SimControl"} <= set(
        gateway.sim.__all__
    )


# -- shapes ----------------------------------------------------------------------------


@pytest.mark.parametrize("zero_latency", [False, True])
def test_chat_completion_shape(shared: Start, zero_latency: bool) -> None:
    client = shared(fast(zero_latency=zero_latency)).openai
    result = client.chat.completions.create(model="sim-b", messages=HELLO, max_tokens=7)
    assert result.id.startswith("chatcmpl-")
    assert result.object == "chat.completion"
    assert result.model == "sim-b"
    assert abs(result.created - time.time()) < 60
    choice = result.choices[0]
    assert choice.index == 0
    assert choice.finish_reason == "length"
    assert choice.message.role == "assistant"
    assert choice.message.content
    assert result.usage is not None
    assert result.usage.prompt_tokens == HELLO_TOKENS
    assert result.usage.completion_tokens == 7
    assert result.usage.total_tokens == HELLO_TOKENS + 7

    default = client.chat.completions.create(model="sim-a", messages=HELLO)
    assert default.choices[0].finish_reason == "stop"
    assert default.usage is not None
    assert default.usage.completion_tokens == 16


@pytest.mark.parametrize(
    ("zero_latency", "coalesce", "interval"),
    [(False, False, 0.0), (True, False, 0.0), (True, True, 0.0), (True, False, 0.001)],
)
def test_chat_stream_shape_and_usage(
    shared: Start, zero_latency: bool, coalesce: bool, interval: float
) -> None:
    settings = fast(zero_latency=zero_latency, coalesce_chunks=coalesce, token_interval_s=interval)
    client = shared(settings).openai
    chunks = list(
        client.chat.completions.create(
            model="sim-a",
            messages=HELLO,
            max_tokens=64,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    whole = client.chat.completions.create(model="sim-a", messages=HELLO, max_tokens=64)
    assert len({c.id for c in chunks}) == 1
    assert chunks[0].id.startswith("chatcmpl-")
    assert all(c.object == "chat.completion.chunk" and c.model == "sim-a" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    contents = [c.choices[0].delta.content for c in chunks[1:-2]]
    assert len(contents) == 64  # exactly max_tokens content chunks, one token each
    assert all(contents)
    assert all(a != b for a, b in itertools.pairwise(contents))
    assert chunks[-2].choices[0].finish_reason == "length"
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == []
    assert usage_chunk.usage is not None
    assert usage_chunk.usage.completion_tokens == 64
    assert usage_chunk.usage.prompt_tokens == HELLO_TOKENS
    # Same prompt, same text, streamed or not.
    assert "".join(c or "" for c in contents) == whole.choices[0].message.content


def test_sse_framing_on_the_wire(shared: Start) -> None:
    response = shared(fast()).http.post(
        CHAT, json={"messages": HELLO, "max_tokens": 5, "stream": True}
    )
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/event-stream"
    events = response.content.split(b"\n\n")
    assert events[-1] == b""
    assert events[-2] == b"data: [DONE]"
    assert all(e.startswith(b"data: {") for e in events[:-2])
    assert len(events[:-2]) == 1 + 5 + 1  # role, tokens, finish; no usage unless asked
    assert all("usage" not in orjson.loads(e[6:]) for e in events[:-2])


@pytest.mark.parametrize("zero_latency", [False, True])
def test_legacy_completions(shared: Start, zero_latency: bool) -> None:
    client = shared(fast(zero_latency=zero_latency)).openai
    result = client.completions.create(model="sim-a", prompt="abcdefgh", max_tokens=3)
    assert result.id.startswith("cmpl-")
    assert result.object == "text_completion"
    assert result.choices[0].finish_reason == "length"
    assert result.usage is not None
    assert result.usage.prompt_tokens == 2
    chunks = list(
        client.completions.create(model="sim-a", prompt="abcdefgh", max_tokens=3, stream=True)
    )
    assert [c.choices[0].finish_reason for c in chunks] == [None, None, None, "length"]
    assert "".join(c.choices[0].text for c in chunks) == result.choices[0].text


def test_embeddings(shared: Start) -> None:
    client = shared(fast()).openai
    result = client.embeddings.create(model="sim-a", input=["one", "two"])  # base64 on wire
    again = client.embeddings.create(model="sim-a", input="one", encoding_format="float")
    sized = client.embeddings.create(model="sim-a", input="one", dimensions=40)
    assert [d.index for d in result.data] == [0, 1]
    first = result.data[0].embedding
    assert len(first) == 16
    assert math.isclose(sum(v * v for v in first), 1.0, rel_tol=1e-5)
    assert again.data[0].embedding == pytest.approx(first, rel=1e-5)
    assert result.data[1].embedding != first
    assert len(sized.data[0].embedding) == 40
    assert result.usage.prompt_tokens == 2


@pytest.mark.parametrize(
    ("kind", "owner", "ids"),
    [
        ("vllm", "vllm", ["sim-a", "sim-b"]),
        ("llamacpp", "llamacpp", ["sim-a"]),
        ("sglang", "sglang", ["sim-a", "sim-b"]),
    ],
)
def test_models(shared: Start, kind: Kind, owner: str, ids: list[str]) -> None:
    models = list(shared(fast(kind)).openai.models.list())
    assert [m.id for m in models] == ids
    assert {m.owned_by for m in models} == {owner}
    assert all(m.object == "model" for m in models)


def test_unknown_model_vllm_404_and_llamacpp_echo(shared: Start) -> None:
    body = {"model": "nope", "messages": HELLO, "max_tokens": 2}
    response = shared(fast()).http.post(CHAT, json=body)
    assert response.status_code == 404
    assert response.json() == {
        "error": {
            "message": "The model `nope` does not exist.",
            "type": "NotFoundError",
            "param": "model",
            "code": 404,
        }
    }
    response = shared(fast("llamacpp")).http.post(CHAT, json=body)
    assert response.status_code == 200
    assert response.json()["model"] == "sim-a"


@pytest.mark.parametrize(("kind", "status"), [("vllm", 400), ("llamacpp", 500), ("sglang", 400)])
def test_malformed_json(shared: Start, kind: Kind, status: int) -> None:
    http = shared(fast(kind)).http
    response = http.post(CHAT, content=b'{"messages": [', headers={"content-type": "json"})
    assert response.status_code == status
    assert response.json()["error"]["code"] == status
    assert http.post(CHAT, json={"messages": "not a list"}).status_code == 400


def test_context_too_long(shared: Start) -> None:
    response = shared(fast("llamacpp")).http.post(
        CHAT, json={"messages": HELLO, "max_tokens": 5000}
    )
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "exceed_context_size_error"


@pytest.mark.parametrize("kind", ["vllm", "llamacpp"])
def test_api_key(sim: Start, kind: Kind) -> None:
    http = sim(fast(kind, api_key="sekret")).http
    body = {"messages": HELLO, "max_tokens": 1}
    assert http.post(CHAT, json=body).status_code == 401
    assert http.post(CHAT, json=body, headers={"authorization": "Bearer no"}).status_code == 401
    assert http.post(CHAT, json=body, headers={"authorization": "Bearer sekret"}).status_code == 200
    assert http.get("/health").status_code == 200
    if kind == "llamacpp":
        assert http.get("/v1/models").status_code == 200  # public in llama-server
        assert http.get("/metrics").status_code == 401
    else:
        assert http.get("/v1/models").status_code == 401
        assert http.get("/metrics").status_code == 200


# -- load: queueing, batching, metrics, slots ------------------------------------------


@pytest.mark.parametrize(
    ("kind", "names", "labels"),
    [
        (
            "vllm",
            [
                "vllm:num_requests_running",
                "vllm:num_requests_waiting",
                "vllm:kv_cache_usage_perc",
                "vllm:prompt_tokens_total",
                "vllm:generation_tokens_total",
            ],
            '{engine="0",model_name="sim-a"}',
        ),
        (
            "llamacpp",
            [
                "llamacpp:requests_processing",
                "llamacpp:requests_deferred",
                "llamacpp:prompt_tokens_total",
                "llamacpp:tokens_predicted_total",
                "llamacpp:n_busy_slots_per_decode",
            ],
            "",
        ),
        (
            "sglang",
            ["sglang:num_queue_reqs", "sglang:num_running_reqs", "sglang:token_usage"],
            '{model_name="sim-a"}',
        ),
    ],
)
def test_metric_names(sim: Start, kind: Kind, names: list[str], labels: str) -> None:
    http = sim(fast(kind)).http
    http.post(CHAT, json={"messages": HELLO, "max_tokens": 3})
    response = http.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    text = response.text
    for name in names:
        assert f"# HELP {name} " in text
        assert f"# TYPE {name} " in text
        assert f"\n{name}{labels} " in text
    assert metric(text, f"{kind}:prompt_tokens_total") == HELLO_TOKENS


async def _concurrent_chats(url: str, count: int, max_tokens: int) -> list[int]:
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        body = {"messages": HELLO, "max_tokens": max_tokens}
        responses = await asyncio.gather(*(client.post(CHAT, json=body) for _ in range(count)))
    return [r.status_code for r in responses]


def test_queueing_shows_waiting_requests(sim: Start) -> None:
    s = sim(fast(slots=1, decode_tokens_per_s=100.0))  # 10 ms a token, 200 ms a request
    seen = {"waiting": 0.0, "running": 0.0}

    def observe() -> bool:
        text = s.http.get("/metrics").text
        for key in seen:
            seen[key] = max(seen[key], metric(text, f"vllm:num_requests_{key}"))
        # Both, not whichever scrape comes first: a busy machine may catch the queue
        # between one request's end and the next one's start.
        return seen["waiting"] >= 1 and seen["running"] >= 1

    loop = asyncio.new_event_loop()
    try:
        burst = loop.create_task(_concurrent_chats(s.url, 3, 20))
        # The loop runs the burst while this waits (sent, then queued at the simulator).
        what = "a request running and one waiting"
        waited = until_async(observe, what, timeout=30.0, interval=0.005)
        loop.run_until_complete(waited)
        statuses = loop.run_until_complete(burst)
    finally:
        loop.close()
    assert statuses == [200, 200, 200]
    assert seen == {"waiting": pytest.approx(seen["waiting"]), "running": 1.0}
    assert seen["waiting"] >= 1
    assert s.app.stats.completed == 3


def test_decode_slows_with_batch_size(sim: Start) -> None:
    url = sim(fast(decode_tokens_per_s=250.0, batch_slowdown=1.0)).url  # 4 ms a step alone

    def elapsed(concurrent: int) -> float:
        start = time.perf_counter()
        assert asyncio.run(_concurrent_chats(url, concurrent, 20)) == [200] * concurrent
        return time.perf_counter() - start

    alone = elapsed(1)  # 20 steps of 4 ms: ~80 ms
    batched = elapsed(4)  # 20 steps of 4 * (1 + 1.0 * 3) = 16 ms: >= 320 ms
    # Sleeps never end early, so the lower bound holds however loaded the machine is.
    assert batched >= 20 * 0.016
    assert batched > alone


def test_llamacpp_slots_and_props(sim: Start) -> None:
    s = sim(fast("llamacpp", decode_tokens_per_s=100.0))
    body = {"messages": HELLO, "stream": True, "max_tokens": 500}
    with s.http.stream("POST", CHAT, json=body):
        until(lambda: s.app.engine.running == 1, "one running", timeout=30.0, interval=0.005)
        slots = s.http.get("/slots").json()
        props = s.http.get("/props").json()
    assert props["total_slots"] == 4
    assert props["default_generation_settings"]["n_ctx"] == 4096
    assert len(slots) == 4
    assert set(slots[0]) >= {"id", "n_ctx", "is_processing", "n_prompt_tokens", "next_token"}
    busy = [slot for slot in slots if slot["is_processing"]]
    assert len(busy) == 1
    assert busy[0]["n_ctx"] == 4096
    assert busy[0]["n_prompt_tokens"] == HELLO_TOKENS
    assert busy[0]["next_token"][0]["n_decoded"] + busy[0]["next_token"][0]["n_remain"] == 500


def test_vllm_has_no_slots_endpoint(shared: Start) -> None:
    assert shared(fast()).http.get("/slots").status_code == 404


def test_disconnect_frees_the_slot(sim: Start) -> None:
    s = sim(fast(slots=1, decode_tokens_per_s=100.0))
    body = {"messages": HELLO, "stream": True, "max_tokens": 1000}  # would take 10 s
    with s.http.stream("POST", CHAT, json=body) as response:
        assert next(response.iter_lines()).startswith("data: ")
    until(
        lambda: s.app.engine.running == 0 and s.app.stats.cancelled == 1,
        "the request cancelled",
        timeout=30.0,
        interval=0.005,
    )
    start = time.perf_counter()
    assert s.http.post(CHAT, json={"messages": HELLO, "max_tokens": 2}).status_code == 200
    assert time.perf_counter() - start < 5.0  # about 10 s behind a slot still held
    until(lambda: s.app.stats.in_flight == 0, "none in flight", timeout=30.0, interval=0.005)
    assert s.app.engine.generation_tokens_total < 1000


def test_load_settings_flipped_at_run_time(sim: Start) -> None:
    s = sim(fast(decode_tokens_per_s=2.0))  # 500 ms a token
    s.app.control.decode_tokens_per_s = 1000.0
    start = time.perf_counter()
    assert s.http.post(CHAT, json={"messages": HELLO, "max_tokens": 20}).status_code == 200
    assert time.perf_counter() - start < 5.0  # 10 s at the old speed, 20 ms at the new
    s.app.control.decode_tokens_per_s = 2.0
    s.app.control.zero_latency = True
    start = time.perf_counter()
    assert s.http.post(CHAT, json={"messages": HELLO, "max_tokens": 50}).status_code == 200
    assert time.perf_counter() - start < 5.0  # 25 s if it were still timed


# -- faults ----------------------------------------------------------------------------


def test_slow_start_then_ready(sim: Start) -> None:
    # Windows no loaded machine outlasts before the asserts that need them open; the
    # short one only to be waited out (before: 0.3 s from start, 200 at load 20)
    s = sim(fast("llamacpp", faults=Faults(slow_start_s=600.0)))
    loading = {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}
    health = s.http.get("/health")
    chat = s.http.post(CHAT, json={"messages": HELLO})
    assert (health.status_code, health.json()) == (503, loading)
    assert (chat.status_code, chat.json()) == (503, loading)
    s.app.start_loading(0.3)  # ready on its own once the window has passed
    until(lambda: s.http.get("/health").status_code == 200, "healthy", timeout=30.0, interval=0.005)
    assert s.http.post(CHAT, json={"messages": HELLO}).status_code == 200
    s.app.start_loading(600.0)  # a restart, flipped at run time
    assert s.http.get("/health").status_code == 503
    s.app.start_loading(0.0)
    assert s.http.get("/health").json() == {"status": "ok"}


@pytest.mark.parametrize("kind", ["vllm", "llamacpp"])
def test_error_fault_flipped_at_run_time(sim: Start, kind: Kind) -> None:
    s = sim(fast(kind))
    assert s.http.post(CHAT, json={"messages": HELLO}).status_code == 200
    s.app.control.faults = Faults(error_rate=1.0)
    failed = s.http.post(CHAT, json={"messages": HELLO})
    s.app.control.faults = Faults()
    assert s.http.post(CHAT, json={"messages": HELLO}).status_code == 200
    assert failed.status_code == 500
    assert failed.json()["error"]["code"] == 500
    assert s.app.stats.errors == 1


def test_health_delay_answers_health_late_and_leaves_inference_alone(sim: Start) -> None:
    s = sim(fast("llamacpp", faults=Faults(health_delay_s=3600.0)))
    with pytest.raises(httpx.ReadTimeout):
        s.http.get("/health", timeout=0.3)  # the prober gives up; the handler ends with it
    assert s.http.post(CHAT, json={"messages": HELLO}).status_code == 200
    s.app.control.faults = Faults(health_delay_s=0.01)
    assert s.http.get("/health").json() == {"status": "ok"}  # late, but it answers
    with pytest.raises(ValueError, match="health_delay_s"):
        Faults(health_delay_s=-1.0)


def test_hang_fault_waits_for_the_client_to_leave(sim: Start) -> None:
    s = sim(fast(faults=Faults(hang_rate=1.0)))
    with pytest.raises(httpx.ReadTimeout):
        s.http.post(CHAT, json={"messages": HELLO}, timeout=0.3)
    until(
        lambda: s.app.stats.cancelled == 1 and s.app.stats.in_flight == 0,
        "the request cancelled, none in flight",
        timeout=30.0,
        interval=0.005,
    )
    assert s.app.stats.hangs == 1
    assert s.app.stats.completed == 0


@pytest.mark.parametrize(
    ("zero_latency", "coalesce"), [(False, False), (True, False), (True, True)]
)
def test_die_mid_stream(sim: Start, zero_latency: bool, coalesce: bool) -> None:
    faults = Faults(die_mid_stream_rate=1.0)
    s = sim(fast(zero_latency=zero_latency, coalesce_chunks=coalesce, faults=faults))
    lines: list[str] = []
    body = {"messages": HELLO, "stream": True, "max_tokens": 50}
    with s.http.stream("POST", CHAT, json=body) as response:
        assert response.status_code == 200
        with pytest.raises(httpx.RemoteProtocolError):
            lines.extend(line for line in response.iter_lines() if line)
    assert 1 <= len(lines) <= 4  # the role chunk and at most three tokens
    assert "data: [DONE]" not in lines
    with pytest.raises(httpx.RemoteProtocolError):
        s.http.post(CHAT, json={"messages": HELLO})
    with pytest.raises(openai.APIConnectionError):
        s.openai.chat.completions.create(model="sim-a", messages=HELLO)
    assert s.app.stats.died == 3


# -- determinism and capture -----------------------------------------------------------


def test_determinism_with_a_seed(sim: Start) -> None:
    body = {"messages": HELLO, "max_tokens": 12}

    def run(seed: int) -> tuple[list[int], str]:
        http = sim(fast(seed=seed, zero_latency=True, faults=Faults(error_rate=0.5))).http
        responses = [http.post(CHAT, json=body) for _ in range(16)]
        texts = [r.json()["choices"][0]["message"]["content"] for r in responses if r.is_success]
        assert len(set(texts)) == 1
        return [r.status_code for r in responses], texts[0]

    first, again, other = run(7), run(7), run(8)
    assert first == again
    assert first[1] != other[1]
    assert {200, 500} <= set(first[0])


def test_request_capture_is_byte_exact(sim: Start) -> None:
    s = sim(fast())
    raw = (
        b'{ "messages" : [{"role":"user","content":"caf\\u00e9 \xe2\x98\x83"}],'
        b'\n "x_unknown": 1.50 }'
    )
    headers = {"content-type": "application/json", "x-trace": "t-1"}
    assert s.http.post(CHAT, content=raw, headers=headers).status_code == 200
    captured = s.app.captured(CHAT)[-1]
    assert captured.method == "POST"
    assert captured.body == raw
    assert captured.header("X-Trace") == b"t-1"
    assert (b"x-trace", b"t-1") in captured.headers


# -- CLI -------------------------------------------------------------------------------


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="owngate")
    sim_cli.register(parser.add_subparsers())
    return parser.parse_args(["sim", *argv])


def test_cli_flags_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OWNGATE_SIM_KIND", "llamacpp")
    monkeypatch.setenv("OWNGATE_SIM_MODEL", "m1, m2")
    monkeypatch.setenv("OWNGATE_SIM_ERROR_RATE", "0.25")
    monkeypatch.setenv("OWNGATE_SIM_ZERO_LATENCY", "true")
    monkeypatch.setenv("OWNGATE_SIM_COALESCE_CHUNKS", "yes")
    args = _parse(["--slots", "2", "--slow-start", "1.5", "--health-delay", "2.5"])
    settings = sim_cli.build_settings(args)
    assert settings.kind == "llamacpp"
    assert settings.models == ("m1", "m2")
    assert settings.slots == 2
    assert settings.decode_tokens_per_s == 40.0  # llama.cpp default kept
    assert settings.zero_latency is True
    assert settings.coalesce_chunks is True
    assert settings.faults == Faults(error_rate=0.25, slow_start_s=1.5, health_delay_s=2.5)
    assert args.handler is sim_cli.run
    assert sim_cli.build_settings(_parse(["--model", "x", "--no-zero-latency"])).models == ("x",)


def test_cli_token_interval_paces_zero_latency_streams(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = sim_cli.build_settings(_parse(["--zero-latency", "--token-interval", "0.02"]))
    assert settings.token_interval_s == 0.02
    monkeypatch.setenv("OWNGATE_SIM_TOKEN_INTERVAL", "0.005")
    assert sim_cli.build_settings(_parse(["--zero-latency"])).token_interval_s == 0.005
    assert sim_cli.build_settings(_parse(["--token-interval", "0"])).token_interval_s == 0.0
    with pytest.raises(SystemExit):
        _parse(["--token-interval", "-1"])
    with pytest.raises(ValueError, match="coalesce_chunks"):
        sim_cli.build_settings(_parse(["--zero-latency", "--coalesce-chunks"]))


def test_cli_rejects_bad_values(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        _parse(["--error-rate", "1.5"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit):
        _parse(["--kind", "tgi"])
    assert "error-rate" in capsys.readouterr().err


# -- prefix cache ------------------------------------------------------------------------


def test_prefix_cache_counters_in_vllm_and_sglang_metrics(sim: Start) -> None:
    system = {"role": "system", "content": "You are a careful assistant. " * 40}
    vllm = sim(fast()).http
    sglang = sim(fast("sglang")).http
    for http in (vllm, sglang):
        for question in ("first?", "second?"):
            messages = [system, {"role": "user", "content": question}]
            assert http.post(CHAT, json={"messages": messages, "max_tokens": 2}).status_code == 200
    system_tokens = math.ceil(len(system["content"]) / 4)
    text = vllm.get("/metrics").text
    queries = metric(text, "vllm:prefix_cache_queries_total")
    assert queries == metric(text, "vllm:prompt_tokens_total")
    assert metric(text, "vllm:prefix_cache_hits_total") == system_tokens
    rate = metric(sglang.get("/metrics").text, "sglang:cache_hit_rate")
    assert rate == pytest.approx(system_tokens / queries)


def test_zero_latency_and_disabled_cache_skip_the_prefix_cache(sim: Start) -> None:
    messages = [{"role": "system", "content": "x" * 400}, {"role": "user", "content": "hi"}]
    for settings in (fast(zero_latency=True), fast(prefix_cache_tokens=0)):
        s = sim(settings)
        for _ in range(2):
            s.http.post(CHAT, json={"messages": messages, "max_tokens": 2})
        text = s.http.get("/metrics").text
        assert metric(text, "vllm:prefix_cache_queries_total") == 0
        assert len(s.app.engine.prefix_cache) == 0
