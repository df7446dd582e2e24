"""The bodies all of a witness's connections hold at once are bounded
(`owngate witness serve --max-held-body-bytes`, gateway/provenance/witness/app.py).

A witness may face the Internet (logs post checkpoints to it) and reads whole bodies of up
to 256 KiB before it checks anything. Without a budget, anyone could hold one on every
connection its listener allows: 1,500 connections sending 250 KB of a 256 KiB body each
grew a real `owngate witness serve` from 55 MB to 441 MB (VmHWM; 4,096 connections by
default). Now a body whose declared length would pass the budget is refused 429 with
`retry-after: 1`, unread, and the budget is given back when a request ends.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from gateway.body_budget import BodyBudget
from gateway.provenance.witness import app as witness_app
from gateway.provenance.witness.app import (
    MAX_BODY,
    MAX_HELD_BODY,
    PEER_SHARE,
    create_witness_app,
    peer_of,
)
from gateway.serving import ServerThread
from tests.helpers.waiting import until
from tests.helpers.witness_rig import open_witness

BODY = 200 * 1024
HEAD = b"POST /add-checkpoint HTTP/1.1\r\nhost: w\r\ncontent-length: %d\r\n\r\n"


@pytest.fixture
def budgets(monkeypatch: pytest.MonkeyPatch) -> list[BodyBudget]:
    """The witness app's body budget, made visible: a test waits until the server has
    taken the bodies it sent before sending the next (the server's reads of several
    connections may come in any order)."""
    made: list[BodyBudget] = []

    class Seen(BodyBudget):
        __slots__ = ()

        def __init__(self) -> None:
            super().__init__()
            made.append(self)

    monkeypatch.setattr(witness_app, "BodyBudget", Seen)
    return made


def answer_of(sock: socket.socket) -> bytes:
    """The status line and headers of the answer on `sock` (bounded by its timeout)."""
    got = b""
    while b"\r\n\r\n" not in got:
        data = sock.recv(4096)
        if not data:
            break
        got += data
    return got.partition(b"\r\n\r\n")[0]


def test_bodies_past_the_budget_are_refused_unread_and_the_budget_comes_back(
    tmp_path: Path, budgets: list[BodyBudget]
) -> None:
    with open_witness(tmp_path / "witness.json") as witness:
        # one peer may hold it all here: this is the budget in all (per peer: below)
        budget = BODY + BODY // 2
        app = create_witness_app(witness, max_held_body=budget, max_held_body_per_peer=budget)
        with ServerThread(app) as server:
            holding = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            # a slow body: its declared length is held while the rest does not come
            holding.sendall(HEAD % BODY + b"o" * (BODY // 2))
            until(lambda: budgets[0].held >= BODY, "the witness holds the first body")
            second = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            second.sendall(HEAD % BODY + b"o" * 1024)
            head = answer_of(second)
            assert head.startswith(b"HTTP/1.1 429"), head
            assert b"retry-after: 1" in head.lower()
            second.close()
            # a small post fits beside the held body: the budget, not the witness, is full
            small = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            small.sendall(HEAD % 5 + b"old 0")
            assert answer_of(small).startswith(b"HTTP/1.1 400")  # malformed, but read
            small.close()
            holding.sendall(b"o" * (BODY - BODY // 2))  # the first body completes
            assert answer_of(holding).startswith(b"HTTP/1.1 400")
            holding.close()
            # given back: a body as large as the first is read again
            again = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            again.sendall(HEAD % BODY + b"o" * BODY)
            assert answer_of(again).startswith(b"HTTP/1.1 400")
            again.close()


def test_the_default_budget_holds_128_bodies_of_the_largest_size(
    tmp_path: Path, budgets: list[BodyBudget]
) -> None:
    # MAX_HELD_BODY / MAX_BODY: the 129th connection declaring a 256 KiB body is refused
    # before any of it is read, and the 128 before it are still being read. One peer may
    # hold a PEER_SHARE-th of them: PEER_SHARE peers (loopback addresses) hold them all.
    each = MAX_HELD_BODY // MAX_BODY // PEER_SHARE
    with (
        open_witness(tmp_path / "witness.json") as witness,
        ServerThread(create_witness_app(witness)) as server,
    ):
        held: list[socket.socket] = []
        try:
            for peer in range(PEER_SHARE):
                for _ in range(each):
                    sock = _connect(server.port, peer)
                    held.append(sock)
                    sock.sendall(HEAD % MAX_BODY + b"o")
            until(lambda: budgets[0].held >= MAX_HELD_BODY, "the witness holds 128 bodies")
            last = _connect(server.port, PEER_SHARE)
            held.append(last)
            last.sendall(HEAD % MAX_BODY + b"o")
            assert answer_of(last).startswith(b"HTTP/1.1 429")
            first = held[0]
            first.sendall(b"o" * (MAX_BODY - 1))  # each of the others is read whole
            assert answer_of(first).startswith(b"HTTP/1.1 400")
        finally:
            for sock in held:
                sock.close()


def test_one_flooding_peer_cannot_starve_another(tmp_path: Path, budgets: list[BodyBudget]) -> None:
    # A budget of 4 bodies: one peer opening 4 slow connections held all of it, and every
    # other log's submission got 429. Now it holds its quarter; the other is still read.
    with open_witness(tmp_path / "witness.json") as witness:
        app = create_witness_app(witness, max_held_body=PEER_SHARE * MAX_BODY)
        with ServerThread(app) as server:
            flood = [_connect(server.port, 0) for _ in range(PEER_SHARE)]
            try:
                for sock in flood:
                    sock.sendall(HEAD % MAX_BODY + b"o")
                until(lambda: budgets[0].held >= MAX_BODY, "the flooding peer holds a body")
                refused = [
                    sock for sock in flood[1:] if answer_of(sock).startswith(b"HTTP/1.1 429")
                ]
                assert len(refused) == PEER_SHARE - 1
                assert budgets[0].held == MAX_BODY
                other = _connect(server.port, 1)
                other.sendall(HEAD % MAX_BODY + b"o" * MAX_BODY)
                assert answer_of(other).startswith(b"HTTP/1.1 400")  # read whole, checked
                other.close()
            finally:
                for sock in flood:
                    sock.close()


@pytest.mark.parametrize(
    ("client", "peer"),
    [
        (("192.0.2.7", 1), "192.0.2.7"),
        (("2001:db8:1:2:3:4:5:6", 1), "2001:db8:1:2::/64"),
        (("2001:db8:1:2:ffff::9", 1), "2001:db8:1:2::/64"),  # the same host's /64
        (("::ffff:192.0.2.7", 1), "192.0.2.7"),
        (None, ""),
    ],
)
def test_a_peer_is_an_address_or_an_ipv6_64(client: tuple[str, int] | None, peer: str) -> None:
    assert peer_of({"client": client}) == peer


def test_a_peer_share_smaller_than_one_body_is_refused(tmp_path: Path) -> None:
    with (
        open_witness(tmp_path / "witness.json") as witness,
        pytest.raises(ValueError, match="must fit one body"),
    ):
        create_witness_app(witness, max_held_body_per_peer=MAX_BODY - 1)


def _connect(port: int, peer: int) -> socket.socket:
    """A connection from loopback address 127.0.0.(1 + peer): another peer per address."""
    return socket.create_connection(
        ("127.0.0.1", port), timeout=10, source_address=(f"127.0.0.{1 + peer}", 0)
    )
