"""Backend connections across pools stay within their share (`gateway/upstream/sockets.py`).

Two pools share one count (`BackendSockets`): a connection one pool opens at the limit
closes the connection idle longest, whichever pool holds it; one in use is never closed.
Before, each pool kept every connection its requests gave back, whatever the others held.
"""

from __future__ import annotations

import asyncio

from gateway.upstream.http import HttpPool
from gateway.upstream.sockets import BackendSockets
from tests.helpers.scripted_upstream import read_request

OK = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"


def test_a_connection_opened_at_the_limit_closes_the_oldest_idle_one_of_any_pool() -> None:
    async def run() -> None:
        served: list[asyncio.StreamWriter] = []
        closed = asyncio.Event()

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            served.append(writer)
            try:
                while True:
                    await read_request(reader)
                    writer.write(OK)
                    await writer.drain()
            except (ConnectionError, asyncio.IncompleteReadError):
                closed.set()  # the gateway closed this one
            finally:
                writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        sockets = BackendSockets(2)
        first, second = (
            HttpPool(
                "127.0.0.1",
                port,
                connect_timeout=2.0,
                first_byte_timeout=2.0,
                read_timeout=2.0,
                max_connections=8,
                sockets=sockets,
            )
            for _ in range(2)
        )
        try:
            held = [await first.request(b"GET", b"/", [], b"") for _ in range(2)]
            for response in held:  # both given back, idle
                assert await response.read() == b"{}"
            assert (first.open_connections, sockets.open) == (2, 2)
            response = await second.request(b"GET", b"/", [], b"")
            assert await response.read() == b"{}"
            assert (first.open_connections, second.open_connections) == (1, 1)
            assert sockets.open == 2
            await asyncio.wait_for(closed.wait(), 5)
            assert len(served) == 3
            # the idle one first, then one that closes `second`'s, then one past the limit:
            # in use, none is ever closed
            busy = [await first.connect() for _ in range(3)]
            assert (first.open_connections, second.open_connections) == (3, 0)
            assert sockets.open == 3 and not any(c.closed for c in busy)
            for connection in busy:
                connection.release()
        finally:
            await first.close()
            await second.close()
            server.close()

    asyncio.run(run())
