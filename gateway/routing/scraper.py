"""Scrape each private backend's `/metrics` and keep its latest load signals.

One background task per gateway scrapes every vLLM, llama.cpp and SGLang backend every
`scrape.interval_s`, each on its own schedule, over a small connection pool of its own (so a slow
scrape never takes a connection from requests). Only the lines of the metrics we read
are parsed. A reading older than `scrape.staleness_s` is reported as unknown (None),
never as idle; a failed scrape leaves the last reading to age out.

Each round also probes `/health`. `gateway.routing.health` judges each outcome: several
failures in a row (`health.failures_to_down`), with no traffic answered in between and
never for the last backend up for a model, mark the backend unhealthy (no requests until
a probe answers 200) and open its circuit breaker; a 200 after the breaker's cooldown is
the half-open probe that closes it (gateway/routing/breaker.py).

A llama.cpp backend without `capacity.max_concurrency` has its slot count learned from
`/props` (`total_slots`, llama-server's `--parallel`), or failing that from the length
of `/slots`; it is learned again after the backend was unhealthy (a restart may change it).
Until one is learned both are asked, so an answer longer, or with more arrays and objects,
than a slot list has (`MAX_SLOTS_BYTES`, `MAX_SLOT_CONTAINERS`) is neither read on nor
parsed (building millions of empty lists held the event loop 0.3 s a document), and after
a round that learned none they are asked again after 1, 2, 4 ... rounds, at most
`MAX_SLOT_BACKOFF_ROUNDS` (a round after the backend was unhealthy asks at once).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import orjson

from gateway.config.schema import HealthSettings, ScrapeSettings
from gateway.logs import get_logger
from gateway.routing.health import Verdict
from gateway.routing.prometheus import parse_metrics
from gateway.routing.registry import BackendState
from gateway.routing.signals import (
    MAX_LEARNED_SLOTS,
    BackendKind,
    BackendLoad,
    load_from_metrics,
    metric_names,
    slots_total_from_props,
    slots_total_from_slots,
)
from gateway.upstream.http import HttpPool, UpstreamError

__all__ = [
    "MAX_HEALTH_BYTES",
    "MAX_KEPT_BYTES",
    "MAX_KEPT_LINES",
    "MAX_SCRAPE_BYTES",
    "MAX_SLOTS_BYTES",
    "MAX_SLOT_BACKOFF_ROUNDS",
    "MAX_SLOT_CONTAINERS",
    "MetricsScraper",
    "Reading",
    "filter_exposition",
]

SCRAPED_KINDS: frozenset[str] = frozenset({"vllm", "llamacpp", "sglang"})
# What a scrape may be: vLLM's whole /metrics is tens of KiB, the lines read a few per
# engine or scheduler (SGLang with every TP rank of 64 schedulers: ~35 KiB).
MAX_SCRAPE_BYTES = 4 * 1024 * 1024  # a /metrics answer (the pool's; others less, below)
MAX_KEPT_BYTES = 256 * 1024  # the sample lines of the metrics read
# and how many: each is parsed in Python (12 us), 9,000 short ones were 40 ms a round
MAX_KEPT_LINES = 1024  # 64 engines or schedulers x 4 metrics: 256
# What of a `/props` or `/slots` answer is parsed at all: its bytes, and the arrays and
# objects it opens (brackets in its strings counted too). llama-server's `/props` is a few
# KiB, a slot of its `/slots` 1.3 KiB and a dozen arrays and objects (some 400 slots fit:
# `/slots` is read only where `/props` has no `total_slots`). Parsed as they came, 4 MiB
# of `[],[],...` were 1.4 million lists, 120 MB and 0.3 s of the event loop (of
# `{"0":0,"1":0,...}`, 0.15 s), each round until a count was learned
# (tests/integration/test_scrape_answer_bound.py); within both bounds ~20 ms at most (one
# object of 45,000 members), and asked again after 1, 2, 4 ... 32 rounds.
MAX_SLOTS_BYTES = 512 * 1024
MAX_SLOT_CONTAINERS = 64 * MAX_LEARNED_SLOTS
MAX_SLOT_BACKOFF_ROUNDS = 32  # 16 s at the default `scrape.interval_s`
MAX_HEALTH_BYTES = 64 * 1024  # a `/health` answer is its status; llama-server's body: 15 B


@dataclass(frozen=True, slots=True)
class Reading:
    load: BackendLoad
    at: float  # clock time of the scrape


class _Target:
    def __init__(self, state: BackendState, scrape: ScrapeSettings) -> None:
        backend, auth_header = state.config, state.auth_header
        assert backend.base_url is not None
        self.state = state
        self.id = backend.id
        self.kind: BackendKind = backend.kind  # type: ignore[assignment]
        self.names = metric_names(self.kind)
        self.headers = [(b"authorization", auth_header)] if auth_header else []
        self.pool, prefix = HttpPool.for_url(
            backend.base_url,
            connect_timeout=scrape.timeout_s,
            first_byte_timeout=scrape.timeout_s,
            read_timeout=scrape.timeout_s,
            max_connections=2,
            max_body=MAX_SCRAPE_BYTES,
            tls=state.tls,  # authenticated as requests are: a probe is no way around it
        )
        self.path = prefix + b"/metrics"
        self.health_path = prefix + b"/health"
        self.props_path = prefix + b"/props"
        self.slots_path = prefix + b"/slots"
        self.learns_slots = backend.kind == "llamacpp" and not backend.capacity.max_concurrency
        self.slot_rounds_left = 0  # rounds until slots are asked for again
        self.slot_backoff = 1  # the rounds passed after the next round that learns none


class MetricsScraper:
    def __init__(
        self,
        backends: Iterable[BackendState],
        scrape: ScrapeSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
        health: HealthSettings | None = None,
        last_up: Callable[[BackendState], bool] = lambda _backend: False,
    ) -> None:
        """`last_up(backend)`: whether it is the last backend up for some model it serves
        (`Registry.last_up`); probes never take such a backend out."""
        self._settings = scrape
        self._staleness_s = scrape.staleness_s  # read per candidate per request: a plain float
        self._clock = clock
        self._health = health or HealthSettings()
        self._last_up = last_up
        self._targets = [
            _Target(b, scrape)
            for b in backends
            if b.config.kind in SCRAPED_KINDS and b.config.base_url
        ]
        self._readings: dict[str, Reading] = {}
        self._failures: dict[str, str] = {}
        self._log = get_logger("owngate.scraper")

    def load(self, backend_id: str) -> BackendLoad | None:
        """The backend's latest load, or None when unknown (never scraped, or stale)."""
        reading = self._readings.get(backend_id)
        if reading is None or self._clock() - reading.at > self._staleness_s:
            return None
        return reading.load

    def age(self, backend_id: str) -> float | None:
        reading = self._readings.get(backend_id)
        return None if reading is None else self._clock() - reading.at

    def failure(self, backend_id: str) -> str | None:
        return self._failures.get(backend_id)

    @property
    def interval_s(self) -> float:
        return self._settings.interval_s

    async def run(self) -> None:
        """Scrape forever, each backend on its own schedule (one that answers slowly, or
        never, costs its own rounds up to `timeout_s` a read, never the others': in one
        shared round their readings would wait for it, and go stale); cancel to stop."""
        if not self._targets:
            return
        try:
            async with asyncio.TaskGroup() as group:
                for target in self._targets:
                    group.create_task(self._run_target(target))
        finally:
            await self.close()

    async def _run_target(self, target: _Target) -> None:
        while True:
            started = self._clock()
            await self._scrape_bounded(target)  # logs and outlives any failure
            elapsed = self._clock() - started
            await asyncio.sleep(max(0.0, self._settings.interval_s - elapsed))

    async def close(self) -> None:
        for target in self._targets:
            await target.pool.close()

    async def scrape_once(self) -> None:
        """Probe and scrape every backend once; each target is bounded by `timeout_s`."""
        await asyncio.gather(*(self._scrape_bounded(t) for t in self._targets))

    async def _scrape_bounded(self, target: _Target) -> None:
        # Independent targets: one slow or broken backend never delays the others.
        timeout = self._settings.timeout_s
        try:
            try:
                async with asyncio.timeout(timeout):
                    await self._probe_health(target)
            except TimeoutError:
                self._probe_failed(
                    target, "/health: no answer within scrape.timeout_s", refused=False
                )
            if target.learns_slots and target.state.learned_slots is None:
                await self._learn_slots_bounded(target)
            try:
                async with asyncio.timeout(timeout):
                    await self._scrape(target)
            except TimeoutError:
                self._record_failure(target, "timeout: no answer within scrape.timeout_s")
        except Exception as exc:  # noqa: BLE001 - logged; the scraper must outlive any one bug
            self._log.exception("scrape failed unexpectedly", backend=target.id)
            self._record_failure(target, f"internal error: {type(exc).__name__}")

    async def _scrape(self, target: _Target) -> None:
        inflight = target.state.global_inflight  # as the backend's numbers are taken
        try:
            response = await target.pool.request(b"GET", target.path, target.headers, b"")
            body = await response.read()
        except UpstreamError as exc:
            self._record_failure(target, f"{exc.kind}: {exc.detail}")
            return
        if response.status != 200:
            self._record_failure(target, f"HTTP {response.status}")
            return
        try:
            samples = parse_metrics(filter_exposition(body, target.names))
            load = load_from_metrics(target.kind, samples)
        except (ValueError, UnicodeDecodeError) as exc:
            self._record_failure(target, f"unreadable metrics: {exc}")
            return
        slots = target.state.learned_slots
        if slots is not None and load.slots_total is None:
            load = dataclasses.replace(load, slots_total=slots, gateway_inflight=inflight)
        else:
            load = dataclasses.replace(load, gateway_inflight=inflight)
        self._readings[target.id] = Reading(load, self._clock())
        if self._failures.pop(target.id, None) is not None:
            self._log.info("backend metrics recovered", backend=target.id)

    async def _probe_health(self, target: _Target) -> None:
        """`/health` must answer 200; a backend marked down (say, a llama.cpp server still
        loading its model answers 503) gets no requests until it does."""
        try:
            response = await target.pool.request(b"GET", target.health_path, target.headers, b"")
            await response.read(MAX_HEALTH_BYTES)
        except UpstreamError as exc:
            if exc.kind == "exhausted":  # the gateway's own descriptors, no word on the backend
                return  # (the scrape after it meets the same and says so)
            # A refused connection is an answer; no answer in time, or a broken one, is not.
            # A certificate that is not this backend's is a refusal too, and says why.
            refused = exc.kind == "tls" or (
                exc.kind == "connect" and not isinstance(exc.__cause__, TimeoutError)
            )
            reason = f"/health: tls: {exc.detail}" if exc.kind == "tls" else f"/health: {exc.kind}"
            self._probe_failed(target, reason, refused=refused)
            return
        if response.status != 200:
            self._probe_failed(target, f"/health answered HTTP {response.status}", refused=True)
            return
        state = target.state
        state.probe.passed(state.answered)
        self._healthy(target)

    def _probe_failed(self, target: _Target, reason: str, *, refused: bool) -> None:
        state = target.state
        needed = self._health.failures_to_down
        verdict = state.probe.failed(
            state.answered, refused=refused, failures_to_down=needed, last_up=self._last_up(state)
        )
        failures = state.probe.failures
        if verdict is Verdict.up:  # it answered traffic since the last probe: alive
            self._healthy(target)
        elif verdict is Verdict.down:
            self._mark_unhealthy(target, reason)
        elif verdict is Verdict.kept:
            if failures == needed:
                self._log.warning(
                    "backend failed its health probes but is the last one up for a model: "
                    "kept until requests to it fail",
                    backend=target.id,
                    reason=reason,
                    failures=failures,
                )
            self._clear_mark(target, "backend routable again: the last one up for a model")
        elif failures == 1:
            self._log.info(
                "backend health probe failed", backend=target.id, reason=reason, down_after=needed
            )

    def _healthy(self, target: _Target) -> None:
        self._clear_mark(target, "backend healthy")
        target.state.breaker.probe_ok(self._clock())

    def _clear_mark(self, target: _Target, message: str) -> None:
        state = target.state
        if state.unhealthy_until:
            self._log.info(message, backend=target.id)
        state.unhealthy_until = 0.0
        state.health_error = None

    async def _learn_slots_bounded(self, target: _Target) -> None:
        if target.slot_rounds_left > 0:
            target.slot_rounds_left -= 1
            return
        try:
            async with asyncio.timeout(self._settings.timeout_s):
                await self._learn_slots(target)
        except TimeoutError:
            pass
        if target.state.learned_slots is None:  # asked again after 1, 2, 4 ... rounds
            target.slot_rounds_left = target.slot_backoff
            target.slot_backoff = min(2 * target.slot_backoff, MAX_SLOT_BACKOFF_ROUNDS)

    async def _learn_slots(self, target: _Target) -> None:
        """llama.cpp's slot count: `/props` `total_slots`, else the length of `/slots`."""
        slots = None
        for path in (target.props_path, target.slots_path):
            try:
                response = await target.pool.request(b"GET", path, target.headers, b"")
                body = await response.read(MAX_SLOTS_BYTES)  # not parsed past it: not read
            except UpstreamError as exc:
                if exc.kind == "too_large":
                    continue  # its connection dropped, read no further
                return
            if response.status != 200:
                continue
            if body.count(b"[") + body.count(b"{") > MAX_SLOT_CONTAINERS:
                continue  # no slot count: not parsed
            try:
                doc = orjson.loads(body)
            except orjson.JSONDecodeError:
                continue
            if isinstance(doc, dict):
                slots = slots_total_from_props(doc)
            elif isinstance(doc, list):
                slots = slots_total_from_slots(doc)
            if slots is not None:
                break
        if slots is not None:
            target.state.learned_slots = slots
            self._log.info("backend slots learned", backend=target.id, slots=slots)

    def _mark_unhealthy(self, target: _Target, reason: str) -> None:
        """Down on probe evidence: no requests until a probe passes (`ProbeHealth`)."""
        state = target.state
        if state.health_error != reason:
            self._log.warning("backend unhealthy", backend=target.id, reason=reason)
        # Unhealthy until a later probe says otherwise, or until this reading goes stale.
        now = self._clock()
        state.unhealthy_until = now + self._settings.staleness_s
        state.health_error = reason
        state.breaker.probe_failed(now, reason)
        if target.learns_slots:
            state.learned_slots = None  # a restarted server may run another --parallel
            target.slot_rounds_left, target.slot_backoff = 0, 1  # asked at once

    def _record_failure(self, target: _Target, reason: str) -> None:
        if self._failures.get(target.id) != reason:
            self._log.warning("backend metrics scrape failed", backend=target.id, reason=reason)
        self._failures[target.id] = reason


