"""Run-time state of a simulator that tests read and change while it serves.

`SimControl` holds the faults and load parameters; tests assign to its attributes on a
running server (`app.control.faults = Faults(error_rate=1.0)`, `app.control.slots = 1`)
and the next request or engine step sees the change. `SimStats` counts requests, and
`CapturedRequest` is one entry of the app's bounded log of received requests.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.sim.settings import Faults, SimSettings

__all__ = ["CapturedRequest", "SimControl", "SimStats"]


@dataclass(slots=True)
class SimControl:
    """Faults and load parameters, mutable at run time (plain attribute assignment).

    `started_at` is the clock time the slow-start window counts from: the app's creation,
    reset when the server starts (lifespan) and by `SimApp.start_loading`.
    """

    faults: Faults
    slots: int
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    batch_slowdown: float
    kv_capacity_tokens: int
    prefix_cache_tokens: int  # the budget; 0: no prefix caching
    zero_latency: bool
    started_at: float = 0.0

    @classmethod
    def from_settings(cls, settings: SimSettings, now: float) -> SimControl:
        return cls(
            faults=settings.faults,
            slots=settings.slots,
            prefill_tokens_per_s=settings.prefill_tokens_per_s,
            decode_tokens_per_s=settings.decode_tokens_per_s,
            batch_slowdown=settings.batch_slowdown,
            kv_capacity_tokens=settings.kv_capacity_tokens,
            prefix_cache_tokens=settings.prefix_cache_budget,
            zero_latency=settings.zero_latency,
            started_at=now,
        )

    def loading(self, now: float) -> bool:
        """Whether the server is still in its slow-start window."""
        return now - self.started_at < self.faults.slow_start_s


@dataclass(slots=True)
class SimStats:
    """Request counters of one simulator; read them from tests, never reset by the app.

    Outcome counters move just before the response's last bytes are written, so a client
    that got its answer sees them; `in_flight` drops after, so poll it.

    - `started`: inference requests accepted (past auth, parsing and slow start).
    - `completed`: responses written to the end (`[DONE]` or the full JSON body).
    - `cancelled`: requests whose client disconnected before the response was complete.
    - `errors`, `hangs`, `died`: injected faults, by kind.
    - `in_flight`: inference requests inside a handler now (waiting, running or hanging).
    """

    started: int = 0
    completed: int = 0
    cancelled: int = 0
    errors: int = 0
    hangs: int = 0
    died: int = 0
    in_flight: int = 0


@dataclass(frozen=True, slots=True)
class CapturedRequest:
    """One received HTTP request, as the simulator saw it on the wire."""

    method: str
    path: str
    query: bytes
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes

    def header(self, name: str) -> bytes | None:
        """The first value of header `name` (case-insensitive), or None."""
        wanted = name.lower().encode("latin-1")
        for key, value in self.headers:
            if key.lower() == wanted:
                return value
        return None
