"""Seeded request traces for the routing benchmark: workloads shaped like real traffic,
open-loop arrival times, and the trace file the load generator replays.

A workload is a kind of request at real scale (chat ~1k prompt tokens / 1k out, RAG 8k /
512, office 4k / 500), its prompt a system prompt shared by many requests (one of a few
variants) plus a unique user turn. Outputs are scaled down by `output_scale` so runs are
short (see `owngate_bench.routing` for how the simulators' speeds are scaled to match).
The simulator counts a prompt token per 4 bytes of text, so a part of N tokens is 4N
ASCII characters; texts are slices of a seeded pseudo-word corpus.

Arrivals are open loop: gamma-distributed gaps with shape `burstiness` (1.0 is a Poisson
process; below 1 burstier, as `vllm bench serve --burstiness`), at `rate` requests/s.
The same `TraceSpec` always gives the same trace, byte for byte.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

__all__ = [
    "CHAT",
    "OFFICE",
    "RAG",
    "TraceRequest",
    "TraceSpec",
    "Workload",
    "arrival_times",
    "build_trace",
    "read_trace",
    "write_trace",
]

# The corpus vocabulary: plain ASCII office words, one space apart.
_VOCABULARY = (
    "the of and to in is for on with as by at from that this are be or an it not which "
    "report table customer policy contract invoice revenue quarter summary section clause "
    "model server request token cache queue batch region retention data backend tenant "
    "analysis figure growth margin forecast budget review draft letter meeting agenda "
    "product release support ticket incident migration schedule project risk owner"
)
_CORPUS_CHARS = 1 << 20


@dataclass(frozen=True, slots=True)
class Workload:
    """One kind of request at real scale; `system_variants` system prompts are shared."""

    name: str
    prompt_tokens: int  # mean prompt, system prompt included
    output_tokens: int  # at real scale, before `TraceSpec.output_scale`
    system_tokens: int
    system_variants: int
    spread: float = 0.3  # lognormal sigma of the unique user turn's length


CHAT = Workload(
    "chat", prompt_tokens=1000, output_tokens=1000, system_tokens=200, system_variants=8
)
RAG = Workload("rag", prompt_tokens=8000, output_tokens=512, system_tokens=300, system_variants=4)
OFFICE = Workload(
    "office", prompt_tokens=4000, output_tokens=500, system_tokens=3000, system_variants=24
)


@dataclass(frozen=True, slots=True)
class TraceSpec:
    """Everything a trace is generated from."""

    mix: tuple[tuple[Workload, float], ...]  # workloads and their shares of requests
    rate: float  # requests per second
    duration_s: float
    burstiness: float = 1.0
    output_scale: float = 1.0 / 16
    seed: int = 0
    model: str = "bench-model"

    def output_tokens(self, workload: Workload) -> int:
        return max(1, round(workload.output_tokens * self.output_scale))

    def mean(self, field: str) -> float:
        """Share-weighted mean of a workload's `prompt_tokens` or scaled `output_tokens`."""
        total = sum(share for _, share in self.mix)
        if field == "output_tokens":
            return sum(self.output_tokens(w) * s for w, s in self.mix) / total
        return sum(float(getattr(w, field)) * s for w, s in self.mix) / total

    def describe(self) -> dict[str, Any]:
        found = dataclasses.asdict(self)
        found["mix"] = [
            {**dataclasses.asdict(w), "share": s, "scaled_output_tokens": self.output_tokens(w)}
            for w, s in self.mix
        ]
        return found


@dataclass(frozen=True, slots=True)
class TraceRequest:
    at: float  # seconds after the trace starts
    workload: str
    body: dict[str, Any]


def arrival_times(
    rate: float, duration_s: float, burstiness: float, rng: random.Random
) -> list[float]:
    """Open-loop arrival times in [0, duration_s): gamma gaps of mean 1 / rate."""
    if rate <= 0 or burstiness <= 0:
        raise ValueError("rate and burstiness must be > 0")
    times: list[float] = []
    at = 0.0
    while True:
        at += rng.gammavariate(burstiness, 1.0 / (rate * burstiness))
        if at >= duration_s:
            return times
        times.append(at)


def _corpus(rng: random.Random) -> str:
    vocabulary = _VOCABULARY.split(" ")
    words: list[str] = []
    size = 0
    while size < _CORPUS_CHARS:
        word = rng.choice(vocabulary)
        words.append(word)
        size += len(word) + 1
    return " ".join(words)


class _Texts:
    """Slices of one corpus: N tokens of text are 4N characters."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)  # noqa: S311 - a reproducible benchmark trace
        self._corpus = _corpus(self._rng)

    def text(self, tokens: int, header: str = "") -> str:
        size = max(4 * tokens - len(header), 0)
        start = self._rng.randrange(len(self._corpus) - size)
        return header + self._corpus[start : start + size]


def build_trace(spec: TraceSpec) -> list[TraceRequest]:
    """The trace `spec` describes: the same list for the same spec."""
    rng = random.Random(spec.seed)  # noqa: S311 - a reproducible benchmark trace
    texts = _Texts(spec.seed + 1)
    systems = {
        w.name: [
            texts.text(w.system_tokens, f"[{w.name} assistant #{i}] ")
            for i in range(w.system_variants)
        ]
        for w, _ in spec.mix
    }
    workloads = [w for w, _ in spec.mix]
    shares = [s for _, s in spec.mix]
    trace: list[TraceRequest] = []
    for at in arrival_times(spec.rate, spec.duration_s, spec.burstiness, rng):
        workload = rng.choices(workloads, shares)[0]
        system = rng.choice(systems[workload.name])
        unique = workload.prompt_tokens - workload.system_tokens
        sigma = workload.spread
        # lognormal with mean `unique` (mu = ln(mean) - sigma^2 / 2), within 1/8x..1.8x
        drawn = rng.lognormvariate(math.log(unique) - sigma * sigma / 2, sigma)
        tokens = round(min(max(drawn, unique / 8), unique * 1.8))
        body = {
            "model": spec.model,
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": texts.text(tokens)},
            ],
            "max_tokens": spec.output_tokens(workload),
            "stream": True,
        }
        trace.append(TraceRequest(at, workload.name, body))
    return trace


def write_trace(path: Path, trace: Sequence[TraceRequest]) -> None:
    """One JSON object per line: `at`, `workload`, `body`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as out:
        for request in trace:
            out.write(
                orjson.dumps({"at": request.at, "workload": request.workload, "body": request.body})
            )
            out.write(b"\n")


def read_trace(path: Path) -> list[TraceRequest]:
    trace: list[TraceRequest] = []
    with path.open("rb") as lines:
        for line in lines:
            item = orjson.loads(line)
            trace.append(TraceRequest(float(item["at"]), str(item["workload"]), item["body"]))
    return trace
