"""Which connection makes room at a listener's cap (`gateway/listener_room.py`).

`Room` orders the connections that wait for a request: the peer holding the most gives
one up, its oldest. The connections here are plain strings named peer-number; the
listener's protocol instances are checked against real sockets in
tests/integration/test_listener_room.py.
"""

from __future__ import annotations

import random
from collections.abc import Hashable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.listener_room import Peer, Room, peer_key


def _room(*connections: str) -> tuple[Room, dict[str, Peer]]:
    """A room with `connections` joined in this order (each waiting); their peers by name."""
    room = Room()
    peers = {c: room.join(c.split("-")[0], c) for c in connections}
    return room, peers


def _taken(room: Room) -> list[str]:
    """What `take` gives, call after call, until no connection waits."""
    order = []
    while (connection := room.take()) is not None:
        order.append(connection)
    return order


def test_one_peer_gives_up_its_oldest_first() -> None:
    room, _ = _room("a-1", "a-2", "a-3")
    assert _taken(room) == ["a-1", "a-2", "a-3"]
    assert room.waiting_counts() == {}


def test_a_connection_being_answered_is_never_taken() -> None:
    room, peers = _room("a-1", "a-2")
    room.busy(peers["a-1"], "a-1")
    assert _taken(room) == ["a-2"]
    room.wait(peers["a-1"], "a-1")  # answered: waiting again
    assert _taken(room) == ["a-1"]


def test_waiting_again_after_an_answer_is_the_newest_wait() -> None:
    room, peers = _room("a-1", "a-2", "a-3")
    room.busy(peers["a-1"], "a-1")
    room.wait(peers["a-1"], "a-1")
    assert _taken(room) == ["a-2", "a-3", "a-1"]


def test_the_peer_holding_the_most_gives_one_up_first() -> None:
    """b's idle keep-alive is the oldest connection, but it goes only once no peer holds
    more than one: the peer holding the most gives up its oldest, and of peers holding
    as many, the one that got to that count first (c had 2 before a came down to 2)."""
    room, _ = _room("b-1", "a-1", "a-2", "a-3", "c-1", "c-2")
    assert room.waiting_counts() == {"a": 3, "b": 1, "c": 2}
    assert _taken(room) == ["a-1", "c-1", "a-2", "b-1", "c-2", "a-3"]


def test_a_refused_connection_goes_first_among_its_peers() -> None:
    room, peers = _room("a-1", "a-2", "a-3")
    room.wait(peers["a-3"], "a-3", first=True)  # already waiting: moved to the front
    room.busy(peers["a-2"], "a-2")
    room.wait(peers["a-2"], "a-2", first=True)  # refused while its request was answered
    assert _taken(room) == ["a-2", "a-3", "a-1"]


def test_a_peer_is_forgotten_with_its_last_connection() -> None:
    room, peers = _room("a-1", "a-2")
    room.leave(peers["a-1"], "a-1")
    assert room.waiting_counts() == {"a": 1}
    room.busy(peers["a-2"], "a-2")
    room.leave(peers["a-2"], "a-2")
    assert room.waiting_counts() == {}
    assert room.take() is None
    assert room.join("a", "a-3") is not peers["a-2"]  # a new peer, counting from 1
    assert _taken(room) == ["a-3"]


def test_busy_and_leave_are_idempotent_for_a_connection_not_waiting() -> None:
    room, peers = _room("a-1")
    room.busy(peers["a-1"], "a-1")
    room.busy(peers["a-1"], "a-1")
    assert room.take() is None
    assert room.waiting_counts() == {}


def test_the_order_holds_across_the_index_kept_only_while_full() -> None:
    """The index of peers by count is built at the first `take` and dropped once half the
    connections it was built with have ended; changes made without it count the same."""
    room, peers = _room("a-1", "a-2", "a-3", "b-1")
    assert room.take() == "a-1"  # built with 4 connections
    for connection in ("a-1", "a-2", "a-3"):
        room.leave(peers[connection], connection)  # 1 left: dropped
    peers.update({c: room.join(c.split("-")[0], c) for c in ("c-1", "c-2", "b-2")})
    room.busy(peers["c-1"], "c-1")
    assert room.waiting_counts() == {"b": 2, "c": 1}
    assert _taken(room) == ["b-1", "c-2", "b-2"]  # built again: b held the most


