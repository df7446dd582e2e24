"""The gateway metrics read at scrape time: collectors over what the gateway already knows
(backend load and breakers, shared state, witnesses, the provenance log, the policy set,
the access log, config reloads), so requests pay nothing for them. `GatewayMetrics`
(metrics.py) registers them; the metric names are the same contract as its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway import access_log

if TYPE_CHECKING:
    from gateway.api.recorder import Recorder
    from gateway.policy_set import TrustPolicies
    from gateway.provenance.writer.cosignature_collector import Cosigning
    from gateway.routing.registry import Registry
    from gateway.routing.scraper import MetricsScraper
    from gateway.state import SharedState

__all__ = [
    "AccessLogCollector",
    "BackendLoadCollector",
    "ConfigCollector",
    "CosigningCollector",
    "PolicyCollector",
    "ProvenanceCollector",
    "StateCollector",
]

_LOAD_GAUGES = {
    "running": "Requests the backend reports running (its /metrics).",
    "waiting": "Requests the backend reports queued (its /metrics).",
    "kv_usage": "KV-cache use the backend reports, 0..1 (its /metrics).",
}


_BREAKER_STATES = ("closed", "open", "half_open")


class BackendLoadCollector(Collector):
    """Scraped backend load as gauges (a backend whose reading is stale is left out), and
    what the gateway itself knows of each backend: its breaker, health, slots, and the
    requests it has in flight to it (`BackendState.inflight`, kept by the router: read
    here rather than set in a gauge twice per request)."""

    def __init__(self, registry: Registry, scraper: MetricsScraper) -> None:
        self._registry = registry
        self._scraper = scraper

    def collect(self) -> Iterator[Metric]:
        families = {
            field: GaugeMetricFamily(f"owngate_backend_{field}", text, labels=["backend"])
            for field, text in _LOAD_GAUGES.items()
        }
        age = GaugeMetricFamily(
            "owngate_backend_metrics_age_seconds",
            "Seconds since the backend's /metrics were last read successfully.",
            labels=["backend"],
        )
        breaker = GaugeMetricFamily(
            "owngate_backend_breaker_state",
            "The backend's circuit breaker: 1 for its current state (closed, open, half_open).",
            labels=["backend", "state"],
        )
        opens = CounterMetricFamily(
            "owngate_backend_breaker_opens",
            "Times the backend's circuit breaker opened (failures or a failed /health probe).",
            labels=["backend"],
        )
        scoped = GaugeMetricFamily(
            "owngate_backend_tenant_breakers_open",
            "Tenants whose own requests made the backend fail and which it admits no "
            "request of now (its circuit breakers scoped to one tenant); others still use it.",
            labels=["backend"],
        )
        up = GaugeMetricFamily(
            "owngate_backend_up",
            "1 while routing may send the private backend requests; 0 while its health "
            "probe marks it down or its circuit breaker admits none.",
            labels=["backend"],
        )
        slots = GaugeMetricFamily(
            "owngate_backend_slots",
            "Concurrency slots: capacity.max_concurrency, or learned from llama.cpp /props.",
            labels=["backend"],
        )
        inflight = GaugeMetricFamily(
            "owngate_backend_inflight",
            "Requests the gateway has in flight to each backend.",
            labels=["backend"],
        )
        now = self._registry.clock()
        for backend_id, state in self._registry.backends.items():
            inflight.add_metric([backend_id], state.inflight)
            current = state.breaker.state.value  # hosted providers have breakers too
            for name in _BREAKER_STATES:
                breaker.add_metric([backend_id, name], 1.0 if name == current else 0.0)
            opens.add_metric([backend_id], state.breaker.opens)
            scoped.add_metric([backend_id], state.tenant_breakers.open_count(now))
            if state.config.is_private:  # the private pool's alerts read it
                up.add_metric([backend_id], 0.0 if self._registry.is_down(state) else 1.0)
            known = state.config.capacity.max_concurrency or state.learned_slots
            if known:
                slots.add_metric([backend_id], known)
            seconds = self._scraper.age(backend_id)
            if seconds is not None:
                age.add_metric([backend_id], seconds)
            load = self._scraper.load(backend_id)
            if load is None:
                continue
            for field, family in families.items():
                value = getattr(load, field)
                if value is not None:
                    family.add_metric([backend_id], value)
        yield from families.values()
        yield inflight
        yield age
        yield breaker
        yield opens
        yield scoped
        yield up
        yield slots


class StateCollector(Collector):
    """Shared state (docs/state.md): healthy or on local fallback, and what it shares."""

    def __init__(self, state: SharedState, registry: Callable[[], Registry]) -> None:
        self._state = state
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        status = self._state.status()
        healthy = GaugeMetricFamily(
            "owngate_state_healthy",
            "1 while shared state works (memory, or Redis answering); 0 while limits and "
            "routing fall back to this replica's local state.",
            labels=["backend"],
        )
        healthy.add_metric([status.backend], 1 if status.healthy else 0)
        yield healthy
        yield GaugeMetricFamily(
            "owngate_state_replicas",
            "Live gateway replicas sharing state, as of the last sync (this one included).",
            value=status.replicas,
        )
        yield CounterMetricFamily(
            "owngate_state_fallbacks",
            "Decisions made on local state because the shared store was unavailable.",
            value=status.fallbacks,
        )
        yield CounterMetricFamily(
            "owngate_state_errors",
            "Shared-store calls that failed or timed out.",
            value=status.errors,
        )
        yield GaugeMetricFamily(
            "owngate_state_pending_revocations",
            "Key revocations made here that the shared store has not stored yet.",
            value=status.pending_revocations,
        )
        yield GaugeMetricFamily(
            "owngate_state_unlisted_revocations",
            "Key revocations made or learned here that this host's revoked keys list does "
            "not hold (its write failed): a process started here without Redis misses them.",
            value=status.unlisted_revocations,
        )
        yield GaugeMetricFamily(
            "owngate_state_revocations_list_damaged",
            "1 while this host's revoked keys list cannot be read (damaged, unreadable, a "
            "look that has not ended): every tenant request is refused; else 0.",
            value=0 if status.revocations_list_error is None else 1,
        )
        yield CounterMetricFamily(
            "owngate_state_revocations_list_rollbacks",
            "Looks that found this host's revoked keys list lacking revocations this "
            "process held (an older copy restored, or removed): written back.",
            value=status.revocations_list_rollbacks,
        )
        yield GaugeMetricFamily(
            "owngate_state_limit_copies",
            "Processes that each enforce every tenant limit in full on their own (a tenant "
            "may get up to this many times its limits): 1 (workers split them).",
            value=status.limit_copies,
        )
        yield GaugeMetricFamily(
            "owngate_state_limit_parts",
            "Processes that each enforce their own part of every tenant limit, the parts "
            "summing to the limit: N for state memory under serve --workers N, else 1.",
            value=status.limit_parts,
        )
        yield CounterMetricFamily(
            "owngate_state_restores",
            "Times this replica found its lease gone and put its tenants' budget use back "
            "into the shared store (Redis lost its data, or this replica stalled).",
            value=status.restores,
        )
        peers = GaugeMetricFamily(
            "owngate_backend_peer_inflight",
            "Requests the other gateway replicas have in flight to each backend, as of the "
            "last shared-state sync.",
            labels=["backend"],
        )
        for backend in self._registry().backends.values():
            peers.add_metric([backend.id], backend.peer_inflight)
        yield peers


class CosigningCollector(Collector):
    """Witness cosignatures on the provenance log's checkpoints (docs/provenance.md)."""

    def __init__(self, cosigning: Cosigning) -> None:
        self._cosigning = cosigning

    def collect(self) -> Iterator[Metric]:
        size = GaugeMetricFamily(
            "owngate_witness_cosigned_size",
            "Tree size of the newest checkpoint each witness cosigned (absent until one).",
            labels=["witness"],
        )
        up = GaugeMetricFamily(
            "owngate_witness_up", "0 while the witness's last attempt failed.", labels=["witness"]
        )
        done = CounterMetricFamily(
            "owngate_witness_cosignatures", "Checkpoints cosigned.", labels=["witness"]
        )
        failed = CounterMetricFamily(
            "owngate_witness_failures",
            "Failed cosigning attempts, by reason (timeout, unreachable, bad_answer, ...).",
            labels=["witness", "reason"],
        )
        for witness in self._cosigning.witnesses:
            if witness.cosigned_size is not None:
                size.add_metric([witness.name], witness.cosigned_size)
            up.add_metric([witness.name], 0 if witness.consecutive_failures else 1)
            done.add_metric([witness.name], witness.cosignatures)
            for reason, count in witness.failures_by_reason.items():
                failed.add_metric([witness.name, reason], count)
        yield from (size, up, done, failed)


