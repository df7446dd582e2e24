"""Closed-loop HTTP/1.1 load generator for the overhead benchmark, run in its own process.

`python -m owngate_bench.loadgen [--spec FILE]` reads a `LoadSpec` as JSON (stdin by
default) and prints one result JSON object on stdout. N keep-alive connections each send
`POST /v1/chat/completions` back to back until the duration or the request cap runs out,
first for a short warm-up, then for the measured window. Responses are parsed with
httptools on uvloop (httpx or aiohttp would cap the client below the servers it measures)
and validated: status 200, a `choices` body, and for streams a first content chunk and
`[DONE]`. Failures are counted by kind, never raised. CPU time of the named process trees
(`/proc/PID/stat`) and of the whole machine (`machine`, from /proc/stat) is sampled right
before and after the measured window.

`run_in_subprocess(spec)` is the parent's side: it runs this module and returns the result.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

import httptools
import orjson

from owngate_bench.loadspec import LoadSpec
from owngate_bench.services import machine_busy_seconds, tree_cpu_seconds

_S = TypeVar("_S")

__all__ = ["LoadSpec", "main", "percentiles", "run_in_subprocess"]

_MAX_SAMPLES = 5  # error samples kept per run
_SAMPLE_BYTES = 300


def percentiles(
    values: Sequence[float], scale: float = 1000.0, points: Sequence[int] = (50, 90, 99)
) -> dict[str, float]:
    """Nearest-rank percentiles (`p50`, ...) with mean and max, times `scale` (s → ms)."""
    if not values:
        return {}
    ordered = sorted(values)
    last = len(ordered) - 1

    def rank(q: float) -> float:
        return ordered[min(last, max(0, math.ceil(q * len(ordered)) - 1))] * scale

    found = {f"p{p}": rank(p / 100) for p in points}
    found["mean"] = sum(ordered) / len(ordered) * scale
    found["max"] = ordered[last] * scale
    return found


def run_json_module(
    module: str, payload: str, budget_s: float, env: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Run `python -m module` with `payload` on stdin; its stdout is one JSON object."""
    proc = subprocess.run(
        [sys.executable, "-m", module],
        input=payload,
        capture_output=True,
        text=True,
        timeout=budget_s,
        env=None if env is None else dict(env),
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{module} exited {proc.returncode}: {proc.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def json_module_main(
    argv: Sequence[str] | None,
    module: str,
    description: str,
    parse: Callable[[str], _S],
    run: Callable[[_S], Any],
    dumps: Callable[[Any], str] = json.dumps,
) -> int:
    """The child side of `run_json_module`: read a spec (JSON, from `--spec FILE` or
    stdin), run it, print the result as one JSON object (`dumps`); exit 2 on an invalid
    spec."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=description)
    parser.add_argument("--spec", default="-", help="the spec as JSON, a file ('-' = stdin)")
    args = parser.parse_args(argv)
    raw = sys.stdin.read() if args.spec == "-" else Path(args.spec).read_text()
    try:
        spec = parse(raw)
    except (ValueError, TypeError) as exc:
        print(f"invalid spec for {module}: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(dumps(run(spec)))
    sys.stdout.write("\n")
    return 0


class _Phase:
    """Counters of one timed phase, shared by its connections."""

    def __init__(self, deadline: float, budget: int | None) -> None:
        self.deadline = deadline
        self.budget = budget
        self.latencies: list[float] = []
        self.ttfts: list[float] = []
        self.chunks = 0
        self.reads = 0
        self.errors: dict[str, int] = {}
        self.samples: list[str] = []

    def take(self) -> bool:
        if time.perf_counter() >= self.deadline or self.budget == 0:
            return False
        if self.budget is not None:
            self.budget -= 1
        return True

    def error(self, kind: str, detail: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1
        if len(self.samples) < _MAX_SAMPLES:
            self.samples.append(f"{kind}: {detail[:_SAMPLE_BYTES]}")


class _Connection(asyncio.Protocol):
    """One keep-alive connection; `exchange` sends a request and resolves when it completes."""

    def __init__(self, stream: bool) -> None:
        self._stream = stream
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future[None] | None = None
        self.closed = False
        self.keep_alive = True
        self.status = 0
        self.sent_at = 0.0
        self.first_content_at = 0.0
        self.chunks = 0
        self.reads = 0  # body pieces of a stream: how finely the server's writes arrived
        self.done = False
        self.error_event = False  # a `"error":` key in the stream: an SDK raises there
        self.body = bytearray()
        self._tail = b""
        self._pending_line = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport, but implement it.
        self._transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(ConnectionError(f"connection lost: {exc!r}"))

    def close(self) -> None:
        self.closed = True
        if self._transport is not None:
            self._transport.close()

    def _fail(self, exc: Exception) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(exc)

    def exchange(self, request: bytes) -> asyncio.Future[None]:
        assert self._transport is not None
        self.status, self.chunks, self.reads, self.done = 0, 0, 0, False
        self.error_event = False
        self.first_content_at = 0.0
        self.body.clear()
        self._tail = self._pending_line = b""
        self._waiter = asyncio.get_running_loop().create_future()
        self.sent_at = time.perf_counter()
        self._transport.write(request)
        return self._waiter

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ConnectionError(f"bad HTTP response: {exc}"))
            self.close()

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        if not self._stream or self.status != 200:
            if len(self.body) < 65536:
                self.body += body
            return
        # Count SSE events cheaply; the 7-byte tail catches markers split across reads.
        # `"error":` is a JSON key only (a quote in content is escaped: `\"error\":`).
        self.reads += 1
        data = self._tail + body
        self.chunks += data.count(b"data:") - self._tail.count(b"data:")
        if b"[DONE]" in data:
            self.done = True
        if b'"error":' in data:
            self.error_event = True
        self._tail = data[-7:]
        if not self.first_content_at:
            self._scan_for_content(body)

    def _scan_for_content(self, body: bytes) -> None:
        lines = (self._pending_line + body).split(b"\n")
        self._pending_line = lines.pop()
        for line in lines:
            line = line.strip()
            if not line.startswith(b"data:") or line.endswith(b"[DONE]"):
                continue
            try:
                event = orjson.loads(line[5:])
                content = event["choices"][0]["delta"].get("content")
            except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError):
                continue
            if content:
                self.first_content_at = time.perf_counter()
                return

    def on_message_complete(self) -> None:
        self.keep_alive = self._parser.should_keep_alive()
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


class _Runner:
    """The closed loop: `concurrency` workers, each reusing one connection across phases."""

    def __init__(self, spec: LoadSpec) -> None:
        self.spec = spec
        low = max(1, spec.max_tokens - spec.max_tokens_spread)
        high = spec.max_tokens + spec.max_tokens_spread
        self.requests = [spec.request_bytes(n) for n in range(low, high + 1)]
        self.conns: list[_Connection | None] = [None] * spec.concurrency
        # One seeded sequence of answer lengths per connection: the same in every run.
        self.lengths = [random.Random(slot) for slot in range(spec.concurrency)]  # noqa: S311

    async def _connect(self, phase: _Phase) -> _Connection | None:
        loop = asyncio.get_running_loop()
        while time.perf_counter() < phase.deadline:
            try:
                _, conn = await loop.create_connection(
                    lambda: _Connection(self.spec.stream), self.spec.host, self.spec.port
                )
            except OSError as exc:
                phase.error("connect", repr(exc))
                await asyncio.sleep(0.05)
                continue
            return conn
        return None

    async def _worker(self, slot: int, phase: _Phase) -> None:
        while phase.take():
            conn = self.conns[slot]
            if conn is None or conn.closed or not conn.keep_alive:
                if conn is not None:
                    conn.close()
                conn = self.conns[slot] = await self._connect(phase)
                if conn is None:
                    return
            request = self.requests[self.lengths[slot].randrange(len(self.requests))]
            try:
                await conn.exchange(request)
            except ConnectionError as exc:
                phase.error("connection", str(exc))
                conn.close()
                continue
            self._record(conn, phase, time.perf_counter())

    def _record(self, conn: _Connection, phase: _Phase, finished: float) -> None:
        if conn.status != 200:
            phase.error(f"status_{conn.status}", bytes(conn.body).decode("utf-8", "replace"))
        elif not self.spec.stream and b'"choices"' not in conn.body:
            phase.error("bad_body", bytes(conn.body).decode("utf-8", "replace"))
        elif self.spec.stream and conn.error_event:
            phase.error("error_event", f"{conn.chunks} chunks")
        elif self.spec.stream and not (conn.done and conn.first_content_at):
            kind = "no_content" if conn.done else "no_done"
            phase.error(kind, f"{conn.chunks} chunks")
        else:
            phase.latencies.append(finished - conn.sent_at)
            if self.spec.stream:
                phase.ttfts.append(conn.first_content_at - conn.sent_at)
                phase.chunks += conn.chunks - 1  # the [DONE] line is no chunk
                phase.reads += conn.reads

    async def run_phase(self, duration: float, budget: int | None) -> _Phase:
        phase = _Phase(time.perf_counter() + duration, budget)
        workers = [self._worker(slot, phase) for slot in range(self.spec.concurrency)]
        try:
            await asyncio.wait_for(asyncio.gather(*workers), duration + self.spec.grace_s)
        except TimeoutError:
            phase.error("timeout", f"requests still running {self.spec.grace_s}s after the end")
            for conn in self.conns:
                if conn is not None:
                    conn.close()
        return phase

    def close(self) -> None:
        for conn in self.conns:
            if conn is not None:
                conn.close()


def _cpu(pids: Mapping[str, int]) -> dict[str, float]:
    seconds = {name: tree_cpu_seconds(pid) for name, pid in pids.items()}
    seconds["machine"] = machine_busy_seconds()
    return seconds


def _client_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _run(spec: LoadSpec) -> dict[str, Any]:
    runner = _Runner(spec)
    try:
        warm = await runner.run_phase(spec.warmup_s, spec.warmup_requests)
        cpu_before, client_before = _cpu(spec.cpu_pids), _client_cpu()
        started = time.perf_counter()
        phase = await runner.run_phase(spec.duration_s, spec.max_requests)
        elapsed = time.perf_counter() - started
        cpu_after, client_after = _cpu(spec.cpu_pids), _client_cpu()
    finally:
        runner.close()
    done = len(phase.latencies)
    result: dict[str, Any] = {
        "requests": done,
        "errors": sum(phase.errors.values()),
        "error_kinds": phase.errors,
        "error_samples": phase.samples,
        "elapsed_s": elapsed,
        "req_per_s": done / elapsed if elapsed > 0 else 0.0,
        "latency_ms": percentiles(phase.latencies),
        "cpu_s": {name: cpu_after[name] - cpu_before[name] for name in cpu_after},
        "client_cpu_s": client_after - client_before,
        "warmup": {"requests": len(warm.latencies), "errors": sum(warm.errors.values())},
    }
    if spec.stream:
        result["chunks"] = phase.chunks
        result["chunks_per_s"] = phase.chunks / elapsed if elapsed > 0 else 0.0
        result["chunks_per_request"] = phase.chunks / done if done else 0.0
        result["reads_per_request"] = phase.reads / done if done else 0.0
        result["ttft_ms"] = percentiles(phase.ttfts)
    return result


def run_spec(spec: LoadSpec) -> dict[str, Any]:
    """Run one load point in this process, on uvloop."""
    import uvloop  # imported here: the parent process never needs it

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(_run(spec))


def run_in_subprocess(spec: LoadSpec, *, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Run one load point in a fresh `python -m owngate_bench.loadgen` and return its result."""
    budget = spec.warmup_s + spec.duration_s + 2 * spec.grace_s + 30.0
    return run_json_module("owngate_bench.loadgen", spec.to_json(), budget, env)


def main(argv: Sequence[str] | None = None) -> int:
    return json_module_main(
        argv, "owngate_bench.loadgen", "Closed-loop load generator.", LoadSpec.from_json, run_spec
    )


if __name__ == "__main__":
    raise SystemExit(main())
