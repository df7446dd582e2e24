"""`owngate attest --client-ca CA --client-pin PIN`: of the certificates that chain to the
client CA, only one whose key is pinned gets anything through the sidecar. Without a pin
any certificate of that CA good for client authentication does (another backend host's,
when the CA issues clientAuth to every certificate, as step-ca's default template does):
tests/unit/test_attest_client_certificates.py."""

from __future__ import annotations

import ssl
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from gateway.attest import AttestSettings, AttestThread, listener_context
from gateway.provenance import write_signing_key
from tests.helpers.gateways import Sim
from tests.helpers.tls import Pki
from tests.helpers.tls_fixtures import pki  # fixtures, used by name

__all__ = ["pki"]


@pytest.fixture
def start_sidecar(
    start_sim: Callable[..., Sim], tmp_path: Path, pki: Pki
) -> Iterator[Callable[[frozenset[str]], AttestThread]]:
    """An in-process sidecar in front of a simulator, mutual TLS with the test CA as its
    client CA, pinning the client keys given."""
    started: list[AttestThread] = []
    sim = start_sim("vllm", models=("sim-model",), zero_latency=True)
    cert, key = pki.write("sidecar", pki.server())

    def start(pins: frozenset[str]) -> AttestThread:
        signing = tmp_path / f"sidecar{len(started)}.key"
        write_signing_key(signing, "sidecar")
        settings = AttestSettings(
            backend=sim.url,
            key_file=signing,
            log_dir=tmp_path / f"log{len(started)}",
            client_pins=pins,
        )
        context = listener_context(cert, key, pki.directory / "ca.pem")
        sidecar = AttestThread(settings, ssl_context=context)
        sidecar.start()
        started.append(sidecar)
        return sidecar

    yield start
    for sidecar in started:
        sidecar.stop()


def _client(pki: Pki, stem: str) -> ssl.SSLContext:
    """A client context presenting a clientAuth certificate of the test CA."""
    cert, key = pki.write(stem, pki.client(stem))
    context = ssl.create_default_context(cafile=pki.directory / "ca.pem")
    context.load_cert_chain(cert, key)
    return context


def _health(sidecar: AttestThread, client: ssl.SSLContext) -> int | None:
    """The status of GET /health through the sidecar, None when the connection is refused."""
    try:
        return httpx.get(f"{sidecar.url}/health", verify=client, timeout=30).status_code
    except httpx.TransportError:
        return None


def test_only_a_pinned_client_certificate_gets_through(
    start_sidecar: Callable[[frozenset[str]], AttestThread], pki: Pki
) -> None:
    gateway = pki.client("gateway")
    pinned = start_sidecar(frozenset({gateway.pin}))
    cert, key = pki.write("gateway", gateway)
    client = ssl.create_default_context(cafile=pki.directory / "ca.pem")
    client.load_cert_chain(cert, key)
    other = _client(pki, "other-host")  # chains to the CA, good for client auth
    assert _health(pinned, client) == 200
    assert _health(pinned, other) is None
    assert pinned.listener.refusals.totals.get("client_not_pinned") == 1
    unpinned = start_sidecar(frozenset())
    assert _health(unpinned, other) == 200  # what the pin takes away
