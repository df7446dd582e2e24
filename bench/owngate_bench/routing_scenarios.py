"""The routing benchmark's arms and scenarios (`owngate bench routing`, routing.py): the
routing configurations compared, the simulated servers and request mixes each scenario
runs, and the capacity a server has for a mix, from which arrival rates are set.
Scenarios:

- `hetero`: one fast vLLM-like server (64 slots) and one slow llama.cpp-like (4 slots),
  a mix of chat / RAG / office requests, Poisson arrivals at `--load` of the pool's
  capacity; also the scorer without `capacity.max_concurrency` (`score_no_slots`);
- `uniform`: two identical vLLM-like servers, the same mix, bursty arrivals; also the
  scorer without its prefill-backlog term (`score_no_prefill`: `weights.prefill: 0`);
- `prefix`: two identical vLLM-like servers with prefix caching on, a mix where most
  requests share one of many long system prompts.

The last also runs the scorer without its prefix-affinity term
(`score_no_affinity`: `weights.affinity: 0`). Prefix caching is off in the first two, so
their capacity is what the settings say and the comparison is about queueing alone.

Time is scaled so a run takes seconds: output tokens are 1/16 of the real workload's
(chat 1k in / 62 out), prefill runs 16x faster than the simulator's defaults, so every
decode step keeps its real make-up (the same batch and the same prefill per step) and a
request takes 1/16 of the steps; `--speed` then divides every duration (decode and
prefill rates multiplied, the gateway's scrape interval and staleness divided, so as
many requests arrive between two scrapes as in production). Capacity, the rate at which
each server runs full batches, is computed from the simulator settings and the mix
(`capacity`), and arrivals are set at `--load` of the pool's sum.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Literal

from owngate_bench.arrivals import CHAT, OFFICE, RAG, Workload

if TYPE_CHECKING:  # the simulator loads only when a run starts
    from gateway.sim import SimSettings

__all__ = [
    "ARMS",
    "MODEL",
    "OUTPUT_SCALE",
    "Arm",
    "Scenario",
    "capacity",
    "fast_server",
    "scenarios",
    "slow_server",
]

MODEL = "bench-model"
OUTPUT_SCALE = 16  # real output tokens per simulated one; prefill runs this much faster

Strategy = Literal["score", "least_inflight", "round_robin"]


@dataclasses.dataclass(frozen=True)
class Arm:
    """One routing configuration under test."""

    name: str
    strategy: Strategy
    affinity: float = 0.5  # weights.affinity of the score strategy (its default)
    prefill: float = 1.0  # weights.prefill of the score strategy (its default)
    declare_slots: bool = True  # capacity.max_concurrency set to each server's slots


ARMS = {
    arm.name: arm
    for arm in (
        Arm("round_robin", "round_robin"),
        Arm("least_inflight", "least_inflight"),
        Arm("score", "score"),
        Arm("score_no_affinity", "score", affinity=0.0),
        Arm("score_no_prefill", "score", prefill=0.0),
        Arm("score_no_slots", "score", declare_slots=False),
    )
}


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    backends: tuple[tuple[str, SimSettings], ...]
    mix: tuple[tuple[Workload, float], ...]
    burstiness: float
    arms: tuple[str, ...]


def fast_server(speed: float, *, prefix_cache: bool, seed: int) -> SimSettings:
    """A vLLM-like server: 64 slots, 256k tokens of KV cache, 8k prefill / 60 decode tok/s
    at real scale."""
    from gateway.sim import SimSettings

    base = SimSettings.for_kind("vllm", models=(MODEL,), seed=seed)
    return dataclasses.replace(
        base,
        n_ctx=32768,
        kv_capacity_tokens=262144,
        prefill_tokens_per_s=base.prefill_tokens_per_s * OUTPUT_SCALE * speed,
        decode_tokens_per_s=base.decode_tokens_per_s * speed,
        prefix_cache_tokens=None if prefix_cache else 0,
    )


def slow_server(speed: float, *, prefix_cache: bool, seed: int) -> SimSettings:
    """A llama.cpp-like server (`llama-server -np 4 -c 65536`): 4 slots of 16k context,
    2k prefill / 40 decode tok/s at real scale, decode slowing 15 % per extra sequence."""
    from gateway.sim import SimSettings

    base = SimSettings.for_kind("llamacpp", models=(MODEL,), seed=seed)
    return dataclasses.replace(
        base,
        n_ctx=16384,
        kv_capacity_tokens=65536,
        prefill_tokens_per_s=base.prefill_tokens_per_s * OUTPUT_SCALE * speed,
        decode_tokens_per_s=base.decode_tokens_per_s * speed,
        prefix_cache_tokens=None if prefix_cache else 0,
    )


# The mixes: chat 1k/1k, RAG 8k/512 and office 4k/500 at real scale.
_MIXED = ((CHAT, 0.5), (RAG, 0.25), (OFFICE, 0.25))
# Many applications, each with its own long system prompt (64 prompts of 3k tokens: more
# than one server's prefix cache holds next to the unique turns passing through it).
_APPS = dataclasses.replace(OFFICE, name="apps", system_variants=64)
_SHARED = ((_APPS, 0.7), (CHAT, 0.3))


def scenarios(speed: float) -> list[Scenario]:
    """The benchmark's scenarios at time scale `speed`."""
    return [
        Scenario(
            "hetero",
            "heterogeneous pool: vLLM-like (64 slots) + llama.cpp-like (4 slots), Poisson",
            (
                ("vllm", fast_server(speed, prefix_cache=False, seed=1)),
                ("llamacpp", slow_server(speed, prefix_cache=False, seed=2)),
            ),
            _MIXED,
            burstiness=1.0,
            arms=("round_robin", "least_inflight", "score", "score_no_slots"),
        ),
        Scenario(
            "uniform",
            "uniform pool: two vLLM-like servers (64 slots each), bursty (gamma shape 0.5)",
            (
                ("vllm-a", fast_server(speed, prefix_cache=False, seed=1)),
                ("vllm-b", fast_server(speed, prefix_cache=False, seed=2)),
            ),
            _MIXED,
            burstiness=0.5,
            arms=("round_robin", "least_inflight", "score", "score_no_prefill"),
        ),
        Scenario(
            "prefix",
            "shared prefixes: two vLLM-like servers with prefix caching, 64 long system "
            "prompts, Poisson",
            (
                ("vllm-a", fast_server(speed, prefix_cache=True, seed=1)),
                ("vllm-b", fast_server(speed, prefix_cache=True, seed=2)),
            ),
            _SHARED,
            burstiness=1.0,
            arms=("round_robin", "least_inflight", "score", "score_no_affinity"),
        ),
    ]


def capacity(settings: SimSettings, prompt_tokens: float, output_tokens: float) -> float:
    """Requests/s one server completes running full batches of a mix with these means.

    Slots are the configured ones, or fewer when the KV cache cannot hold that many
    prompts. With S sequences of O output tokens running, S / O are admitted per step on
    average, so a step takes the decode time at batch S plus the prefill of S / O
    prompts; S / O requests complete per step. Prefix-cache hits are not counted.
    """
    held = prompt_tokens + output_tokens / 2
    slots = max(1.0, min(float(settings.slots), settings.kv_capacity_tokens / held))
    decode = (1.0 + settings.batch_slowdown * (slots - 1)) / settings.decode_tokens_per_s
    prefill = slots * prompt_tokens / (output_tokens * settings.prefill_tokens_per_s)
    return slots / output_tokens / (decode + prefill)
