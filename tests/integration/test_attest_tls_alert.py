"""A gateway that `owngate attest --client-ca` refuses learns why, at once (issue 15).

The sidecar's TLS runs on uvloop, whose TLS protocol, like asyncio's, drops a connection
whose server-side handshake failed without sending the alert OpenSSL wrote for it. In TLS
1.3 the client's handshake is over before the server checks its certificate, so a gateway
without a client certificate (or with one of another CA, or an expired one) saw its
request's connection close unanswered: `closed: backend closed the connection before
answering`, error kind `closed`, the breaker not open. The sidecar now sends the alert
(`gateway/attest/listener.py`), so the gateway reads a `tls` fault naming it: the backend
gets no request, its breaker opens with that reason in status, metrics and logs.

A real sidecar (`AttestThread`: the listener, TLS acceptor and uvloop of `owngate
attest`) in front of a simulator, a real gateway in front of the sidecar; certificates
made here with `gateway.pki`.
"""

from __future__ import annotations

import json
import socket
import ssl
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.attest import AttestSettings, AttestThread, listener_context
from gateway.config.schema import ListenSettings
from gateway.pki import issue
from gateway.provenance import write_signing_key
from tests.helpers.gateways import ADMIN_HEADERS, Gateway, Sim, admin_status, backend, served
from tests.helpers.log_capture import rendered_logs
from tests.helpers.tls import Pki
from tests.helpers.tls_fixtures import pki, sim  # fixtures, used by name
from tests.helpers.waiting import until

__all__ = ["pki", "sim"]

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def _sidecar(sim: Sim, pki: Pki, tmp_path: Path, handshake_s: float) -> AttestThread:
    """A started sidecar in front of the simulator: mutual TLS, the test CA its client
    CA, a handshake allowed `handshake_s` (the listener's header timeout)."""
    cert, key = pki.write("sidecar", pki.server())
    signing = tmp_path / "sidecar.key"
    write_signing_key(signing, "sidecar")
    settings = AttestSettings(backend=sim.url, key_file=signing, log_dir=tmp_path / "attest")
    context = listener_context(cert, key, pki.directory / "ca.pem")
    listen = ListenSettings(header_timeout_s=handshake_s)
    return AttestThread(settings, ssl_context=context, listen=listen).start()


@pytest.fixture
def sidecar(sim: Sim, pki: Pki, tmp_path: Path) -> Iterator[AttestThread]:
    # A handshake may take a minute: a connection held until then outlasts every wait here.
    thread = _sidecar(sim, pki, tmp_path, 60.0)
    yield thread
    thread.stop()


def _gateway(
    start_gateway: Callable[..., Gateway], sidecar: AttestThread, pki: Pki, **tls: str
) -> Gateway:
    # kind openai is not probed: the only connection to the sidecar is the request's.
    gpu = backend(
        "gpu", sidecar.url, "m", kind="openai", tls={"ca_file": str(pki.directory / "ca.pem")} | tls
    )
    return start_gateway([gpu])


def _client_files(pki: Pki, stem: str, *, expired: bool = False) -> dict[str, str]:
    """The gateway's tls settings for a client certificate of `pki` (one that expired
    days ago with `expired`)."""
    now = datetime.now(UTC)
    start = now - timedelta(days=3) if expired else now
    issued = issue(pki.ca, stem, now=now, not_before=start, days=1, client=True)
    cert, key = pki.write(stem, issued)
    return {"client_cert_file": str(cert), "client_key_file": str(key)}


def _refused(gateway: Gateway, sim: Sim, sidecar: AttestThread) -> str:
    """One request is refused without reaching the simulator, and opens the breaker at
    once with a `tls` reason, shown in status, metrics and the request's log line;
    returns that reason."""
    with rendered_logs() as logs:
        response = httpx.post(
            f"{gateway.url}/v1/chat/completions", json=BODY, headers=gateway.headers, timeout=30
        )
        # The access line is written once the answer went out: the client may have read
        # the answer first, and a line written after this block is not in `logs`.
        until(lambda: '"event":"request"' in logs.getvalue(), "the request's access line")
    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == "backend_unavailable"  # the why: metrics
    assert served(sim) == 0
    (entry,) = [b for b in admin_status(gateway.url)["backends"] if b["id"] == "gpu"]
    assert entry["breaker"]["state"] == "open"  # at once: no retry mends a certificate
    assert entry["available"] is False
    metrics = httpx.get(f"{gateway.url}/metrics", headers=ADMIN_HEADERS, timeout=10).text
    assert 'owngate_upstream_errors_total{backend="gpu",kind="tls"} 1.0' in metrics
    assert 'owngate_upstream_errors_total{backend="gpu",kind="closed"}' not in metrics
    lines = [json.loads(line) for line in logs.getvalue().splitlines()]
    (logged,) = [line for line in lines if line["event"] == "request"]
    assert logged["upstream_error"] == "tls"
    (refused,) = [line for line in lines if line["event"] == "backend refused: TLS"]
    reason: str = entry["breaker"]["last_error"]
    assert (refused["backend"], "tls: " + refused["reason"]) == ("gpu", reason)
    # The gateway read the alert and left: the sidecar holds nothing of the connection
    # (not until its handshake timeout, a minute here).
    listener = sidecar.listener
    until(lambda: not listener.handshakes and not listener.connections, "the refused one gone")
    return reason


