"""`/metrics` of `owngate serve --workers N`: the counts of every worker, summed.

Each worker writes its own exposition text to `<runtime dir>/worker-<i>.prom` every
`interval_s` (write, then an atomic rename) and once more when it stops. A scrape of
`/metrics` on any worker (the kernel spreads connections over them) renders that
worker's live registry and merges the other workers' latest snapshots:

- counters, histograms and summaries are summed per label set (their `_created`
  samples keep the scraped worker's value);
- of gauges, `owngate_backend_inflight` is summed (requests in flight across workers),
  and `owngate_policy_stale` (the workers that could not read their policy files);
  `owngate_provenance_ready` is the lowest (each worker writes its own log: one that
  cannot write refuses its share of the requests, whichever worker is scraped), and
  `owngate_provenance_unsigned_bytes` the highest (each log has its own bound: the
  worker nearest it, whichever is scraped; before, a scrape read one worker's backlog,
  0 or at the bound by which worker the kernel picked);
  every other gauge (build and policy info, the backend load each worker scrapes
  itself) is the scraped worker's own reading, or the first worker's that has it.

The other workers' numbers are at most `interval_s` old. A restarted worker starts its
counters at zero, as a restarted replica does; Prometheus' `rate()` treats the drop as
a counter reset.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from gateway.api.metrics import GatewayMetrics
from gateway.logs import get_logger

__all__ = ["FleetMetrics", "merge_expositions"]

_SUMMED_GAUGES = frozenset({"owngate_backend_inflight", "owngate_policy_stale"})
_LOWEST_GAUGES = frozenset({"owngate_provenance_ready"})
_HIGHEST_GAUGES = frozenset({"owngate_provenance_unsigned_bytes"})
_SUMMED_TYPES = frozenset({"counter", "histogram", "summary", "gaugehistogram"})


class FleetMetrics:
    """One worker's side: publish its snapshot, render the merged view."""

    def __init__(self, directory: Path, worker: int, interval_s: float = 0.5) -> None:
        self.directory = directory
        self.worker = worker
        self.interval_s = interval_s
        self._own = directory / f"worker-{worker}.prom"
        self._log = get_logger("owngate.workers")

    def write(self, metrics: GatewayMetrics) -> None:
        """Replace this worker's snapshot (readers see the old file or the new, whole)."""
        partial = self._own.with_name(f".{self._own.name}.{os.getpid()}")
        try:
            partial.write_bytes(metrics.render())
            partial.replace(self._own)
        except OSError as exc:  # the merged view lacks this worker until the next write
            self._log.error("metrics snapshot not written", path=str(self._own), error=str(exc))

    async def publish(self, metrics: GatewayMetrics) -> None:
        """Write the snapshot every `interval_s`; cancel to stop."""
        while True:
            self.write(metrics)
            await asyncio.sleep(self.interval_s)

    def render(self, metrics: GatewayMetrics) -> bytes:
        texts = [metrics.render().decode()]
        for path in sorted(self.directory.glob("worker-*.prom")):
            if path == self._own:
                continue
            try:
                texts.append(path.read_text(encoding="utf-8"))
            except OSError:
                continue  # a worker between snapshots or gone: the others still count
        return merge_expositions(texts)


def merge_expositions(texts: list[str]) -> bytes:
    """Merge Prometheus text expositions (the first is the scraped process's own)."""
    families: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            merged = families.get(family.name)
            if merged is None:
                merged = families[family.name] = Metric(
                    family.name, family.documentation, family.type, family.unit
                )
                values[family.name] = {}
            summed = family.type in _SUMMED_TYPES or family.name in _SUMMED_GAUGES
            lowest = family.name in _LOWEST_GAUGES
            highest = family.name in _HIGHEST_GAUGES
            samples = values[family.name]
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                if key not in samples:
                    samples[key] = sample.value
                elif summed and not sample.name.endswith("_created"):
                    samples[key] += sample.value
                elif lowest:
                    samples[key] = min(samples[key], sample.value)
                elif highest:
                    samples[key] = max(samples[key], sample.value)
    for name, family in families.items():
        for (sample_name, labels), value in values[name].items():
            family.add_sample(sample_name, dict(labels), value)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(list(families.values())))
    return generate_latest(registry)


class _Fixed(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)
