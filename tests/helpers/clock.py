"""A clock the test moves: for code that takes its monotonic clock as a parameter."""

from __future__ import annotations

__all__ = ["FakeClock"]


class FakeClock:
    """Monotonic seconds that move only when a test moves them (`clock.now += 2.0`);
    pass the instance where the code under test expects a `() -> float` clock."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
