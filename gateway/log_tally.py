"""When to log an event that recurs: at most once per interval per key, with how many
occurred since the last line (so a flood of the same event is one line a minute that
says how many, not one line each)."""

from __future__ import annotations

from collections.abc import Hashable

__all__ = ["Tally"]


class Tally:
    """At most one report per `every_s` per key, with the count held back since."""

    def __init__(self, every_s: float = 60.0) -> None:
        self._every_s = every_s
        self._said: dict[Hashable, tuple[float, int]] = {}  # key: said at, held back since

    def note(self, key: Hashable, now: float, count: int = 1) -> int:
        """`count` occurrences of `key` at `now`: how many to report now (0: stay quiet,
        they are added to the next report)."""
        said = self._said.get(key)
        if said is not None and now - said[0] < self._every_s:
            self._said[key] = (said[0], said[1] + count)
            return 0
        self._said[key] = (now, 0)
        return count + (said[1] if said is not None else 0)
