"""The admin API's timelines: a bounded in-memory history of the running gateway, sampled
every `admin.sample_interval_s` for the console's charts (`/admin/v1/timeline/...`).

Each sample reads what the gateway already keeps: per backend the scraped queue, the
in-flight count and the breaker (the `Runtime`'s registry and scraper), and from its
Prometheus counters what happened since the previous sample: requests and errors per
backend, TTFT p50/p99 estimated from the histogram's bucket deltas, policy decisions and
refusals per rule; and the provenance log's size, newest checkpoint and the size every
witness cosigned. Memory is fixed by the settings and the configured backends and rules:
three deques of at most `history_s / sample_interval_s` samples (capped at
`MAX_SAMPLES`), keyed only by backend and rule ids the config declares, never by a value
a client sent.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from prometheus_client.metrics import MetricWrapperBase

from gateway.api.runtime import Runtime

__all__ = ["BACKEND_FIELDS", "MAX_SAMPLES", "Timeline", "bucket_quantile"]

MAX_SAMPLES = 3600
BACKEND_FIELDS = (
    "waiting",
    "running",
    "inflight",
    "breaker",
    "requests",
    "errors",
    "error_rate",
    "ttft_p50_s",
    "ttft_p99_s",
)
_ERROR_STATUS = 500  # an answer at or above it counts as an error of the backend


def bucket_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """The `q` quantile (0..1) of observations counted in cumulative histogram `buckets`
    (upper bound, count at or below it; ascending, the last +Inf), by linear
    interpolation inside the bucket the rank falls in, as Prometheus'
    `histogram_quantile` does: the first bucket starts at 0, and a rank in the +Inf
    bucket gives the highest finite bound. None when nothing was counted."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for upper, count in buckets:
        if count >= rank and count > below:
            if math.isinf(upper):
                return lower
            return lower + (upper - lower) * (rank - below) / (count - below)
        lower, below = upper, count
    return lower


@dataclass(slots=True)
class _Totals:
    """Counter totals at one sample (what the next sample subtracts)."""

    requests: dict[str, float] = field(default_factory=dict)
    errors: dict[str, float] = field(default_factory=dict)
    ttft: dict[str, dict[float, float]] = field(default_factory=dict)  # backend → le → count
    decisions: dict[str, float] = field(default_factory=dict)
    refusals: dict[str, float] = field(default_factory=dict)


_Sample = TypeVar("_Sample", bound=tuple[Any, ...])


def _after(samples: deque[_Sample], since: float | None) -> list[_Sample]:
    """The samples after `since`: those taken after the newest sample dated `since` (the
    cursor of a client that polls with the last `t` it holds), else those dated after it.
    Sample times are the wall clock's: when it steps back (NTP, a resumed VM, a date set
    wrong then fixed), every new sample is dated before the client's cursor, and `t >
    since` alone answered nothing until the clock caught up (an hour, or years): the
    console's charts froze while the gateway served."""
    if since is None:
        return list(samples)
    held = list(samples)
    for position in range(len(held) - 1, -1, -1):  # bounded: the history's length
        if held[position][0] == since:
            return held[position + 1 :]
    return [sample for sample in held if sample[0] > since]


