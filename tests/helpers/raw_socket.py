"""Raw-socket HTTP/1.1 for listener tests: send bytes, read everything until the server
closes, parse the answer, check an OpenAI error refusal."""

from __future__ import annotations

import json
import socket
from typing import Any, Protocol

__all__ = [
    "WAIT_S",
    "Server",
    "assert_refused",
    "connect",
    "exchange",
    "parse",
    "read_answer",
    "read_to_end",
    "request_id_of",
    "stalled_chat",
]

WAIT_S = 10.0  # the most any test waits for the server's answer or close


class Server(Protocol):
    host: str
    port: int


def stalled_chat(port: int, key: str, body: bytes) -> tuple[socket.socket, bytes]:
    """A chat request from a socket with a 4 KiB receive buffer that then reads only its
    answer's head and a little, so the gateway's later writes back up into its own write
    buffer: the open socket (the caller closes it) and what it read."""
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\n"
        b"authorization: Bearer %s\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (key.encode(), len(body), body)
    )
    sock = socket.socket()
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", port))
        sock.sendall(request)
        return sock, sock.recv(4096)
    except BaseException:
        sock.close()
        raise


def request_id_of(head: bytes) -> str:
    """The `x-request-id` of an answer whose head `head` begins with."""
    for line in head.split(b"\r\n\r\n")[0].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"x-request-id":
            return value.strip().decode()
    raise AssertionError(f"no x-request-id in {head[:200]!r}")


def connect(server: Server) -> socket.socket:
    return socket.create_connection((server.host, server.port), timeout=WAIT_S)


def read_to_end(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes (a reset counts as closed); a server
    that keeps the connection open past WAIT_S fails the test (socket timeout)."""
    data = bytearray()
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return bytes(data)
        if not chunk:
            return bytes(data)
        data += chunk


def read_answer(sock: socket.socket) -> bytes:
    """One whole answer with a `content-length` (head and body), on a connection that stays
    open; the server closing first fails the test."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(parse(head + b"\r\n\r\n")[1]["content-length"])
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, data
        body += chunk
    return head + b"\r\n\r\n" + body


def parse(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, body


def assert_refused(raw: bytes, status: int, code: str) -> dict[str, Any]:
    """One OpenAI error object with `status` and `code`, and the connection closing."""
    assert raw, "the server closed the connection without an answer"
    got, headers, body = parse(raw)
    assert got == status, raw[:300]
    assert headers["content-type"] == "application/json"
    assert headers["connection"] == "close"
    assert headers["x-request-id"].startswith("req_")
    assert int(headers["content-length"]) == len(body)  # nothing after the answer
    error: dict[str, Any] = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code
    assert error["type"] == "invalid_request_error"
    return error


def exchange(server: Server, data: bytes) -> bytes:
    with connect(server) as sock:
        sock.sendall(data)
        return read_to_end(sock)
