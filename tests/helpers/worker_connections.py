"""Keep-alive connections to a chosen worker of `serve --workers N`.

The kernel spreads new connections over the workers' sockets (SO_REUSEPORT) as it likes,
so a test that must ask one worker something opens connections until each worker has
accepted enough of them, and learns which worker holds each from /proc: the server
side's socket inode (its line in /proc/net/tcp, by the client's port) among the worker's
open descriptors. A connection a worker accepted keeps working when that worker can open
no more descriptors (a test's RLIMIT_NOFILE of 0), so it can be asked then, and as long
as it likes: no answer depends on which worker the kernel picks.
"""

from __future__ import annotations

import http.client
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

__all__ = ["WorkerConnection", "connections_to_each"]

_ESTABLISHED = "01"  # TCP_ESTABLISHED in /proc/net/tcp's `st` column


class WorkerConnection:
    """One kept-alive HTTP/1.1 connection that worker `pid` accepted."""

    def __init__(self, conn: http.client.HTTPConnection, pid: int) -> None:
        self.conn = conn
        self.pid = pid
        self._sock = conn.sock  # http.client would open another (to any worker) once closed

    def ask(
        self,
        method: str,
        path: str,
        body: Mapping[str, object] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> tuple[int, dict[str, str], bytes]:
        """Send one request on this connection: status, headers (lower-case), body.
        Raises AssertionError when the worker closed it (it would not be this worker's)."""
        assert self.conn.sock is self._sock, f"worker {self.pid} closed the connection"
        data = None if body is None else json.dumps(body).encode()
        sent = {**(headers or {})}
        if data is not None:
            sent["content-type"] = "application/json"
        self.conn.request(method, path, body=data, headers=sent)
        answer = self.conn.getresponse()
        payload = answer.read()
        return answer.status, {k.lower(): v for k, v in answer.getheaders()}, payload

    def close(self) -> None:
        self.conn.close()


def connections_to_each(
    port: int, pids: Iterable[int], each: int, *, attempts: int = 400
) -> dict[int, list[WorkerConnection]]:
    """`each` connections accepted by every worker in `pids` (each has answered one
    `GET /readyz`, so its worker holds it), opened to 127.0.0.1:`port`; the others are
    closed. Raises AssertionError after `attempts` connections without that many."""
    held: dict[int, list[WorkerConnection]] = {pid: [] for pid in pids}
    for _ in range(attempts):
        if all(len(conns) >= each for conns in held.values()):
            return held
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", "/readyz")
        conn.getresponse().read()
        assert conn.sock is not None
        owner = _accepted_by(held, port, conn.sock.getsockname()[1])
        if owner is None or len(held[owner]) >= each:
            conn.close()
            continue
        held[owner].append(WorkerConnection(conn, owner))
    for conns in held.values():
        for connection in conns:
            connection.close()
    counts = {pid: len(conns) for pid, conns in held.items()}
    raise AssertionError(f"not {each} connections to each worker in {attempts}: {counts}")


def _accepted_by(pids: Iterable[int], port: int, client_port: int) -> int | None:
    """Which of `pids` holds the server side of the connection from `client_port`."""
    inode = None
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote = fields[1].rsplit(":", 1)[1], fields[2].rsplit(":", 1)[1]
        if fields[3] == _ESTABLISHED and int(local, 16) == port and int(remote, 16) == client_port:
            inode = fields[9]
            break
    if inode is None:
        return None
    wanted = f"socket:[{inode}]"
    for pid in pids:
        fds = Path(f"/proc/{pid}/fd")
        for fd in os.listdir(fds):
            try:
                if os.readlink(fds / fd) == wanted:
                    return pid
            except FileNotFoundError:  # closed meanwhile
                continue
    return None
