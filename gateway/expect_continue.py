"""Requests that ask for `100 Continue`: an answer before the body ends the connection.

A client that sends `Expect: 100-continue` waits for `100 Continue` before it sends the
body; given a final answer instead (an early 401, a 413 for a declared length past the
limit, a 404), it sends no body at all (RFC 9110, 10.1.1). uvicorn keeps such a
connection alive and waits for the body it declared: the client's next request is read
as that body and dropped unanswered until the body deadline closes the connection.
Behind a proxy that reuses its connections that is another client's request, and the
tail of a request longer than the declared length is parsed as a request of its own,
past whatever the proxy checked.

`close_unless_continued(cycle)` (the listener calls it for such a request, before its
task starts) makes an answer that starts before the body was asked for carry
`connection: close`; uvicorn then closes the connection after it. A body the gateway
asked for (`receive()` sent `100 Continue`) is read as usual, on a connection that stays
open.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from uvicorn._types import ASGISendEvent
    from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

__all__ = ["close_unless_continued"]


def close_unless_continued(cycle: RequestResponseCycle) -> None:
    """Give `cycle` (whose request asked for `100 Continue`) a `send` that ends the
    connection with an answer that starts before the body was asked for. Call it before
    the cycle's task runs: the task reads `cycle.send` when it starts."""
    send = cycle.send

    async def closing_send(message: ASGISendEvent) -> None:
        if cycle.waiting_for_100_continue and cycle.more_body and not cycle.response_started:
            cycle.keep_alive = False  # uvicorn adds `connection: close` and closes after it
        await send(message)

    cycle.send = closing_send  # type: ignore[method-assign]  # this one request's, as above