def filter_exposition(body: bytes, names: frozenset[str], limit: int = MAX_KEPT_BYTES) -> str:
    """Keep only the sample lines of the wanted metrics (comments and others dropped), in
    their order; `ValueError` when they take more than `limit` bytes or `MAX_KEPT_LINES`.

    The body is searched for each name at a line start, not split into lines: a scrape
    costs a few scans of it at C speed, and only the lines kept (a few per engine or
    scheduler) are decoded and parsed in Python. A backend that fills its `/metrics` with
    wanted lines, or one line with a label value of megabytes, would otherwise hold the
    gateway's event loop for seconds every `scrape.interval_s` (the parser's cost)."""
    found: list[tuple[int, bytes]] = []
    size = 0
    text = b"\n" + body
    for name in names:
        # The name and the byte after it (labels, or the value) are searched for at once:
        # a line the name only begins (`name_total 1`, `nameX`) is passed over at C speed,
        # so the lines looked at in Python are those kept, within `limit`. Searched for as
        # a name alone, 4 MiB of such near misses were looked at one by one (0.1 s).
        for needle in (b"\n" + name.encode() + b"{", b"\n" + name.encode() + b" "):
            pos = text.find(needle)
            while pos >= 0:
                end = text.find(b"\n", pos + len(needle))
                line = text[pos + 1 : end if end >= 0 else len(text)]
                size += len(line) + 1
                if size > limit:
                    raise ValueError(f"the metrics read take more than {limit} bytes")
                found.append((pos, line))
                if len(found) > MAX_KEPT_LINES:
                    raise ValueError(f"the metrics read take more than {MAX_KEPT_LINES} lines")
                pos = -1 if end < 0 else text.find(needle, end)
    found.sort()
    return b"".join(line + b"\n" for _, line in found).decode("utf-8")
