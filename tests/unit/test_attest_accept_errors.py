"""The attest sidecar's TLS acceptor tells a lost pending connection from a full process.

Linux's accept() passes on a pending connection's network error (EPROTO, ENETDOWN,
EHOSTUNREACH, ...): that connection is gone and the next one is accepted at once. Only a
process or system out of descriptors or buffers pauses accepting (else it would spin).
Driven with a stand-in socket: no socket is opened.
"""

from __future__ import annotations

import asyncio
import errno
import os
import ssl
from types import SimpleNamespace
from typing import Any

import pytest

from gateway.attest.listener import TlsAcceptor


class _Socket:
    def __init__(self, errors: list[BaseException]) -> None:
        self.errors = errors
        self.accepts = 0
        self.fd = os.open(os.devnull, os.O_RDONLY)  # a descriptor no loop watches

    def accept(self) -> Any:
        self.accepts += 1
        raise self.errors.pop(0)

    def fileno(self) -> int:
        return self.fd

    def setblocking(self, _flag: bool) -> None:
        pass

    def close(self) -> None:
        os.close(self.fd)


def _accept(error: OSError) -> tuple[int, list[str]]:
    notes: list[str] = []
    listener = SimpleNamespace(
        limits=SimpleNamespace(max_connections=4),
        refusals=SimpleNamespace(note=lambda reason, _now: notes.append(reason)),
        handshakes=set(),
        connections=set(),
    )
    sock = _Socket([error, BlockingIOError()])

    async def scenario() -> None:
        acceptor = TlsAcceptor(listener, sock, ssl.create_default_context(), 1.0)  # type: ignore[arg-type]
        acceptor._accept()
        acceptor.close()

    asyncio.run(scenario())
    return sock.accepts, notes


@pytest.mark.parametrize("code", [errno.EPROTO, errno.ENETDOWN, errno.EHOSTUNREACH])
def test_a_pending_connections_network_error_does_not_pause_accepting(code: int) -> None:
    assert _accept(OSError(code, "lost")) == (2, [])


@pytest.mark.parametrize("code", [errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM])
def test_running_out_of_descriptors_pauses_accepting(code: int) -> None:
    assert _accept(OSError(code, "full")) == (1, ["accept_failed"])
