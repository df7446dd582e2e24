"""`AlertingContext` (gateway/attest/tls_alert.py), the sidecar's server context, driven
through memory BIOs as uvloop and asyncio drive it: a handshake that fails with an alert
for the peer first waits (`SSLWantReadError`), so the loop sends the alert; the failure is
raised at the next step. Certificates made here with `gateway.pki`."""

from __future__ import annotations

import ssl
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gateway.attest import listener_context
from gateway.pki import issue, make_ca

_STEPS = 8  # handshake round trips, far more than TLS 1.2 or 1.3 takes


def _contexts(tmp_path: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """The sidecar's context (mutual TLS, the test CA its client CA) and a client context
    that trusts it but holds no client certificate."""
    now = datetime.now(UTC)
    ca = make_ca("test CA", now=now, days=1)
    issued = issue(ca, "sidecar.test", now=now, days=1)
    cert, key, ca_file = tmp_path / "s.pem", tmp_path / "s-key.pem", tmp_path / "ca.pem"
    cert.write_bytes(issued.cert_pem)
    key.write_bytes(issued.key_pem)
    ca_file.write_bytes(ca.cert_pem)
    client = ssl.create_default_context(cafile=ca_file)
    client.check_hostname = False
    return listener_context(cert, key, ca_file), client


class _Side:
    def __init__(self, context: ssl.SSLContext, server_side: bool) -> None:
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = context.wrap_bio(self.incoming, self.outgoing, server_side=server_side)


def _step(side: _Side) -> bool:
    """One call of do_handshake: True when it is done, False when it waits."""
    try:
        side.tls.do_handshake()
    except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
        return False
    return True


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_3, ssl.TLSVersion.TLSv1_2])
def test_a_refused_client_is_sent_the_alert_then_the_handshake_fails(
    tmp_path: Path, version: ssl.TLSVersion
) -> None:
    server_context, client_context = _contexts(tmp_path)
    client_context.maximum_version = version
    server, client = _Side(server_context, True), _Side(client_context, False)
    client_done = False
    for _ in range(_STEPS):
        client_done = client_done or _step(client)
        server.incoming.write(client.outgoing.read())
        assert not _step(server)  # never done: the client holds no certificate
        client.incoming.write(server.outgoing.read())  # what the loop sends
        if getattr(server.tls, "refusal", None) is not None:
            break
    refusal = getattr(server.tls, "refusal", None)
    assert isinstance(refusal, ssl.SSLError)
    # What the loop sent the client names why it was refused.
    # TLS 1.3: the client's handshake was over, it reads the alert; TLS 1.2: the alert
    # ends its handshake.
    next_step = client.tls.read if client_done else client.tls.do_handshake
    with pytest.raises(ssl.SSLError) as read:
        next_step()
    expected = "certificate required" if version is ssl.TLSVersion.TLSv1_3 else "handshake failure"
    assert expected in str(read.value)
    # The next step (the peer's next bytes, or its leaving) raises the failure itself.
    with pytest.raises(ssl.SSLError) as failed:
        server.tls.do_handshake()
    assert failed.value is refusal
    assert not isinstance(failed.value, ssl.SSLWantReadError)


def test_a_failure_with_nothing_to_send_is_raised_at_once(tmp_path: Path) -> None:
    # Not TLS at all: OpenSSL has no alert for it, so nothing waits for the peer.
    server_context, _ = _contexts(tmp_path)
    server = _Side(server_context, True)
    server.incoming.write(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
    with pytest.raises(ssl.SSLError) as failed:
        server.tls.do_handshake()
    assert not isinstance(failed.value, ssl.SSLWantReadError)
    assert server.outgoing.pending == 0