class ProvenanceCollector(Collector):
    """The provenance log (docs/provenance.md): whether requests can be recorded (without
    that they are refused), how many entries it holds, and its newest signed checkpoint
    (what witnesses cosign: `owngate_witness_cosigned_size` trails it while they lag)."""

    def __init__(self, recorder: Recorder) -> None:
        self._recorder = recorder

    def collect(self) -> Iterator[Metric]:
        recorder = self._recorder
        opened = recorder.opened
        log = recorder.log if opened else None
        failures = CounterMetricFamily(
            "owngate_receipt_failures",
            "Receipts that could not be signed (the signer raised): the record is in the "
            "log, but the client's answer went out without its receipt, marked "
            "x-owngate-receipt-missing.",
        )
        failures.add_metric([], recorder.receipt_failures)
        yield failures
        yield GaugeMetricFamily(
            "owngate_provenance_ready",
            "1 while the provenance log is open and writable; 0 before it opens and while "
            "a write or checkpoint fails (proxied requests are refused then).",
            value=1 if log is not None and log.last_error is None else 0,
        )
        if log is None:
            return
        yield GaugeMetricFamily(
            "owngate_provenance_entries", "Entries made durable in the log.", value=log.size
        )
        yield GaugeMetricFamily(
            "owngate_provenance_export_age_seconds",
            "How long the checkpoint export in progress has run (0 when none runs); one "
            "that has not returned for provenance.export_stall_after_s (default 60 s) also "
            "makes the log not ready.",
            value=log.export_seconds,
        )
        yield GaugeMetricFamily(
            "owngate_provenance_unsigned_bytes",
            "Bytes of durable log entries no signed checkpoint covers yet, held in memory "
            "until one does; at provenance.max_unsigned_bytes the log is not "
            "ready and new requests are refused (checkpoints failing or hung).",
            value=log.unsigned_bytes[0],
        )
        latest = log.latest_checkpoint()
        if latest is not None:
            yield GaugeMetricFamily(
                "owngate_provenance_checkpoint_size",
                "Tree size of the newest signed checkpoint.",
                value=latest.checkpoint.size,
            )


