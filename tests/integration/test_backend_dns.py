"""A private backend whose host name's lookup hangs holds no thread of the event loop's
(gateway/upstream/backend_names.py).

`loop.create_connection(name, ...)` looked the name up on the loop's own threads (uvloop:
libuv's threadpool of 4, shared with its file operations; asyncio: the default executor,
every `asyncio.to_thread`), and the connect timeout cancelled the wait, not the thread: each
attempt at a backend whose DNS server swallows queries took one more, until every other
backend's lookup and the loop's other work queued behind them.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import uvloop

from gateway.upstream import backend_names
from gateway.upstream.http import HttpPool, UpstreamError
from tests.helpers.scripted_upstream import read_request

_HANGS = "hang-dns.backend.invalid"
_ANSWERS = "fine-dns.backend.invalid"

Runner = Callable[[Coroutine[Any, Any, None]], None]
_LOOPS: dict[str, Runner] = {"asyncio": asyncio.run, "uvloop": uvloop.run}


class _Resolver:
    """`socket.getaddrinfo` where `_HANGS` hangs until the test ends (`entered` counts its
    lookups) and `_ANSWERS` is loopback."""

    def __init__(self) -> None:
        self.real = socket.getaddrinfo
        self.release = threading.Event()
        self.entered: list[str] = []

    def __call__(self, host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host == _HANGS:
            self.entered.append(host)
            self.release.wait(30)
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        if host == _ANSWERS:
            return self.real("127.0.0.1", port, *args, **kwargs)
        return self.real(host, port, *args, **kwargs)


@pytest.fixture
def resolver(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Resolver]:
    resolver = _Resolver()
    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    try:
        yield resolver
    finally:
        resolver.release.set()


def _pool(host: str, port: int, connect_timeout: float) -> HttpPool:
    return HttpPool(
        host,
        port,
        connect_timeout=connect_timeout,
        first_byte_timeout=10.0,
        read_timeout=10.0,
        max_connections=4,
    )


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
    await writer.drain()
    writer.close()


@pytest.mark.parametrize("loop", sorted(_LOOPS))
def test_a_hanging_backend_name_holds_no_loop_thread(resolver: _Resolver, loop: str) -> None:
    async def main() -> None:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(2))
        server = await asyncio.start_server(_answer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        hangs = _pool(_HANGS, 9, connect_timeout=0.1)
        fine = _pool(_ANSWERS, port, connect_timeout=10.0)
        try:
            for _ in range(6):  # more attempts than the loop's threads, each timing out
                with pytest.raises(UpstreamError) as caught:
                    await hangs.request(b"POST", b"/", [], b"{}")
                assert caught.value.kind == "connect", caught.value
            assert resolver.entered == [_HANGS], "one lookup of the name at a time"
            # Another backend's name is still looked up, and the loop's threads still run.
            response = await fine.request(b"POST", b"/", [], b"{}")
            assert response.status == 200
            assert await response.read() == b"{}"
            assert await asyncio.wait_for(asyncio.to_thread(lambda: 7), 10.0) == 7
        finally:  # before the loop's end waits for its threads
            resolver.release.set()
            await fine.close()
            await hangs.close()
            server.close()
            await server.wait_closed()

    _LOOPS[loop](main())


def test_past_the_lookups_cap_an_attempt_is_the_gateways_exhaustion(
    resolver: _Resolver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(backend_names, "_running", threading.BoundedSemaphore(1))

    async def main() -> None:
        with pytest.raises(UpstreamError) as caught:
            await _pool(_HANGS, 9, connect_timeout=0.1).request(b"POST", b"/", [], b"{}")
        assert caught.value.kind == "connect"
        # The only lookup thread hangs on that name: another backend's attempt is refused
        # at once as the gateway's own state (no breaker verdict), not queued behind it.
        with pytest.raises(UpstreamError) as caught:
            await _pool(_ANSWERS, 9, connect_timeout=10.0).request(b"POST", b"/", [], b"{}")
        assert caught.value.kind == "exhausted", caught.value
        assert "lookups still running" in str(caught.value)
        resolver.release.set()

    uvloop.run(main())
