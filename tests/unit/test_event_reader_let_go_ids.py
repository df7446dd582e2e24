"""An event the reader lets go unread (past `max_event`, cut across reads) is still
searched for `id` lines: the client's SDK keeps such an id, and while it holds one the
blank line of the gateway's receipt line dispatches an event whose `json()` raises, so
`keeps_id` must say so (the gateway then writes its empty `id` line). Before, such an id
went unseen (found by review)."""

from __future__ import annotations

import pytest

from gateway.api.sse_events import EventReader

LONG = b'data: {"choices":[{"delta":{"content":"' + b"x" * 70_000 + b'"}}]}'
EVENT = b'data: {"choices":[]}\n\n'

# (the stream, whether the SDK holds an id at its end)
STREAMS: dict[str, tuple[bytes, bool]] = {
    "id-first": (b"id: 1\n" + LONG + b"\n\n" + EVENT, True),
    "id-last": (LONG + b"\nid: 1\n\n" + EVENT, True),
    "id-crlf": (LONG + b"\r\nid: 1\r\n\r\n" + EVENT, True),
    "id-cr": (LONG + b"\rid: 1\r\r" + EVENT, True),
    "no-id": (LONG + b"\nidx: 1\n\n" + EVENT, False),
    # a later `id` line read with no value clears what the long event's set
    "cleared-later": (b"id: 1\n" + LONG + b"\n\nid:\n" + EVENT, False),
    "set-later": (LONG + b"\n\nid: 2\n" + EVENT, True),
}


@pytest.mark.parametrize("name", list(STREAMS))
@pytest.mark.parametrize("size", [4096, 1000, 7])
def test_an_id_line_in_an_event_let_go_is_seen(name: str, size: int) -> None:
    stream, holds = STREAMS[name]
    reader = EventReader()
    for at in range(0, len(stream), size):
        reader.feed(stream[at : at + size])
    reader.finish()
    assert reader.keeps_id is holds
