"""Open-loop streaming client of `owngate bench seed-load`, run in its own process.

`python -m owngate_bench.seedclient` reads a `SeedSpec` as JSON on stdin, sends
`POST /v1/chat/completions` streams at Poisson arrival times (`rate` per second for
`duration_s`, at most `max_requests`), whatever happened to the earlier ones, and prints
one result JSON object on stdout. Times are taken from the scheduled arrival, so a late
send counts against the request, never for it. Parsing is httptools on uvloop, as in
`owngate_bench.loadgen`.

Measured window: arrivals from `warmup_s` to `duration_s` (the server is then at its
steady number of open streams). CPU seconds of the `cpu_pids` process trees, of this
client and of the whole machine are read when the window opens and when it closes; the
content events received inside it are counted, so CPU per relayed chunk is CPU over
those. Per request in the window: TTFT (first content event), the gaps between
consecutive content events (ITL; events that arrive in one read have a gap of 0), and
the outcome. Requests still running `grace_s` after the last arrival are cut off and
reported as `unfinished`.
"""

from __future__ import annotations

import array
import asyncio
import dataclasses
import json
import random
import resource
import time
from collections.abc import Mapping, Sequence
from typing import Any, cast

import httptools
import orjson

from owngate_bench.arrivals import arrival_times
from owngate_bench.loadgen import json_module_main, percentiles, run_json_module
from owngate_bench.services import machine_busy_seconds, tree_cpu_seconds

__all__ = ["SeedSpec", "main", "run_in_subprocess", "run_spec"]

_LEAD_S = 0.2  # from the end of the set-up to the first arrival


@dataclasses.dataclass(frozen=True)
class SeedSpec:
    host: str
    port: int
    api_key: str
    model: str
    rate: float  # streams per second
    duration_s: float  # arrivals happen in [0, duration_s)
    max_tokens: int
    warmup_s: float  # arrivals before this are not measured
    grace_s: float  # how long streams may run after the last arrival
    max_requests: int
    connections: int = 64  # opened before the first arrival; more on demand
    seed: int = 0
    cpu_pids: Mapping[str, int] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_json(cls, raw: str | bytes) -> SeedSpec:
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise ValueError("seed spec must be a JSON object")
        return cls(**data)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))


class _Window:
    """The measured window's bounds (perf_counter) and what arrived inside it."""

    def __init__(self) -> None:
        self.opens = float("inf")
        self.closes = float("inf")
        self.chunks = 0
        self.gaps = array.array("d")

    def count(self, at: float, events: int) -> None:
        if self.opens <= at < self.closes:
            self.chunks += events


class _Stream(asyncio.Protocol):
    """One keep-alive connection carrying one streamed request at a time."""

    def __init__(self, window: _Window) -> None:
        self._window = window
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future[None] | None = None
        self.closed = False
        self.keep_alive = True
        self.measured = False
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.first_at = 0.0
        self.last_at = 0.0
        self.chunks = 0
        self.done = False
        self.error_event = False  # an event with a `"error":` key: an SDK raises there
        self._pending = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's implements it

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(ConnectionError(f"connection lost: {exc!r}"))

    def close(self) -> None:
        self.closed = True
        if self._transport is not None:
            self._transport.close()

    def exchange(self, request: bytes, measured: bool) -> asyncio.Future[None]:
        assert self._transport is not None
        self._reset()
        self.measured = measured
        self._waiter = asyncio.get_running_loop().create_future()
        self._transport.write(request)
        return self._waiter

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if self._waiter is not None and not self._waiter.done():
                self._waiter.set_exception(ConnectionError(f"bad HTTP response: {exc}"))
            self.close()

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        if self.status != 200:
            return
        now = time.perf_counter()
        lines = (self._pending + body).split(b"\n")
        self._pending = lines.pop()
        events = 0
        for line in lines:
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self.done = True
            elif b'"error":' in payload:  # a JSON key only: a quote in content is escaped
                self.error_event = True
            elif self.first_at:
                events += 1
            elif _has_content(payload):
                self.first_at = now
                events += 1
        if not events:
            return
        if self.measured and self.last_at:
            gaps = self._window.gaps
            gaps.append(now - self.last_at)
            for _ in range(events - 1):
                gaps.append(0.0)
        elif self.measured and events > 1:
            self._window.gaps.extend([0.0] * (events - 1))
        self.last_at = now
        self.chunks += events
        self._window.count(now, events)

    def on_message_complete(self) -> None:
        self.keep_alive = self._parser.should_keep_alive()
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


def _has_content(payload: bytes) -> bool:
    """Whether an SSE event's JSON carries content (the role's first event has "")."""
    try:
        event = orjson.loads(payload)
        return bool(event["choices"][0]["delta"].get("content"))
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError):
        return False


