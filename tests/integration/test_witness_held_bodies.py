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
from gateway.provenance.witness.app import MAX_BODY, MAX_HELD_BODY, create_witness_app
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
        app = create_witness_app(witness, max_held_body=BODY + BODY // 2)
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
    # before any of it is read, and the 128 before it are still being read.
    with (
        open_witness(tmp_path / "witness.json") as witness,
        ServerThread(create_witness_app(witness)) as server,
    ):
        held: list[socket.socket] = []
        try:
            for _ in range(MAX_HELD_BODY // MAX_BODY):
                sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
                held.append(sock)
                sock.sendall(HEAD % MAX_BODY + b"o")
            until(lambda: budgets[0].held >= MAX_HELD_BODY, "the witness holds 128 bodies")
            last = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            held.append(last)
            last.sendall(HEAD % MAX_BODY + b"o")
            assert answer_of(last).startswith(b"HTTP/1.1 429")
            first = held[0]
            first.sendall(b"o" * (MAX_BODY - 1))  # each of the others is read whole
            assert answer_of(first).startswith(b"HTTP/1.1 400")
        finally:
            for sock in held:
                sock.close()
