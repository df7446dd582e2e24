"""Watching an OpenAI SSE stream as it is relayed: its end, its usage, its usage chunk.

A private backend's stream is relayed byte for byte; `StreamWatch.feed` returns what to
send on. It notes whether `data: [DONE]` arrived (a stream whose body ends with the
connection, without framing, is complete only then: an EOF before it is a backend that
died) and the token usage the backend reported. When the gateway asked the backend for
usage the client did not ask for (`stream_options.include_usage`), it also holds back the
usage-only chunk (`"choices": []` and a `usage` object, as OpenAI sends it): the client
gets the stream it asked for, the gateway gets the counts. Only then are lines buffered,
and a partial line only up to `max_line` bytes (a usage chunk is a few hundred bytes:
a longer line is passed on as it comes).
"""

from __future__ import annotations

from typing import Final

import orjson

from gateway.upstream.openai_wire import usage_of

__all__ = ["StreamWatch"]

_DONE: Final = b"data: [DONE]"  # how vLLM, SGLang and llama.cpp end a stream
_LINE_DONE: Final = b"\n" + _DONE  # at the start of a line: never inside a JSON string
_WIDTH: Final = len(_LINE_DONE)
_MAX_LINE: Final = 64 * 1024


class StreamWatch:
    """One relayed stream's watcher; `strip_usage`: hold back the usage-only chunk."""

    def __init__(self, *, strip_usage: bool, max_line: int = _MAX_LINE) -> None:
        self.strip_usage = strip_usage
        self.done = False  # `data: [DONE]` arrived at the start of a line
        self.usage: dict[str, int] | None = None  # strip mode: the last counts reported
        self._max_line = max_line
        self._edge = b"\n"  # the last bytes seen, to find `[DONE]` split across reads
        self._pending = b""  # strip mode: the start of a line not yet complete
        self._passing = False  # strip mode: inside an over-long line, passed on as it comes
        self._drop_blank = False  # strip mode: the blank line ending a dropped event

    def feed(self, data: bytes) -> bytes:
        """Bytes from the backend in; the bytes to relay out (possibly fewer, or none)."""
        if not self.strip_usage or (
            # whole lines, none of them a usage chunk: nothing to hold back (the usual read)
            not self._pending
            and not self._passing
            and not self._drop_blank
            and data.endswith(b"\n")
            and data.find(b'"usage"') < 0  # not `in`: see `_see_done`
        ):
            self._see_done(data)
            return data
        if self._passing:
            end = data.find(b"\n")
            if end < 0:
                return data
            self._passing = False
            head, data = data[: end + 1], data[end + 1 :]
            return head + self._lines(data)
        return self._lines(data)

    def flush(self) -> bytes:
        """At the end of the stream: a last line that never got its newline, if any."""
        rest, self._pending = self._pending, b""
        if rest.startswith(_DONE):
            self.done = True
        return rest

    def _see_done(self, data: bytes) -> None:
        if self.done:
            return
        # `find`, not `in`, once per relayed read: a bytes `in` first tries its operand as
        # an int (a TypeError raised and cleared), about 2x the instructions.
        if data.find(_LINE_DONE) >= 0:
            self.done = True
            return
        edge = self._edge + data[:_WIDTH]  # a marker split across the previous read
        self.done = edge.find(_LINE_DONE) >= 0
        self._edge = data[-_WIDTH:] if len(data) >= _WIDTH else edge[-_WIDTH:]

    def _lines(self, data: bytes) -> bytes:
        """Hold back usage-only chunks (and the blank line ending each) from `data`.

        Only a line that contains `"usage"` is looked at: the runs of whole lines between
        such lines are passed on as they are, checked for `[DONE]` at a line start, so a
        read of many events (a fast server's stream coalesced by TCP) costs a few
        searches, not a Python step per line."""
        buffer = self._pending + data if self._pending else data
        kept: list[bytes] = []
        start = 0
        if self._drop_blank:
            start = self._skip_blank(buffer, 0)
        while True:
            hit = buffer.find(b'"usage"', start)
            if hit < 0:  # none in the rest: its whole lines go on
                end = buffer.rfind(b"\n", start) + 1
                self._pass(buffer, start, end, kept)
                start = max(start, end)
                break
            line_start = max(start, buffer.rfind(b"\n", start, hit) + 1)
            line_end = buffer.find(b"\n", hit) + 1
            if not line_end:  # that line is not complete yet: hold it
                self._pass(buffer, start, line_start, kept)
                start = line_start
                break
            self._pass(buffer, start, line_start, kept)
            line = buffer[line_start:line_end]
            start = line_end
            if line.startswith(_DONE):
                self.done = True
                kept.append(line)
            elif self._usage_only(line):
                self._drop_blank = True
                start = self._skip_blank(buffer, start)
            else:
                kept.append(line)
        rest = buffer[start:]
        if len(rest) > self._max_line:  # not a usage chunk: stop holding it back
            kept.append(rest)
            rest = b""
            self._passing = True
        self._pending = rest
        return b"".join(kept)

    def _pass(self, buffer: bytes, start: int, end: int, kept: list[bytes]) -> None:
        """Pass on the whole lines `buffer[start:end]` (`start` begins a line)."""
        if end <= start:
            return
        run = buffer[start:end]
        if not self.done and (run.startswith(_DONE) or _LINE_DONE in run):
            self.done = True
        kept.append(run)

    def _skip_blank(self, buffer: bytes, start: int) -> int:
        """After a held-back usage chunk: past the blank line that ends its event, once
        the next line is complete (whether blank or not, the wait for it ends)."""
        end = buffer.find(b"\n", start) + 1
        if not end:
            return start
        self._drop_blank = False
        return end if buffer[start:end] in (b"\n", b"\r\n") else start

    def _usage_only(self, line: bytes) -> bool:
        """Whether `line` is a usage-only chunk (its counts are kept either way)."""
        if not line.startswith(b"data:"):
            return False
        try:
            doc = orjson.loads(line[5:])
        except orjson.JSONDecodeError:
            return False
        if not isinstance(doc, dict):
            return False
        counts = usage_of(doc.get("usage"))
        if counts is None:
            return False
        self.usage = counts
        return doc.get("choices") == []
