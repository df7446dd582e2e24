"""An https witness that never ends its TLS connection: the gateway's attempt still lasts
its `timeout_s` at most, and an answer already read is kept.

The client closed gracefully whatever happened, and asyncio waits up to 30 s for the
peer's TLS close_notify: a witness that went silent made every attempt last `timeout_s`
plus 30 s; one that answered and then held the connection turned a valid cosignature
into a timeout."""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gateway.provenance.witness import client
from gateway.provenance.witness.witness import WitnessError
from gateway.tls_options import harden
from tests.helpers.tls import Pki, server_context
from tests.helpers.witness_rig import COSIGNER, NOW, RealLog, real_log

__all__ = ["real_log"]

_HOLD_S = 40.0  # longer than asyncio's TLS shutdown timeout (30 s)


class _TLSWitness:
    """One TLS connection: handshake (or not), read the request, send `answer`, then hold
    the connection without a close_notify until the test ends."""

    def __init__(self, context: ssl.SSLContext, answer: bytes | None, handshake: bool) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"https://127.0.0.1:{self._listener.getsockname()[1]}/w"
        self._context, self._answer, self._handshake = context, answer, handshake
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        self._listener.settimeout(10)
        with self._listener, self._listener.accept()[0] as conn:
            if not self._handshake:
                self._done.wait(_HOLD_S)
                return
            try:
                with self._context.wrap_socket(conn, server_side=True) as tls:
                    tls.settimeout(10)
                    tls.recv(65536)
                    if self._answer is not None:
                        tls.sendall(self._answer)
                    self._done.wait(_HOLD_S)  # no close_notify, no FIN
            except (ssl.SSLError, OSError):
                # The client gave up first (its timeout is what the silent cases await): on
                # a busy machine this thread may reach the handshake or the read only then.
                return

    def stop(self) -> None:
        self._done.set()
        self._thread.join(10)


@pytest.fixture
def tls_witness(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[bytes | None, bool], _TLSWitness]]:
    pki = Pki.create(tmp_path / "pki")
    server = server_context(pki, pki.server("127.0.0.1"))

    def trusting() -> ssl.SSLContext:
        context = harden(ssl.create_default_context())
        context.load_verify_locations(cadata=pki.ca.cert_pem.decode("ascii"))
        return context

    monkeypatch.setattr(client, "os_roots_context", trusting)
    started: list[_TLSWitness] = []

    def start(answer: bytes | None, handshake: bool = True) -> _TLSWitness:
        started.append(_TLSWitness(server, answer, handshake))
        return started[-1]

    yield start
    for witness in started:
        witness.stop()


def _ask(url: str, note: bytes, timeout: float) -> tuple[bytes | WitnessError, float]:
    async def ask() -> bytes | WitnessError:
        try:
            return await client.request_cosignature(url, 0, [], note, timeout=timeout)
        except WitnessError as error:
            return error

    started = time.monotonic()
    result = asyncio.run(ask())
    return result, time.monotonic() - started


@pytest.mark.parametrize("handshake", [True, False], ids=["silent-after-handshake", "no-handshake"])
def test_a_silent_tls_witness_costs_its_timeout_only(
    real_log: RealLog, tls_witness: Callable[[bytes | None, bool], _TLSWitness], handshake: bool
) -> None:
    witness = tls_witness(None, handshake)
    result, elapsed = _ask(witness.url, real_log.notes[1], timeout=1)
    assert isinstance(result, WitnessError) and result.reason == "timeout", result
    assert elapsed < 5, elapsed


def test_an_answer_read_is_kept_when_the_witness_holds_the_connection(
    real_log: RealLog, tls_witness: Callable[[bytes | None, bool], _TLSWitness]
) -> None:
    line = COSIGNER.cosign(real_log.notes[1].decode().split("\n\n")[0] + "\n", NOW).line()
    answer = f"HTTP/1.1 200 OK\r\ncontent-length: {len(line.encode())}\r\n\r\n{line}".encode()
    witness = tls_witness(answer, True)
    # The answer is awaited: 10 s, not 1, for a busy machine's handshake. An answer kept
    # only once the connection ends would still come to this timeout (40 s of holding).
    result, elapsed = _ask(witness.url, real_log.notes[1], timeout=10)
    assert result == line.encode()
    assert elapsed < 5, elapsed