class PolicyCollector(Collector):
    def __init__(self, trust: TrustPolicies) -> None:
        self._trust = trust

    def collect(self) -> Iterator[Metric]:
        policy = self._trust.current
        info = GaugeMetricFamily(
            "owngate_policy_info",
            "The active trust-policy set (1), by id, version and digest.",
            labels=["id", "version", "digest"],
        )
        info.add_metric([policy.id, policy.version, policy.digest], 1)
        yield info
        failures = CounterMetricFamily(
            "owngate_policy_reload_failures",
            "Policy reloads that failed validation (the last good set stayed active).",
        )
        failures.add_metric([], self._trust.reload_failures)
        yield failures
        yield GaugeMetricFamily(
            "owngate_policy_stale",
            "1 while this worker of serve --workers could not read its policy files (it "
            "refuses requests); summed over the workers.",
            value=1 if self._trust.stale else 0,
        )


class AccessLogCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        dropped = CounterMetricFamily(
            "owngate_access_log_dropped",
            "Access-log lines dropped: the log stream was too slow for the bounded buffer "
            "(or gone).",
        )
        dropped.add_metric([], access_log.dropped_total())
        yield dropped


class ConfigCollector(Collector):
    def __init__(self, failures: Callable[[], int]) -> None:
        self._failures = failures

    def collect(self) -> Iterator[Metric]:
        failures = CounterMetricFamily(
            "owngate_config_reload_failures",
            "gateway.yaml reloads that failed (the running config stayed active).",
        )
        failures.add_metric([], self._failures())
        yield failures
