"""The overhead benchmark's load points, and their repetitions folded into medians.

A point is chat or streams at a fixed number of connections. Streams come in two shapes:
`coalesced`, the zero-latency simulator writing a stream's events back to back (they
reach a proxy several to a read), and `paced`, a simulator that writes one token per
write, `PACE_S` apart (`owngate sim --token-interval`), as a decoding server does, each
token its own read. The body-size points send chat prompts of 1 KB, 32 KB and 100 KB.

Every point runs `reps` times; each repetition runs every target once, in an order
rotated from one repetition (and point) to the next, so no target is always first or
last. `fold` turns a target's repetitions into one result of the same shape whose
numbers are medians of the repetitions' (CPU per request and per chunk are computed per
repetition first: the median of ratios, not a ratio of medians).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "BASE_POINTS",
    "PACED_MODEL",
    "PACE_S",
    "POINTS",
    "Point",
    "derive",
    "fold",
    "rotated",
    "select_points",
]

PACE_S = 0.02
"""Seconds between two tokens of a paced stream (the issue's 20 ms)."""
PACED_MODEL = "bench-paced"
"""The model name the paced simulators serve: owngate routes a paced point by it."""


@dataclasses.dataclass(frozen=True)
class Point:
    """One load: chat requests or streams, at a fixed number of connections."""

    name: str
    stream: bool
    concurrency: int
    shape: str | None = None  # streams: "coalesced" or "paced"
    prompt_bytes: int = 0  # chat: 0 is "hello"; else a prompt of this many bytes

    @property
    def max_tokens(self) -> int:
        return 64 if self.stream else 16  # the simulator sends one chunk per token

    @property
    def paced(self) -> bool:
        return self.shape == "paced"


BASE_POINTS = (
    Point("chat c=1", stream=False, concurrency=1),
    Point("chat c=16", stream=False, concurrency=16),
    Point("chat c=64", stream=False, concurrency=64),
    Point("stream c=16", stream=True, concurrency=16, shape="coalesced"),
    Point("stream c=64", stream=True, concurrency=64, shape="coalesced"),
)
"""The points every target runs, LiteLLM included."""
POINTS = (
    *BASE_POINTS,
    Point("paced c=256", stream=True, concurrency=256, shape="paced"),
    Point("chat 1KB c=16", stream=False, concurrency=16, prompt_bytes=1024),
    Point("chat 32KB c=16", stream=False, concurrency=16, prompt_bytes=32 * 1024),
    Point("chat 100KB c=16", stream=False, concurrency=16, prompt_bytes=100 * 1024),
)


def select_points(names: str) -> tuple[Point, ...]:
    """The points named in a comma-separated list (all when empty), in `POINTS` order."""
    wanted = {n.strip() for n in names.split(",") if n.strip()}
    unknown = sorted(wanted - {p.name for p in POINTS})
    if unknown:
        known = ", ".join(p.name for p in POINTS)
        raise ValueError(f"--points takes names of {known}; unknown: {', '.join(unknown)}")
    return tuple(p for p in POINTS if not wanted or p.name in wanted)


def rotated(names: Sequence[str], offset: int) -> list[str]:
    """`names` rotated left by `offset`: each repetition starts with another target."""
    if not names:
        return []
    cut = offset % len(names)
    return [*names[cut:], *names[:cut]]


def derive(result: dict[str, Any]) -> dict[str, Any]:
    """Add the target's CPU per request (ms) and, for streams, per relayed chunk (µs):
    server CPU over what the client received in the same window."""
    if "error" in result:
        return result
    cpu = result.get("cpu_s", {}).get("target")
    requests, chunks = result.get("requests", 0), result.get("chunks")
    if cpu is not None and requests:
        result["cpu_ms_per_req"] = cpu * 1000 / requests
    if cpu is not None and chunks:
        result["cpu_us_per_chunk"] = cpu * 1e6 / chunks
    return result


def _median(values: Sequence[Any]) -> Any:
    """Medians of numbers, recursively through dicts; else the first value."""
    first = values[0]
    if isinstance(first, bool) or not isinstance(first, int | float | dict):
        return first
    if isinstance(first, dict):
        keys = [k for k in first if all(isinstance(v, dict) and k in v for v in values)]
        return {k: _median([v[k] for v in values]) for k in keys}
    numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    return statistics.median(numbers) if numbers else first


def fold(reps: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One target's repetitions at one point as one result: medians of the good ones,
    errors summed over all; `{"error": ...}` when no repetition ran."""
    good = [r for r in reps if "error" not in r]
    failed = [r for r in reps if "error" in r]
    if not good:
        return {"error": failed[0]["error"] if failed else "not run", "reps": len(reps)}
    found: dict[str, Any] = {
        key: _median([r[key] for r in good if key in r])
        for key in good[0]
        if key not in ("errors", "error_kinds", "error_samples", "requests", "chunks")
    }
    kinds: dict[str, int] = {}
    for rep in good:
        for kind, count in rep.get("error_kinds", {}).items():
            kinds[kind] = kinds.get(kind, 0) + count
    if failed:
        kinds["rep_failed"] = len(failed)
    samples = [s for rep in good for s in rep.get("error_samples", [])]
    samples += [f"rep_failed: {r['error'][:300]}" for r in failed]
    found.update(
        requests=int(statistics.median(r["requests"] for r in good)),
        errors=sum(r.get("errors", 0) for r in good) + len(failed),
        error_kinds=kinds,
        error_samples=samples[:5],
        reps=len(reps),
    )
    if "chunks" in good[0]:
        found["chunks"] = int(statistics.median(r["chunks"] for r in good))
    return found
