"""Loopback ports for tests."""

from __future__ import annotations

import itertools
import os
import random
import socket
from collections.abc import Iterator
from pathlib import Path

REDIS_DEFAULT_PORT = 6379  # never handed out: a developer's own redis-server may be on it
# Ports are handed out from [WORKER_PORTS_LOW, the kernel's ephemeral range), in turn from
# a random start; under pytest-xdist each worker from a slice of its own. A port is picked,
# released, and bound again by the server a test starts a moment later (a subprocess: a
# second or more on a busy machine), and in that moment a bind(0) or connect() could take
# it from the kernel's range: another worker's, or, in one process, a server a thread of
# the same run starts. The test's readiness probe then asked that other server (CI saw an
# attest sidecar's port answer with a raw backend's 503). Below that range the kernel hands
# out nothing, and no two workers share a slice.
WORKER_PORTS_LOW = 10000
_cycles: dict[tuple[int, int], Iterator[int]] = {}


def ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (bind(0) and connect() take theirs
    from it)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def worker_slice() -> range | None:
    """This process's ports: all below the kernel's range, or this pytest-xdist worker's
    slice of them; None where the kernel's range leaves too few below it."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if worker.startswith("gw") and worker[2:].isdigit() and count.isdigit():
        index, total = int(worker[2:]), int(count)
    else:
        index, total = 0, 1
    width = (ephemeral_low() - WORKER_PORTS_LOW) // max(total, 1)
    if index >= total or width < 100:
        return None
    start = WORKER_PORTS_LOW + index * width
    return range(start, start + width)


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A loopback port nothing listens on now (bound, then released): for a server a test
    starts, or as the address of a backend that refuses connections."""
    ports = worker_slice()
    if ports is not None:
        key = (ports.start, ports.stop)
        if key not in _cycles:  # in turn from a random start: no port again soon
            offset = random.randrange(len(ports))
            _cycles[key] = itertools.cycle([*ports[offset:], *ports[:offset]])
        for port in itertools.islice(_cycles[key], len(ports)):
            if port != REDIS_DEFAULT_PORT and _bindable(port):
                return port
        raise AssertionError(f"no free port in {ports}")
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port != REDIS_DEFAULT_PORT:
            return port


def free_ports(count: int) -> list[int]:
    """`count` distinct loopback ports nothing listens on now: each is held bound until all
    are picked (two `free_port` calls may hand out the same port once released)."""
    if worker_slice() is not None:  # a worker's ports come in turn: distinct
        return [free_port() for _ in range(count)]
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
