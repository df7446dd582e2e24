"""Open-loop streaming client of the routing benchmark, run in its own process.

`python -m owngate_bench.openloop` reads a `ReplaySpec` as JSON on stdin, replays the
trace file it names against the gateway and prints one result JSON object on stdout.
Each request is sent at its arrival time whatever happened to the earlier ones (open
loop: a slow server cannot slow the arrivals down), over an idle keep-alive connection
or a new one, as `POST /v1/chat/completions` with `stream: true`. Times are taken from
the scheduled arrival, so a late send counts against the request, never for it.

Per request it reports `[ttft_s, latency_s, chunks, outcome, send_lag_s, at_s, workload]`:
TTFT (the first SSE event with non-empty content), end-to-end latency (`[DONE]`),
content chunks, the outcome — `ok`, `status_<code>`, `broken` (connection lost or no
`[DONE]`) or `unfinished` (still running `grace_s` after the last arrival; its
connection is then closed, which cancels it upstream, and its times are those it had run
so far: lower bounds) — how late it was sent, and its trace entry. Parsing is httptools
on uvloop, as in `owngate_bench.loadgen`, so the client costs far less than the servers.

`replay_in_subprocess(spec)` is the parent's side.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import httptools
import orjson

from owngate_bench.arrivals import read_trace
from owngate_bench.loadgen import json_module_main, run_json_module

__all__ = ["ReplaySpec", "main", "replay", "replay_in_subprocess"]

_LEAD_S = 0.2  # from the end of the set-up to the trace's time 0


@dataclasses.dataclass(frozen=True)
class ReplaySpec:
    host: str
    port: int
    api_key: str
    trace: str  # path of the trace file (`owngate_bench.arrivals.write_trace`)
    grace_s: float  # how long requests may run after the last arrival
    path: str = "/v1/chat/completions"
    connections: int = 32  # opened before the trace starts; more are opened on demand

    @classmethod
    def from_json(cls, raw: str | bytes) -> ReplaySpec:
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise ValueError("replay spec must be a JSON object")
        return cls(**data)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))


class _Stream(asyncio.Protocol):
    """One keep-alive connection carrying one streamed request at a time."""

    def __init__(self) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future[None] | None = None
        self.closed = False
        self.keep_alive = True
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.first_content_at = 0.0
        self.chunks = 0
        self.done = False
        self.error_event = False  # an event with a `"error":` key: an SDK raises there
        self.error_body = bytearray()
        self._pending = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport, but implement it.
        self._transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(ConnectionError(f"connection lost: {exc!r}"))

    def close(self) -> None:
        self.closed = True
        if self._transport is not None:
            self._transport.close()

    def exchange(self, request: bytes) -> asyncio.Future[None]:
        assert self._transport is not None
        self._reset()
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
            if len(self.error_body) < 2000:
                self.error_body += body
            return
        lines = (self._pending + body).split(b"\n")
        self._pending = lines.pop()
        for line in lines:
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self.done = True
                continue
            if b'"error":' in payload:  # a JSON key only: a quote in content is escaped
                self.error_event = True
                continue
            if self.first_content_at:
                self.chunks += 1
                continue
            try:
                event = orjson.loads(payload)
                content = event["choices"][0]["delta"].get("content")
            except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError):
                continue
            if content:
                self.first_content_at = time.perf_counter()
                self.chunks += 1

    def on_message_complete(self) -> None:
        self.keep_alive = self._parser.should_keep_alive()
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


class _Replay:
    """Per request: [ttft s, latency s, content chunks, outcome, send lag s]."""

    def __init__(self, spec: ReplaySpec, requests: list[bytes]) -> None:
        self.spec = spec
        self.requests = requests
        self.idle: list[_Stream] = []
        self.busy: set[_Stream] = set()
        self.cutting = False
        self.results: list[list[Any]] = [[None, None, 0, "unfinished", 0.0] for _ in requests]

    async def connect(self) -> _Stream:
        loop = asyncio.get_running_loop()
        _, stream = await loop.create_connection(_Stream, self.spec.host, self.spec.port)
        return stream

    async def one(self, index: int, scheduled: float) -> None:
        result = self.results[index]
        stream = self.idle.pop() if self.idle else None
        try:
            if stream is None or stream.closed:
                stream = await self.connect()
            if self.cutting:  # connected after the cut: it stays "unfinished"
                stream.close()
                return
            self.busy.add(stream)
            result[4] = time.perf_counter() - scheduled
            await stream.exchange(self.requests[index])
        except (ConnectionError, OSError):
            if stream is not None:
                self.busy.discard(stream)
                stream.close()
                if stream.first_content_at:
                    result[0] = stream.first_content_at - scheduled
            if not self.cutting:
                result[3] = "broken"  # else it stays "unfinished": we cut it off
            return
        finished = time.perf_counter()
        self.busy.discard(stream)
        if stream.status != 200:
            result[3] = f"status_{stream.status}"
        elif stream.error_event:
            result[3] = "error_event"
        elif not (stream.done and stream.first_content_at):
            result[3] = "broken"
        else:
            result[:4] = [
                stream.first_content_at - scheduled,
                finished - scheduled,
                stream.chunks,
                "ok",
            ]
        if stream.keep_alive and not stream.closed:
            self.idle.append(stream)
        else:
            stream.close()

    async def run(self, arrivals: Sequence[float]) -> dict[str, Any]:
        self.idle = [await self.connect() for _ in range(self.spec.connections)]
        loop = asyncio.get_running_loop()
        start = time.perf_counter() + _LEAD_S
        tasks: list[asyncio.Task[None]] = []
        for index, at in enumerate(arrivals):
            delay = start + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(loop.create_task(self.one(index, start + at)))
        deadline = start + (arrivals[-1] if arrivals else 0.0) + self.spec.grace_s
        if tasks:
            await asyncio.wait(tasks, timeout=max(0.0, deadline - time.perf_counter()))
        cut_at = time.perf_counter()
        self.cutting = True
        for stream in list(self.busy):
            stream.close()  # the gateway sees the client leave and cancels upstream
        if tasks:
            await asyncio.wait(tasks)
        for stream in self.idle:
            stream.close()
        # An unfinished request ran at least until the cut: its times are lower bounds.
        for index, at in enumerate(arrivals):
            result = self.results[index]
            if result[3] == "unfinished":
                waited = cut_at - (start + at)
                result[0] = waited if result[0] is None else result[0]
                result[1] = waited
        return {"cut_after_s": cut_at - start, "requests": self.results}


def replay(spec: ReplaySpec) -> dict[str, Any]:
    """Replay the spec's trace in this process, on uvloop."""
    import uvloop  # imported here: the parent process never needs it

    trace = read_trace(Path(spec.trace))
    head = (
        f"POST {spec.path} HTTP/1.1\r\nHost: {spec.host}:{spec.port}\r\n"
        f"Authorization: Bearer {spec.api_key}\r\nContent-Type: application/json\r\n"
        "Accept: text/event-stream\r\n"
    )
    requests = []
    for item in trace:
        body = orjson.dumps(item.body)
        requests.append(f"{head}Content-Length: {len(body)}\r\n\r\n".encode("ascii") + body)
    arrivals = [item.at for item in trace]
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        result = runner.run(_Replay(spec, requests).run(arrivals))
    for row, item in zip(result["requests"], trace, strict=True):
        row += [item.at, item.workload]
    return result


def replay_in_subprocess(
    spec: ReplaySpec, budget_s: float, *, env: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Run `python -m owngate_bench.openloop` on `spec` and return its result."""
    return run_json_module("owngate_bench.openloop", spec.to_json(), budget_s, env)


def main(argv: Sequence[str] | None = None) -> int:
    return json_module_main(
        argv,
        "owngate_bench.openloop",
        "Open-loop trace replay.",
        ReplaySpec.from_json,
        replay,
        _orjson_text,
    )


def _orjson_text(result: Any) -> str:
    return orjson.dumps(result).decode()


if __name__ == "__main__":
    raise SystemExit(main())