class Timeline:
    """The sampler and its three bounded histories (oldest sample first)."""

    def __init__(
        self,
        runtime: Runtime,
        *,
        interval_s: float,
        history_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.runtime = runtime
        self.interval_s = interval_s
        size = max(1, min(MAX_SAMPLES, math.ceil(history_s / interval_s)))
        # Kept compact (a tuple per backend, only the rules that moved), as dicts on read.
        self._backends: deque[tuple[float, dict[str, tuple[Any, ...]]]] = deque(maxlen=size)
        self._policies: deque[tuple[float, dict[str, int], dict[str, int]]] = deque(maxlen=size)
        self._log: deque[tuple[float, int | None, int | None, int | None]] = deque(maxlen=size)
        self._clock = clock
        self._last = _Totals()  # the counters start at zero with the gateway

    @property
    def capacity(self) -> int:
        """The most samples each timeline keeps."""
        return self._log.maxlen or 0

    def backends(self, since: float | None = None) -> list[dict[str, Any]]:
        """`{"t", "backends": {id: {waiting, running, inflight, breaker, requests, errors,
        error_rate, ttft_p50_s, ttft_p99_s}}}` per sample after `since`, oldest first."""
        return [
            {
                "t": t,
                "backends": {
                    b: dict(zip(BACKEND_FIELDS, row, strict=True)) for b, row in rows.items()
                },
            }
            for t, rows in _after(self._backends, since)
        ]

    def policies(self, since: float | None = None) -> list[dict[str, Any]]:
        """`{"t", "decisions": {rule: n}, "refusals": {rule: n}}` per sample after `since`."""
        return [
            {"t": t, "decisions": decisions, "refusals": refusals}
            for t, decisions, refusals in _after(self._policies, since)
        ]

    def log(self, since: float | None = None) -> list[dict[str, Any]]:
        """`{"t", "entries", "checkpoint_size", "cosigned_size"}` per sample after `since`."""
        return [
            {"t": t, "entries": entries, "checkpoint_size": size, "cosigned_size": cosigned}
            for t, entries, size, cosigned in _after(self._log, since)
        ]

    async def run(self) -> None:
        """Sample every `interval_s` until cancelled (the admin app's lifespan)."""
        while True:
            self.sample()
            await asyncio.sleep(self.interval_s)

    def sample(self) -> None:
        """Take one sample of each timeline."""
        now = self._clock()
        totals = self._totals()
        last, self._last = self._last, totals
        self._backends.append((now, self._backend_rows(totals, last)))
        rules = self.runtime.parts.policies.current.rules  # declared ones only appear
        decisions = _deltas(totals.decisions, last.decisions, rules)
        refusals = _deltas(totals.refusals, last.refusals, rules)
        self._policies.append((now, decisions, refusals))
        self._log.append((now, *self._log_sizes()))

    def _totals(self) -> _Totals:
        """The counters now, by every label value they have: configured backend ids and
        rule ids (the request path labels them with nothing else), including those a
        reload removed, so one that returns does not count its past again."""
        metrics = self.runtime.parts.metrics
        totals = _Totals()
        for labels, value in _samples(metrics.requests, "_total"):
            _add(totals.requests, labels["backend"], value)
            if int(labels["status"]) >= _ERROR_STATUS:
                _add(totals.errors, labels["backend"], value)
        for labels, value in _samples(metrics.ttft, "_bucket"):
            _add(totals.ttft.setdefault(labels["backend"], {}), float(labels["le"]), value)
        for labels, value in _samples(metrics.decisions, "_total"):
            _add(totals.decisions, labels["rule"], value)
        for labels, value in _samples(metrics.refusals, "_total"):
            _add(totals.refusals, labels["rule"], value)
        return totals

    def _backend_rows(self, totals: _Totals, last: _Totals) -> dict[str, tuple[Any, ...]]:
        parts = self.runtime.parts
        requests = _deltas(totals.requests, last.requests)
        errors = _deltas(totals.errors, last.errors)
        rows: dict[str, tuple[Any, ...]] = {}
        for backend_id, state in parts.registry.backends.items():
            load = parts.scraper.load(backend_id)
            done = requests.get(backend_id, 0)
            failed = errors.get(backend_id, 0)
            now = totals.ttft.get(backend_id, {})
            before = last.ttft.get(backend_id, {})
            buckets = [(le, count - before.get(le, 0.0)) for le, count in sorted(now.items())]
            rows[backend_id] = (  # in BACKEND_FIELDS' order
                None if load is None else load.waiting,
                None if load is None else load.running,
                state.inflight,
                state.breaker.state.value,
                done,
                failed,
                failed / done if done else None,
                bucket_quantile(0.5, buckets),
                bucket_quantile(0.99, buckets),
            )
        return rows

    def _log_sizes(self) -> tuple[int | None, int | None, int | None]:
        recorder = self.runtime.parts.recorder
        log = recorder.log if recorder is not None and recorder.opened else None
        latest = None if log is None else log.latest_checkpoint()
        cosigning = self.runtime.cosigning
        sizes = [] if cosigning is None else [w.cosigned_size for w in cosigning.witnesses]
        known = [size for size in sizes if size is not None]
        return (
            None if log is None else log.size,
            None if latest is None else latest.checkpoint.size,
            # what every witness cosigned (the laggard's size): None until all have
            min(known) if known and len(known) == len(sizes) else None,
        )


def _samples(metric: MetricWrapperBase, suffix: str) -> Iterable[tuple[Mapping[str, str], float]]:
    for family in metric.collect():
        for sample in family.samples:
            if sample.name.endswith(suffix):
                yield sample.labels, sample.value


def _add(totals: dict[Any, float], key: Any, value: float) -> None:
    totals[key] = totals.get(key, 0.0) + value


def _deltas(
    now: Mapping[str, float], before: Mapping[str, float], keep: Container[str] | None = None
) -> dict[str, int]:
    """What each counter (of those in `keep`) added since `before`, only those that moved."""
    moved = {
        key: int(value - before.get(key, 0.0))
        for key, value in now.items()
        if keep is None or key in keep
    }
    return {key: value for key, value in sorted(moved.items()) if value > 0}