class _Run:
    def __init__(self, spec: SeedSpec, request: bytes) -> None:
        self.spec = spec
        self.request = request
        self.window = _Window()
        self.idle: list[_Stream] = []
        self.busy: set[_Stream] = set()
        self.cutting = False
        self.ttfts: list[float] = []
        self.outcomes: dict[str, int] = {}
        self.lags: list[float] = []

    async def connect(self) -> _Stream:
        loop = asyncio.get_running_loop()
        _, stream = await loop.create_connection(
            lambda: _Stream(self.window), self.spec.host, self.spec.port
        )
        return stream

    def _outcome(self, name: str, measured: bool) -> None:
        if measured:
            self.outcomes[name] = self.outcomes.get(name, 0) + 1

    async def one(self, scheduled: float, measured: bool) -> None:
        stream = self.idle.pop() if self.idle else None
        try:
            if stream is None or stream.closed:
                stream = await self.connect()
            if self.cutting:
                stream.close()
                self._outcome("unfinished", measured)
                return
            self.busy.add(stream)
            if measured:
                self.lags.append(time.perf_counter() - scheduled)
            await stream.exchange(self.request, measured)
        except (ConnectionError, OSError):
            if stream is not None:
                self.busy.discard(stream)
                stream.close()
            self._outcome("unfinished" if self.cutting else "broken", measured)
            return
        self.busy.discard(stream)
        if stream.status != 200:
            self._outcome(f"status_{stream.status}", measured)
        elif stream.error_event:
            self._outcome("error_event", measured)
        elif not (stream.done and stream.first_at):
            self._outcome("broken", measured)
        else:
            self._outcome("ok", measured)
            if measured:
                self.ttfts.append(stream.first_at - scheduled)
        if stream.keep_alive and not stream.closed:
            self.idle.append(stream)
        else:
            stream.close()

    async def run(self, arrivals: Sequence[float]) -> dict[str, Any]:
        spec = self.spec
        self.idle = [await self.connect() for _ in range(spec.connections)]
        loop = asyncio.get_running_loop()
        start = time.perf_counter() + _LEAD_S
        window = self.window
        window.opens = start + spec.warmup_s
        window.closes = start + spec.duration_s
        samples: dict[str, dict[str, float]] = {}
        edges = iter((("opens", window.opens), ("closes", window.closes)))
        edge = next(edges, None)
        tasks: list[asyncio.Task[None]] = []
        for at in arrivals:
            due = start + at
            while edge is not None and edge[1] <= due:
                await _sleep_until(edge[1])
                samples[edge[0]] = _sample(spec.cpu_pids)
                edge = next(edges, None)
            await _sleep_until(due)
            measured = spec.warmup_s <= at < spec.duration_s
            tasks.append(loop.create_task(self.one(due, measured)))
        while edge is not None:
            await _sleep_until(edge[1])
            samples[edge[0]] = _sample(spec.cpu_pids)
            edge = next(edges, None)
        deadline = start + (arrivals[-1] if arrivals else 0.0) + spec.grace_s
        if tasks:
            await asyncio.wait(tasks, timeout=max(0.0, deadline - time.perf_counter()))
        self.cutting = True
        for stream in list(self.busy):
            stream.close()
        if tasks:
            await asyncio.wait(tasks)
        for stream in self.idle:
            stream.close()
        return self._result(samples, len(arrivals))

    def _result(self, samples: dict[str, dict[str, float]], sent: int) -> dict[str, Any]:
        before, after = samples["opens"], samples["closes"]
        elapsed = after["wall"] - before["wall"]
        measured = sum(self.outcomes.values())
        gaps = self.window.gaps
        return {
            "sent": sent,
            "requests": measured,
            "outcomes": self.outcomes,
            "errors": measured - self.outcomes.get("ok", 0),
            "elapsed_s": elapsed,
            "chunks": self.window.chunks,
            "chunks_per_s": self.window.chunks / elapsed if elapsed > 0 else 0.0,
            "req_per_s": measured / elapsed if elapsed > 0 else 0.0,
            "ttft_ms": percentiles(self.ttfts, points=(50, 90, 99)),
            "itl_ms": percentiles(gaps, points=(50, 99)),
            # events that came in the same read as the one before: a relay behind its
            # backend writes several paced tokens at once (each its own write upstream)
            "coalesced_share": gaps.tolist().count(0.0) / len(gaps) if gaps else 0.0,
            "send_lag_ms": percentiles(self.lags, points=(50, 99)),
            "cpu_s": {name: after[name] - before[name] for name in after if name != "wall"},
        }


async def _sleep_until(when: float) -> None:
    delay = when - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)


def _sample(pids: Mapping[str, int]) -> dict[str, float]:
    """CPU seconds so far of each named process tree, this client, the machine; wall time."""
    found = {name: tree_cpu_seconds(pid) for name, pid in pids.items()}
    usage = resource.getrusage(resource.RUSAGE_SELF)
    found["client"] = usage.ru_utime + usage.ru_stime
    found["machine"] = machine_busy_seconds()
    found["wall"] = time.perf_counter()
    return found


def run_spec(spec: SeedSpec) -> dict[str, Any]:
    """Run the spec's arrivals in this process, on uvloop."""
    import uvloop  # imported here: the parent process never needs it

    rng = random.Random(spec.seed)  # noqa: S311 - reproducible arrivals
    arrivals = arrival_times(spec.rate, spec.duration_s, 1.0, rng)[: spec.max_requests]
    body = orjson.dumps(
        {
            "model": spec.model,
            "messages": [{"role": "user", "content": "Tell me about the seed load."}],
            "max_tokens": spec.max_tokens,
            "stream": True,
        }
    )
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {spec.host}:{spec.port}\r\n"
        f"Authorization: Bearer {spec.api_key}\r\nContent-Type: application/json\r\n"
        f"Accept: text/event-stream\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode("ascii") + body
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(_Run(spec, request).run(arrivals))


def run_in_subprocess(spec: SeedSpec, *, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Run `python -m owngate_bench.seedclient` on `spec` and return its result."""
    budget = spec.duration_s + 2 * spec.grace_s + 60.0
    return run_json_module("owngate_bench.seedclient", spec.to_json(), budget, env)


def main(argv: Sequence[str] | None = None) -> int:
    return json_module_main(
        argv,
        "owngate_bench.seedclient",
        "Open-loop seed-load client.",
        SeedSpec.from_json,
        run_spec,
        _orjson_text,
    )


def _orjson_text(result: Any) -> str:
    return orjson.dumps(result).decode()


if __name__ == "__main__":
    raise SystemExit(main())