def test_a_gateway_without_a_client_certificate_reads_certificate_required(
    start_gateway: Callable[..., Gateway], sidecar: AttestThread, sim: Sim, pki: Pki
) -> None:
    gateway = _gateway(start_gateway, sidecar, pki)
    assert _refused(gateway, sim, sidecar) == "tls: tlsv13 alert certificate required"


def test_a_client_certificate_of_another_ca_reads_unknown_ca(
    start_gateway: Callable[..., Gateway],
    sidecar: AttestThread,
    sim: Sim,
    pki: Pki,
    tmp_path: Path,
) -> None:
    other = Pki.create(tmp_path / "other", "another CA")
    gateway = _gateway(start_gateway, sidecar, pki, **_client_files(other, "stranger"))
    assert _refused(gateway, sim, sidecar) == "tls: tlsv1 alert unknown ca"


def test_an_expired_client_certificate_reads_certificate_expired(
    start_gateway: Callable[..., Gateway], sidecar: AttestThread, sim: Sim, pki: Pki
) -> None:
    gateway = _gateway(start_gateway, sidecar, pki, **_client_files(pki, "old", expired=True))
    assert _refused(gateway, sim, sidecar) == "tls: sslv3 alert certificate expired"


def test_the_health_probe_marks_the_backend_down_naming_the_alert(
    start_gateway: Callable[..., Gateway], sidecar: AttestThread, sim: Sim, pki: Pki
) -> None:
    # A probed backend: the /health probe, not a request, meets the refusal first.
    scrape = {"interval_s": 0.05, "timeout_s": 5, "staleness_s": 1}
    tls = {"ca_file": str(pki.directory / "ca.pem")}
    with rendered_logs() as logs:
        gateway = start_gateway([backend("gpu", sidecar.url, "m", tls=tls)], scrape=scrape)
        until(lambda: bool(_status(gateway)["health_error"]), "the probe to mark it down")
    assert _status(gateway)["health_error"] == "/health: tls: tlsv13 alert certificate required"
    lines = [json.loads(line) for line in logs.getvalue().splitlines()]
    unhealthy = [line for line in lines if line["event"] == "backend unhealthy"]
    assert unhealthy and unhealthy[0]["reason"] == _status(gateway)["health_error"]
    metrics = httpx.get(f"{gateway.url}/metrics", headers=ADMIN_HEADERS, timeout=10).text
    assert 'owngate_backend_up{backend="gpu"} 0.0' in metrics
    assert served(sim) == 0


def test_the_gateway_s_own_certificate_gets_through(
    start_gateway: Callable[..., Gateway], sidecar: AttestThread, sim: Sim, pki: Pki
) -> None:
    # The control: the same sidecar answers the gateway holding a certificate of its CA.
    gateway = _gateway(start_gateway, sidecar, pki, **_client_files(pki, "gateway"))
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions", json=BODY, headers=gateway.headers, timeout=30
    )
    assert response.status_code == 200, response.text
    assert served(sim) == 1


def test_a_refused_client_that_stays_silent_is_dropped_at_the_handshake_timeout(
    sim: Sim, pki: Pki, tmp_path: Path
) -> None:
    # The alert goes out on its own (the client sends nothing after its handshake), and
    # the connection is no longer held than any stalled handshake.
    sidecar = _sidecar(sim, pki, tmp_path, 2.0)
    client = ssl.create_default_context(cafile=pki.directory / "ca.pem")
    client.minimum_version = ssl.TLSVersion.TLSv1_3
    try:
        with (
            socket.create_connection((sidecar.host, sidecar.port), timeout=30) as raw,
            client.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
        ):
            listener = sidecar.listener
            until(lambda: not listener.handshakes, "the handshake timeout to drop it")
            assert not listener.connections
            with pytest.raises(ssl.SSLError, match="tlsv13 alert certificate required"):
                tls.recv(1024)
    finally:
        sidecar.stop()
    assert served(sim) == 0


def _status(gateway: Gateway) -> dict[str, Any]:
    entry: dict[str, Any]
    (entry,) = [b for b in admin_status(gateway.url)["backends"] if b["id"] == "gpu"]
    return entry
