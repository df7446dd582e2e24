"""A `vllm bench serve`-compatible client: open-loop arrivals, streamed chat, vLLM's metrics.

Like `vllm bench serve --dataset-name random`: `num_prompts` requests of `input_len`
prompt tokens (approximately: seeded pseudo-words of about one token each; the server's
own count comes back in the usage chunk and is what `total_input_tokens` reports) asking
for exactly `output_len` tokens (`ignore_eos`, as vLLM's random dataset does), sent at
`request_rate` requests per second with Poisson arrivals (exponential gaps, seeded; `inf`
sends them all at once), at most `max_concurrency` in flight. Every request streams
(`stream_options.include_usage`); each content event's arrival is timed, so TTFT is the
first content event, ITL the gaps between the following ones, TPOT (E2EL - TTFT) /
(output tokens - 1) per request, as vLLM computes them.

The summary uses vLLM's names (`completed`, `request_throughput`, `output_throughput`,
`total_token_throughput`, `mean_ttft_ms`, `median_ttft_ms`, `std_ttft_ms`,
`p99_ttft_ms`, the same for `tpot`, `itl`, `e2el`). Every prompt is fresh (a seeded
nonce leads it): llama.cpp's per-slot prompt cache would otherwise make a target that
follows another with the same prompts look faster.

Runs in its own process (`python -m owngate_bench.workloads_client`, the spec's JSON on
stdin, the summary's on stdout), so the benchmark's clients never share a core's GIL with a server.
Each request has a deadline: the run is bounded in time whatever the server does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import random
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import httptools

__all__ = ["ClientSpec", "Result", "prompt_text", "summarize"]

PERCENTILES = (50, 90, 99)
_TEXT = (
    "the of and to in is that for it as with was on be by at this from or an are not have "
    "which but all were when we there can more one been if has their will other what about "
    "time into only some could them see these two may first then do any like now its over "
    "new also after way well even because good through each just those people how too"
)
_WORDS = tuple(_TEXT.split())


@dataclasses.dataclass(frozen=True)
class ClientSpec:
    host: str
    port: int
    model: str
    input_len: int
    output_len: int
    num_prompts: int
    request_rate: float  # requests per second; math.inf: all at once
    max_concurrency: int
    seed: int  # prompt contents
    arrival_seed: int  # arrival times: the same for every target of a comparison
    headers: dict[str, str] = dataclasses.field(default_factory=dict)
    timeout_s: float = 120.0  # per request, from its arrival

    def to_json(self) -> str:
        data = dataclasses.asdict(self)
        data["request_rate"] = "inf" if math.isinf(self.request_rate) else self.request_rate
        return json.dumps(data)

    @classmethod
    def from_json(cls, raw: str) -> ClientSpec:
        data = json.loads(raw)
        data["request_rate"] = float(data["request_rate"])
        return cls(**data)


def prompt_text(tokens: int, rng: random.Random) -> str:
    """About `tokens` tokens: a nonce (so no two prompts share a cached prefix), then
    common English words, each about one token."""
    nonce = f"{rng.getrandbits(48):012x}"
    return nonce + " " + " ".join(rng.choice(_WORDS) for _ in range(max(0, tokens - 4)))


@dataclasses.dataclass
class Result:
    ok: bool = False
    error: str = ""
    ttft: float = 0.0
    e2el: float = 0.0
    itl: list[float] = dataclasses.field(default_factory=list)
    prompt_tokens: int = 0
    output_tokens: int = 0


class _Response:
    """httptools callbacks of one streamed response: content event times and usage."""

    def __init__(self) -> None:
        self.status = 0
        self.times: list[float] = []
        self.usage: dict[str, Any] = {}
        self.done = False
        self.complete = False
        self.error_event = b""  # an event with a truthy `error` (the SDK raises on it)
        self.error_body = b""
        self._pending = b""
        self.parser = httptools.HttpResponseParser(self)

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()

    def on_message_complete(self) -> None:
        self.complete = True

    def on_body(self, body: bytes) -> None:
        if self.status != 200:
            self.error_body = (self.error_body + body)[:500]
            return
        now = time.perf_counter()
        lines = (self._pending + body).split(b"\n")
        self._pending = lines.pop()
        for line in lines:
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self.done = True
                continue
            event = json.loads(payload)
            if event.get("error") and not self.error_event:
                self.error_event = payload[:200]
            if event.get("usage"):
                self.usage = event["usage"]
            choices = event.get("choices") or []
            if choices and (choices[0].get("delta") or {}).get("content"):
                self.times.append(now)


async def _one(spec: ClientSpec, body: bytes, result: Result, sent: float) -> None:
    reader, writer = await asyncio.open_connection(spec.host, spec.port)
    try:
        head = [
            "POST /v1/chat/completions HTTP/1.1",
            f"Host: {spec.host}:{spec.port}",
            "Content-Type: application/json",
            f"Content-Length: {len(body)}",
            "Connection: close",
            *(f"{k}: {v}" for k, v in spec.headers.items()),
        ]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        response = _Response()
        while not response.complete:
            data = await reader.read(65536)
            if not data:
                break
            response.parser.feed_data(data)
    finally:
        writer.close()
    end = time.perf_counter()
    if response.status != 200:
        result.error = f"status {response.status}: {response.error_body[:200]!r}"
    elif response.error_event:
        result.error = f"error event in the stream: {response.error_event!r}"
    elif not response.done or not response.times:
        result.error = "stream ended without content or [DONE]"
    else:
        result.ok = True
        result.ttft = response.times[0] - sent
        result.e2el = end - sent
        result.itl = [b - a for a, b in zip(response.times, response.times[1:], strict=False)]
        result.prompt_tokens = int(response.usage.get("prompt_tokens", 0))
        result.output_tokens = int(response.usage.get("completion_tokens", len(response.times)))


async def _run(spec: ClientSpec) -> dict[str, Any]:
    rng = random.Random(spec.seed)  # noqa: S311 - a reproducible benchmark workload
    bodies = [
        json.dumps(
            {
                "model": spec.model,
                "messages": [{"role": "user", "content": prompt_text(spec.input_len, rng)}],
                "max_tokens": spec.output_len,
                "min_tokens": spec.output_len,
                "ignore_eos": True,
                "temperature": 0,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
        ).encode()
        for _ in range(spec.num_prompts)
    ]
    arrivals = random.Random(spec.arrival_seed)  # noqa: S311 - reproducible arrivals
    gaps = [
        0.0 if math.isinf(spec.request_rate) else arrivals.expovariate(spec.request_rate)
        for _ in bodies
    ]
    limit = asyncio.Semaphore(spec.max_concurrency)
    results = [Result() for _ in bodies]

    async def request(index: int) -> None:
        async with limit:
            sent = time.perf_counter()
            try:
                await asyncio.wait_for(
                    _one(spec, bodies[index], results[index], sent), spec.timeout_s
                )
            except (OSError, TimeoutError, ValueError, httptools.HttpParserError) as exc:
                results[index].error = f"{type(exc).__name__}: {exc}"[:200]

    start = time.perf_counter()
    tasks = []
    for index, gap in enumerate(gaps):  # the first goes at once, as in vLLM's client
        tasks.append(asyncio.create_task(request(index)))
        await asyncio.sleep(gap)
    await asyncio.gather(*tasks)
    return summarize(results, time.perf_counter() - start)


def _stats(name: str, values_s: Sequence[float]) -> dict[str, float]:
    ms = sorted(v * 1000.0 for v in values_s) or [0.0]
    found = {
        f"mean_{name}_ms": statistics.fmean(ms),
        f"median_{name}_ms": statistics.median(ms),
        f"std_{name}_ms": statistics.pstdev(ms),
    }
    for p in PERCENTILES:
        found[f"p{p}_{name}_ms"] = ms[min(len(ms) - 1, math.ceil(p / 100 * len(ms)) - 1)]
    return found


def summarize(results: Sequence[Result], duration_s: float) -> dict[str, Any]:
    """vLLM's summary of one run (`vllm bench serve --save-result` names)."""
    done = [r for r in results if r.ok]
    tpot = [(r.e2el - r.ttft) / (r.output_tokens - 1) for r in done if r.output_tokens > 1]
    input_tokens = sum(r.prompt_tokens for r in done)
    output_tokens = sum(r.output_tokens for r in done)
    return {
        "duration": duration_s,
        "completed": len(done),
        "failed": len(results) - len(done),
        "errors": sorted({r.error for r in results if not r.ok})[:5],
        "total_input_tokens": input_tokens,
        "total_output_tokens": output_tokens,
        "request_throughput": len(done) / duration_s,
        "output_throughput": output_tokens / duration_s,
        "total_token_throughput": (input_tokens + output_tokens) / duration_s,
        **_stats("ttft", [r.ttft for r in done]),
        **_stats("tpot", tpot),
        **_stats("itl", [gap for r in done for gap in r.itl]),
        **_stats("e2el", [r.e2el for r in done]),
    }


def main() -> int:
    """`python -m owngate_bench.workloads_client`: spec JSON on stdin, summary JSON on stdout."""
    summary = asyncio.run(_run(ClientSpec.from_json(sys.stdin.read())))
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
