"""Active health: when failed `/health` probes take a backend out of routing.

One slow probe is not evidence enough. A llama-server whose few HTTP threads are busy
streaming answers `/health` late while it serves every request; taking it out on one
missed probe turned a working pool into 503s. So the scraper (gateway/routing/scraper.py)
hands each probe's outcome to the backend's `ProbeHealth`, which says what to do:

- A probe that answers 200 passes. So does a failed one when the backend answered traffic
  since the previous probe (`BackendState.answered` moved: response headers with a status
  below 500, or stream chunks, relayed from it): a backend that serves requests is alive,
  whatever its `/health` said.
- Otherwise the probe failed, and `health.failures_to_down` failures in a row mark the
  backend down (`Verdict.down`: unhealthy, and its circuit breaker opened at the base
  cooldown). Fewer leave it as it is (`Verdict.suspect`). Two exceptions:
  - A backend not seen alive yet (since the gateway started, or since it was last marked
    down) whose probe was *refused* (connection refused, or an HTTP answer other than 200,
    as from a llama.cpp server still loading its model) is down at once: nothing says it
    is alive. A probe that merely got no answer in time never counts as a refusal.
  - A backend that would be marked down while it is the last one up for some model it
    serves is kept (`Verdict.kept`): probes alone never empty a pool; real request
    failures, through its circuit breaker (gateway/routing/breaker.py), still take it
    out.

Nothing here does I/O or reads a clock; the scraper applies the verdicts.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["ProbeHealth", "Verdict"]


class Verdict(enum.Enum):
    """What one probe outcome means for routing."""

    up = "up"  # passed (or the backend answered traffic): clear any probe mark
    suspect = "suspect"  # failed, fewer than `failures_to_down` in a row: no change yet
    kept = "kept"  # would be down, but it is the last backend up for a model it serves
    down = "down"  # mark it down


@dataclass(slots=True)
class ProbeHealth:
    """The probe record of one backend (kept on its `BackendState`)."""

    failures: int = 0  # failed probes in a row, traffic-free
    alive: bool = False  # seen alive since the gateway started or it was last marked down
    seen: int = 0  # `BackendState.answered` at the last verdict

    def passed(self, answered: int) -> Verdict:
        """`/health` answered 200 (`answered`: the backend's traffic counter now)."""
        self.failures = 0
        self.alive = True
        self.seen = answered
        return Verdict.up

    def failed(
        self, answered: int, *, refused: bool, failures_to_down: int, last_up: bool
    ) -> Verdict:
        """`/health` failed. `refused`: the backend said no (connection refused, an HTTP
        status other than 200) rather than not answering in time; `last_up`: no other
        private backend is up for some model this one serves."""
        if answered != self.seen:  # it answered traffic since the previous probe
            return self.passed(answered)
        self.failures += 1
        if refused and not self.alive:
            return Verdict.down
        if self.failures < failures_to_down:
            return Verdict.suspect
        if last_up:
            return Verdict.kept
        self.alive = False
        return Verdict.down
