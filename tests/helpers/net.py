"""Loopback ports for tests."""

from __future__ import annotations

import socket

REDIS_DEFAULT_PORT = 6379  # never handed out: a developer's own redis-server may be on it


def free_port() -> int:
    """A loopback port nothing listens on now (bound, then released): for a server a test
    starts, or as the address of a backend that refuses connections."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port != REDIS_DEFAULT_PORT:
            return port


def free_ports(count: int) -> list[int]:
    """`count` distinct loopback ports nothing listens on now: each is held bound until all
    are picked (two `free_port` calls may hand out the same port once released)."""
    socks: list[socket.socket] = []
    try:
        while len(socks) < count:
            sock = socket.socket()
            socks.append(sock)
            sock.bind(("127.0.0.1", 0))
            if sock.getsockname()[1] == REDIS_DEFAULT_PORT:
                socks.pop().close()
        return [int(sock.getsockname()[1]) for sock in socks]
    finally:
        for sock in socks:
            sock.close()