@pytest.mark.parametrize(
    ("client", "key"),
    [
        pytest.param(("192.0.2.7", 5000), "192.0.2.7", id="ipv4"),
        pytest.param(("2001:db8:1:2:3:4:5:6", 5000), bytes.fromhex("20010db800010002"), id="ipv6"),
        pytest.param(("2001:db8:1:2::9", 1), bytes.fromhex("20010db800010002"), id="same-64"),
        pytest.param(("::ffff:192.0.2.7", 5000), "192.0.2.7", id="ipv4-mapped"),
        pytest.param(("not:an:address", 1), "not:an:address", id="unparsable"),
        pytest.param(None, None, id="unix-socket"),
    ],
)
def test_peers_are_addresses_and_ipv6_slash_64s(
    client: tuple[str, int] | None, key: Hashable
) -> None:
    assert peer_key(client) == key


# Against a model that scans every connection: whatever the order of joins, answers,
# refusals and ends, `take` gives the oldest waiting connection of a peer holding the
# most waiting connections, and never one being answered or gone.

_OPS = st.lists(
    st.tuples(
        st.sampled_from(["join", "join", "busy", "wait", "first", "leave", "leave", "take"]),
        st.integers(0, 99),
    ),
    max_size=400,
)


@settings(max_examples=200, deadline=None)
@given(_OPS, st.integers(0, 2**32))
def test_take_matches_a_model_that_scans_everything(ops: list[tuple[str, int]], seed: int) -> None:
    room = Room()
    rng = random.Random(seed)
    open_: dict[str, Peer] = {}  # connection -> its peer
    waiting: list[str] = []  # the model: waiting connections, in the order they began to
    serial = 0
    for op, pick in ops:
        if op == "join" or not open_:
            serial += 1
            connection = f"{rng.choice('abc')}-{serial}"
            open_[connection] = room.join(connection.split("-")[0], connection)
            waiting.append(connection)
            continue
        connection = sorted(open_)[pick % len(open_)]
        peer = open_[connection]
        if op == "busy":
            room.busy(peer, connection)
            if connection in waiting:
                waiting.remove(connection)
        elif op == "wait":
            room.wait(peer, connection)
            if connection not in waiting:
                waiting.append(connection)
        elif op == "first":
            room.wait(peer, connection, first=True)
            if connection in waiting:
                waiting.remove(connection)
            same = [i for i, c in enumerate(waiting) if c.split("-")[0] == peer.key]
            waiting.insert(same[0] if same else len(waiting), connection)
        elif op == "leave":
            room.leave(peer, connection)
            del open_[connection]
            if connection in waiting:
                waiting.remove(connection)
        else:
            taken = room.take()
            counts = {p: sum(c.split("-")[0] == p for c in waiting) for p in "abc"}
            if not waiting:
                assert taken is None
                continue
            assert taken is not None
            most = max(counts.values())
            key = taken.split("-")[0]
            assert counts[key] == most
            assert taken == next(c for c in waiting if c.split("-")[0] == key)
            waiting.remove(taken)
        expected = {p: n for p in "abc" if (n := sum(c.split("-")[0] == p for c in waiting))}
        assert room.waiting_counts() == expected


def test_a_stalled_connection_is_taken_only_when_none_waits() -> None:
    """A connection being answered to a client that reads nothing (its writes paused) is
    taken once no connection waits, the one stalled longest first; one whose client
    reads again, or that ended, is not."""
    room, peers = _room("a-1", "a-2", "a-3", "b-1")
    for connection in ("a-1", "a-2", "a-3"):
        room.busy(peers[connection], connection)
    room.stall("a-2")
    room.stall("a-1")
    room.stall("a-3")
    room.unstall("a-3")
    assert _taken(room) == ["b-1", "a-2", "a-1"]
    room.stall("a-3")
    room.leave(peers["a-3"], "a-3")
    assert room.take() is None


def test_a_connection_being_answered_to_a_reading_client_is_never_taken() -> None:
    room, peers = _room("a-1")
    room.busy(peers["a-1"], "a-1")
    assert room.take() is None
