"""How a request to a private backend failed: `UpstreamError` and its closed set of kinds.

Raised by the upstream HTTP/1.1 client (gateway/upstream/http.py, dial.py, connection.py,
response.py) and read by the relays and the breaker: a kind says whose doing a failure
was. `out_of_resources` and `no_socket_now` tell the gateway's own lack of descriptors
or socket memory (`exhausted`, no breaker verdict) from a backend's refusal or silence.
"""

from __future__ import annotations

import errno
import socket
from typing import Literal

__all__ = [
    "OUT_OF_RESOURCES",
    "FailureKind",
    "UpstreamError",
    "no_socket_now",
    "out_of_resources",
]

# A socket the gateway could not open (or use) for want of its own resources: not the
# backend's doing, so no breaker verdict and no failed probe (`exhausted`, private or hosted).
OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


def no_socket_now() -> bool:
    """Whether this process cannot open a socket now, for want of descriptors or socket
    memory. Asked when a connection failed for no reason of the peer's: a host name's
    lookup at the open-file limit fails with EAI_SYSTEM and whatever errno the resolver
    left (EBUSY under glibc, on uvloop and asyncio's loop alike), not EMFILE."""
    try:
        socket.socket().close()
    except OSError as exc:
        return exc.errno in OUT_OF_RESOURCES
    return False


def out_of_resources(exc: OSError) -> bool:
    """Whether `exc`, met opening a connection, was for want of the gateway's own
    descriptors or socket memory (a refusal, a reset or a timeout is the peer's answer,
    or its silence, on a socket the gateway had)."""
    if exc.errno in OUT_OF_RESOURCES:
        return True
    return not isinstance(exc, ConnectionError | TimeoutError) and no_socket_now()


# busy: this gateway already has max_connections open to the backend (not a backend fault)
# exhausted: this gateway could open no socket at all (out of file descriptors or socket
# memory: EMFILE, ENFILE, ENOBUFS, ENOMEM): its own state, not the backend's fault
# too_large: the answer passed the byte limit of `read()` (the connection was dropped)
# tls: the handshake failed, or the certificate is not one this backend may present
# encoding: the answer is in a coding the request did not accept (connection.py `_coded`)
# retired: its pool was closed (`HttpPool.close`): no connection opened, no backend fault
# shape: a 2xx answer of the other shape than the request asked for, a whole answer to a
# stream request or a stream to one that is not, a 204/205 or 3xx, a whole answer that is
# empty, not a JSON object or one that does not parse (gateway/api/passthrough.py,
# answer_reads.py)
FailureKind = Literal[
    "connect",
    "timeout",
    "closed",
    "protocol",
    "busy",
    "exhausted",
    "too_large",
    "tls",
    "encoding",
    "retired",
    "shape",
]


class UpstreamError(Exception):
    """A backend could not be reached, timed out, or broke the connection."""

    def __init__(self, kind: FailureKind, detail: str, *, sent_nothing: bool = False) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind: FailureKind = kind
        self.detail = detail
        # No response byte came on a reused connection: the server closed it while idle.
        self.sent_nothing = sent_nothing

    def again(self) -> UpstreamError:
        """The same failure as a new exception, to raise one that an object keeps (a
        response's broken connection): the kept one, raised, would hold the frames it
        passed in its traceback, and they the object, a reference cycle (the request's
        body among those frames' locals) until the cyclic collector ran."""
        return UpstreamError(self.kind, self.detail, sent_nothing=self.sent_nothing)
