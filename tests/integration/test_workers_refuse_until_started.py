"""docs/deploy.md: `serve --workers N` refuses connections (ECONNREFUSED) until the first
worker's app has started, where a plain `serve` queues them: the supervisor holds the
port bound but not listening (a worker's socket listens once its app started), while a
plain `serve` binds a listening socket before its app starts."""

from __future__ import annotations

import shutil
import socket

import pytest

from gateway.serving import bind_socket
from gateway.workers import Supervisor


def test_the_supervisors_port_refuses_until_a_worker_listens() -> None:
    supervisor = Supervisor(["owngate", "serve"], 1, "127.0.0.1", 0, drain_timeout_s=1.0)
    try:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", supervisor.port), timeout=5).close()
        # A worker whose app has started joins the port with a listening socket.
        worker = bind_socket("127.0.0.1", supervisor.port, reuse_port=True)
        try:
            socket.create_connection(("127.0.0.1", supervisor.port), timeout=5).close()
        finally:
            worker.close()
    finally:
        supervisor._reserved.close()
        shutil.rmtree(supervisor._runtime, ignore_errors=True)


def test_a_plain_serves_socket_queues_a_connection_before_its_app_accepts() -> None:
    sock = bind_socket("127.0.0.1", 0)  # what `owngate serve` binds before its app starts
    try:
        port = sock.getsockname()[1]
        socket.create_connection(("127.0.0.1", port), timeout=5).close()  # in the backlog
    finally:
        sock.close()
