"""`fed_sizes`: the size of every piece `CommentFilter.feed` is handed from now on (the
comment filter of gateway/sse_comments.py, which the relays and the sidecar feed), for
tests that hold a walk to pieces of at most `PIECE` bytes."""

from __future__ import annotations

import pytest

from gateway.sse_comments import CommentFilter

__all__ = ["fed_sizes"]


def fed_sizes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that grows by each piece's length as `CommentFilter.feed` is called."""
    fed: list[int] = []
    feed = CommentFilter.feed

    def counted(self: CommentFilter, data: bytes) -> bytes:
        fed.append(len(data))
        return feed(self, data)

    monkeypatch.setattr(CommentFilter, "feed", counted)
    return fed
