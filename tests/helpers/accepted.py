"""Stopping an asyncio stream server of a test helper without leaving a socket for the
garbage collector: `close_server` and `Accepted`.

On Python 3.11 a connection the loop has accepted but not yet handed to its protocol (its
`_accept_connection2` task still pending) when `Server.close()` runs is lost: the transport
is made with the server already closed, `Server._attach` fails its assertion in the
transport's constructor, and asyncio drops the error (no debug mode), leaving the socket
open inside a transport nobody holds. The garbage collector then finds it in whatever test
runs at that moment: "unclosed transport <_SelectorSocketTransport fd=...>", an error under
this suite's filterwarnings. A gateway's health probe, retry or pooled connection arriving
as a helper stops is enough. `close_server` stops listening first, lets the accepts already
made reach their protocol, and only then closes the server.

A connection handed to its protocol has its handler's task created, which may not have run
when the helper cancels its tasks: a task cancelled before it starts never enters its
handler, so neither the handler's `finally` nor a set the handler fills knows the
connection. `Accepted` registers each connection as it is handed over (in the protocol's
`connection_made`, before the task exists), and `Accepted.close_all` aborts them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

__all__ = ["Accepted", "close_server"]

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]

# Loop turns an accept needs to reach its protocol: its task's first step makes the
# transport (scheduling `connection_made`), the next runs it. No I/O is awaited meanwhile.
_ACCEPT_TURNS = 3


async def close_server(server: asyncio.Server) -> None:
    """Close `server` on its loop, every connection it accepted handed to its protocol
    first (none lost inside a transport made after the close)."""
    loop = asyncio.get_running_loop()
    for sock in server.sockets:
        loop.remove_reader(sock.fileno())  # no new accepts from here on
    for _ in range(_ACCEPT_TURNS):
        await asyncio.sleep(0)
    server.close()
    await server.wait_closed()


class Accepted:
    """`handler` as a `start_server` callback; `writers`: the connections handed to it and
    not yet ended by it."""

    def __init__(self, handler: Handler) -> None:
        self._handler = handler
        self._closing = False
        self.writers: set[asyncio.StreamWriter] = set()

    def __call__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> Coroutine[Any, Any, None]:
        self.writers.add(writer)  # in `connection_made`: before the handler's task exists
        return self._serve(reader, writer)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._handler(reader, writer)
        except asyncio.CancelledError:
            # Cancelled by `close_all`: the task must not end cancelled (Python 3.11's
            # stream server asks a finished handler's task for its exception in a done
            # callback, which raises for a cancelled one and is logged as an error).
            if not self._closing:
                raise
        finally:
            self.writers.discard(writer)

    async def close_all(self) -> None:
        """On the server's loop, once `close_server` closed it: abort every connection
        still registered, let handlers not started yet start (they find their connection
        gone), end every other task, and give the loop the turn in which the aborts close
        their sockets."""
        self._closing = True
        current = asyncio.current_task()
        for writer in list(self.writers):
            writer.transport.abort()
        await asyncio.sleep(0)
        pending = [task for task in asyncio.all_tasks() if task is not current]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for writer in list(self.writers):
            writer.transport.abort()
        await asyncio.sleep(0)
