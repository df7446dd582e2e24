"""A log server's 429 to one of a log copy's GETs (remote.py): its readers are all taken.

owngate's admin API reads `/log/` files in threads of their own, eight at once and four
for one admin token (gateway/admin/work.py `LOG_READS`); past either a read waits its
turn in a short line, and is answered 429 with `retry-after: 1` once that line is full
or it waited 10 s: many copies running at the same time are enough. `patiently` asks
again after the seconds `retry-after` says (1 when it says none, or a date), at most
`TRIES` times in a row for one file and never past the whole copy's deadline; a wait
longer than `MAX_WAIT_S` ends the copy at once. Before, the first 429 ended a copy of a
log of thousands of files.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from email.message import Message
from typing import Final, TypeVar

__all__ = ["MAX_WAIT_S", "TRIES", "Busy", "patiently", "refused"]

TRIES: Final = 60  # GETs of one file answered 429 in a row before the copy ends
MAX_WAIT_S: Final = 60.0  # the longest `retry-after` waited for
_T = TypeVar("_T")


class Busy(OSError):
    """A 429 answer to `url`, and the seconds its `retry-after` asks to wait."""

    def __init__(self, url: str, retry_after: str | None) -> None:
        self.wait_s = _seconds(retry_after)
        super().__init__(f"GET {url}: HTTP 429 (the server is busy)")


def refused(url: str, status: int, headers: Message) -> OSError:
    """The error for an answer of `status` (no 2xx, no 404) to a GET of `url`: `Busy`
    for a 429, with the wait its `retry-after` asks for."""
    if status == 429:
        return Busy(url, headers.get("retry-after"))
    return OSError(f"GET {url}: HTTP {status}")


def patiently(
    get: Callable[[], _T],
    clock: Callable[[], float],
    end: float,
    sleep: Callable[[float], None] = time.sleep,
) -> _T:
    """`get()`, asked again after each `Busy` as its `retry-after` says: OSError once it
    was busy `TRIES` times in a row, or would wait past `MAX_WAIT_S` or `end`."""
    for tries in range(1, TRIES + 1):  # bounded: TRIES GETs at most
        try:
            return get()
        except Busy as busy:
            if busy.wait_s > MAX_WAIT_S or clock() + busy.wait_s >= end:
                wait = f"asks to wait {busy.wait_s:g} s"
                raise OSError(f"{busy}, and {wait}: past the copy's deadline") from None
            if tries == TRIES:
                raise OSError(f"{busy}, {TRIES} times in a row: the copy stops") from None
            sleep(busy.wait_s)
    raise AssertionError("unreachable")  # pragma: no cover


def _seconds(value: str | None) -> float:
    """`retry-after`'s delay in seconds (RFC 9110: digits); 1 for none or a date."""
    text = (value or "").strip()
    digits = text.isascii() and text.isdigit() and len(text) <= 9  # "²" is a digit to str
    return float(text) if digits else 1.0
