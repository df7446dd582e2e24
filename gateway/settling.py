"""When a watched file's change counts: once it has held still for a whole poll interval.

The config watcher (gateway/api/reload.py) and the policy set's (gateway/policy_set.py)
look at their files' stamps (mtime, size) every interval; a file caught half written may
still parse, as a weaker config or policy, so a new stamp is loaded only when the next
look finds the same one again."""

from __future__ import annotations

__all__ = ["Settling"]


class Settling:
    """The stamp seen changing at the last look, until it holds still."""

    __slots__ = ("pending",)

    def __init__(self) -> None:
        self.pending: object | None = None  # a changed stamp seen once: maybe still being written

    def settled(self, stamp: object, loaded: object) -> bool:
        """Whether `stamp`, seen now, differs from `loaded` (the stamp of what was last
        loaded) and was seen at the last look too."""
        if stamp == loaded:
            self.pending = None
            return False
        if stamp != self.pending:
            self.pending = stamp
            return False
        self.pending = None
        return True
