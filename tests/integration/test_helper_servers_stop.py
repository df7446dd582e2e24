"""The test helpers' own asyncio servers (`TLSFront`, `RawBackend`) leave no socket open when
they stop while connections arrive: a gateway's probe, retry or pooled connection may
reach one just as its test ends.

Before, on Python 3.11, a connection the loop had accepted but not yet handed to its
protocol when the helper closed its server was lost inside a transport made after the
close (`Server._attach` fails its assertion there, and asyncio drops the error): the
garbage collector found it in a later test, whichever, and pytest failed that test on the
"unclosed transport <_SelectorSocketTransport ...>" warning (seen in whole-suite runs, in
tests/integration/test_backend_tls.py). tests/helpers/accepted.py stops listening first and
hands every accepted connection on before the close.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
import ssl
import warnings
from collections.abc import Callable

import pytest

from gateway.upstream.http import HttpPool
from tests.helpers.raw_backend import Post, RawBackend, json_answer
from tests.helpers.scripted_upstream import read_request, with_backend
from tests.helpers.tls import TLSFront
from tests.helpers.waiting import until

ROUNDS = 20
CONNECTIONS = 5


def _unclosed_after_stops(start: Callable[[], tuple[int, Callable[[], None]]]) -> list[str]:
    """The unclosed-socket warnings the garbage collector raises after `ROUNDS` helpers
    were each stopped right after `CONNECTIONS` clients connected (none sending a byte)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        for _ in range(ROUNDS):
            port, stop = start()
            clients = [
                socket.create_connection(("127.0.0.1", port), timeout=10)
                for _ in range(CONNECTIONS)
            ]
            try:
                stop()
            finally:
                for client in clients:
                    client.close()
        gc.collect()
    return [str(w.message)[:100] for w in caught if issubclass(w.category, ResourceWarning)]


def _tls_front() -> tuple[int, Callable[[], None]]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)  # no client gets as far as a handshake
    front = TLSFront(("127.0.0.1", 9), context).start()
    return front.port, front.stop


def _raw_backend() -> tuple[int, Callable[[], None]]:
    backend = RawBackend(json_answer(b"{}")).start()
    return backend.port, backend.stop


@pytest.mark.parametrize("start", [_tls_front, _raw_backend], ids=["tls_front", "raw_backend"])
def test_a_helper_stopped_as_connections_arrive_leaves_no_socket_open(
    start: Callable[[], tuple[int, Callable[[], None]]],
) -> None:
    assert _unclosed_after_stops(start) == []


def test_a_raw_backend_stopped_while_answering_logs_no_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A handler still answering when its test stops the backend: its task was cancelled
    # before `Accepted` knew the helper was closing, so the task ended cancelled, and
    # asyncio's stream server, asking it for its exception in a done callback, logged
    # "Exception in callback StreamReaderProtocol.connection_made" with a CancelledError
    # traceback (an error line in whatever test's logs, at every such stop).
    async def answering(_writer: asyncio.StreamWriter, _post: Post) -> bool:
        await asyncio.sleep(60)  # cancelled by the stop
        return False

    backend = RawBackend(answering).start()
    with socket.create_connection(("127.0.0.1", backend.port), timeout=10) as client:
        client.sendall(b"POST / HTTP/1.1\r\ncontent-length: 2\r\n\r\n{}")
        until(lambda: len(backend.posts) == 1, "the backend answering", timeout=10)
        with caplog.at_level(logging.ERROR, logger="asyncio"):
            backend.stop()
    assert backend.ended == 1  # its handler ended, its connection closed
    assert [r.getMessage()[:80] for r in caplog.records if r.name == "asyncio"] == []


def test_a_scripted_backend_stopped_while_answering_logs_no_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The same for `with_backend` (tests/helpers/scripted_upstream.py): a handler still
    # answering as the test's body returns is cancelled, and its task ended cancelled.
    answering = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, _writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        answering.set()
        await asyncio.sleep(60)  # cancelled as the body returns

    async def body(pool: HttpPool) -> None:
        _, writer = await asyncio.open_connection(pool.host, pool.port)
        writer.write(b"POST / HTTP/1.1\r\ncontent-length: 2\r\n\r\n{}")
        async with asyncio.timeout(10):
            await answering.wait()
        writer.transport.abort()

    async def run() -> None:
        await with_backend(handler, body)
        await asyncio.sleep(0)  # the done callbacks of the handlers' tasks

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        asyncio.run(run())
    assert [r.getMessage()[:80] for r in caplog.records if r.name == "asyncio"] == []
