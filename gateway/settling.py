"""When a watched file's change counts: once it has held still for a whole poll interval.

The config watcher (gateway/api/reload.py) and the policy set's (gateway/policy_set.py)
look at their files' stamps (mtime, size) every interval; a file caught half written may
still parse, as a weaker config or policy, so a new stamp is loaded only when the next
look finds the same one again. `written_since`: whether a file read at start may have been
caught being written (written after the reading began, as far as its stamp can tell)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

__all__ = ["Settling", "written_since"]

# How far before the reading began a write made during it may be stamped. The kernel
# stamps a write from a clock that moves once a tick (a jiffy: up to 10 ms behind
# `time.time()`), and a file system that keeps whole seconds (ext3, HFS+, many network
# shares; FAT: two) stamps it with the second it began in, or the even second before.
_TICK_SLACK_NS = 20_000_000
_WHOLE_SECOND_SLACK_NS = 2_000_000_000


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


def written_since(files: Iterable[Path], when: float) -> bool:
    """Whether one of `files` may have been modified at or after `when` (seconds): what a
    process read of it then may have been cut short by its writer. A stamp of a whole
    second may be that of a coarse file system, rounded down by up to two seconds; any
    other may be a clock tick behind (module constants): a stamp that close before `when`
    counts as written since. One not there (an optional keys file not yet written) was
    not read cut short."""
    limit = int(when * 1e9)
    for file in files:
        try:
            mtime = file.stat().st_mtime_ns
        except OSError:
            continue
        coarse = mtime % 1_000_000_000 == 0
        if mtime >= limit - (_WHOLE_SECOND_SLACK_NS if coarse else _TICK_SLACK_NS):
            return True
    return False
