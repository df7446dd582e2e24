"""`owngate status` as a client: the admin token goes to --url only, the answer is read
bounded, https is checked against --cacert in a hardened context. Loopback servers
stand for the gateway (and for where a redirect would send the token)."""

from __future__ import annotations

import http.server
import json
import ssl
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.cli.main import main
from gateway.cli.status import MAX_STATUS_BYTES, tls_context
from tests.helpers.tls import Pki, TLSFront, server_context

TOKEN = "admin-token-for-tests"
STATUS = json.dumps({"backends": [{"id": "gpu", "kind": "vllm", "health": "up"}]}).encode()

Reply = Callable[[http.server.BaseHTTPRequestHandler], tuple[int, dict[str, str], bytes]]


class Server:
    def __init__(self, reply: Reply) -> None:
        self.seen: list[dict[str, str]] = []
        seen = self.seen

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                seen.append(dict(self.headers))
                status, headers, body = reply(self)
                self.send_response(status)
                for name, value in {**headers, "content-length": str(len(body))}.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args: Any) -> None:
                """Quiet."""

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


@pytest.fixture
def serve() -> Iterator[Callable[[Reply], Server]]:
    started: list[Server] = []

    def start(reply: Reply) -> Server:
        server = Server(reply)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def status(url: str, *extra: str) -> int:
    return main(["status", "--url", url, "--token", TOKEN, "--timeout", "10", *extra])


def test_a_redirect_is_not_followed_with_the_token(
    serve: Callable[[Reply], Server], capsys: pytest.CaptureFixture[str]
) -> None:
    elsewhere = serve(lambda _h: (200, {"content-type": "application/json"}, STATUS))
    gateway = serve(lambda _h: (302, {"location": f"{elsewhere.url}/admin/status"}, b""))
    assert status(gateway.url) == 1
    assert "HTTP 302 (redirects are not followed)" in capsys.readouterr().err
    assert elsewhere.seen == []  # the token went nowhere else
    assert gateway.seen[0]["Authorization"] == f"Bearer {TOKEN}"


def test_an_answer_past_the_bound_is_refused(
    serve: Callable[[Reply], Server], capsys: pytest.CaptureFixture[str]
) -> None:
    padding = b"x" * MAX_STATUS_BYTES
    body = b'{"backends": [], "padding": "' + padding + b'"}'
    gateway = serve(lambda _h: (200, {"content-type": "application/json"}, body))
    assert status(gateway.url) == 1
    assert f"larger than {MAX_STATUS_BYTES} bytes" in capsys.readouterr().err


def test_an_error_answer_is_printed_short_and_without_control_characters(
    serve: Callable[[Reply], Server], capsys: pytest.CaptureFixture[str]
) -> None:
    body = b"\x1b]0;owned\x07\x1b[2J" + b"e" * 100_000
    gateway = serve(lambda _h: (403, {"content-type": "text/plain"}, body))
    assert status(gateway.url) == 1
    err = capsys.readouterr().err
    assert "HTTP 403" in err
    assert "\x1b" not in err and "\x07" not in err
    assert len(err) < 1000


def test_a_malformed_status_line_is_printed_escaped(
    serve: Callable[[Reply], Server], capsys: pytest.CaptureFixture[str]
) -> None:
    def forged(handler: http.server.BaseHTTPRequestHandler) -> tuple[int, dict[str, str], bytes]:
        handler.wfile.write(b"\x1b[2J\x1b]0;owned\x07ok: all backends up\r\n\r\n")
        handler.close_connection = True
        return 200, {}, b""

    gateway = serve(forged)
    assert status(gateway.url) == 1
    err = capsys.readouterr().err
    assert "cannot read" in err
    assert "\\x1b[2J\\x1b]0;owned\\x07ok: all backends up" in err
    assert [c for c in err if not c.isprintable() and c != "\n"] == []


def test_https_with_the_gateways_ca(
    serve: Callable[[Reply], Server], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gateway = serve(lambda _h: (200, {"content-type": "application/json"}, STATUS))
    pki = Pki.create(tmp_path / "pki")
    front = TLSFront(("127.0.0.1", gateway.port), server_context(pki, pki.server()))
    front.start()
    try:
        url = f"https://127.0.0.1:{front.port}"
        assert status(url, "--cacert", str(pki.directory / "ca.pem")) == 0
        assert "gpu" in capsys.readouterr().out
        assert status(url) == 1  # the system's roots do not know the test CA
        assert "CERTIFICATE_VERIFY_FAILED" in capsys.readouterr().err
    finally:
        front.stop()


def test_the_tls_context_is_hardened() -> None:
    context = tls_context(None)
    assert context.minimum_version >= ssl.TLSVersion.TLSv1_2
    assert context.options & ssl.OP_NO_RENEGOTIATION
    assert context.check_hostname and context.verify_mode == ssl.CERT_REQUIRED
