"""One rule for a CA bundle on both sides (gateway/tls_files.py `load_ca_bundle`): a
backend's `tls.ca_file` and the `owngate attest` sidecar's `--client-ca` load the bundle's
PEM blocks as OpenSSL's own file loader reads them, explanatory text around them (UTF-8 or
not) skipped, and refuse what it refuses.

Before, a backend's `ca_file` was refused for any byte that is not ASCII ("holds no PEM
certificate"), a bundle OpenSSL loads with its UTF-8 comments included, while the sidecar
dropped every such byte, one inside a PEM block too.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from pathlib import Path

import pytest

from gateway.attest import listener_context
from gateway.upstream.tls import backend_tls
from tests.helpers.gateways import backend, gateway_config
from tests.helpers.tls import Pki


def _openssl_file_loader(bundle: Path) -> int:
    """How many CA certificates OpenSSL's own file loader takes from `bundle`."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(cafile=bundle)
    return len(context.get_ca_certs())


def _backend(bundle: Path) -> int:
    tls = {"ca_file": bundle.name}
    settings = gateway_config([{**backend("gpu", "https://127.0.0.1:9", "m"), "tls": tls}])
    return len(backend_tls(settings.backends[0], "127.0.0.1", bundle.parent).context.get_ca_certs())


def _sidecar(bundle: Path) -> int:
    pki = Pki.create(bundle.parent / "sidecar-pki")
    cert, key = pki.write("sidecar", pki.server())
    return len(listener_context(cert, key, bundle).get_ca_certs())


@pytest.mark.parametrize("load", [_backend, _sidecar], ids=["backend_ca_file", "client_ca"])
def test_a_ca_bundle_loads_as_openssl_reads_it_on_both_sides(
    tmp_path: Path, load: Callable[[Path], int]
) -> None:
    first, second = Pki.create(tmp_path / "one", "Gateways CA"), Pki.create(tmp_path / "two")
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes(
        "# Issuer: CN=Gateways CA, O=Förderung für Prüfungen\n".encode()
        + first.ca.cert_pem
        + "\n# Zweite Stelle: Ærø (Latin-1 below)\n".encode()
        + "# Montréal\r\n".encode("latin-1")
        + second.ca.cert_pem.replace(b"\n", b"\r\n")
    )
    assert _openssl_file_loader(bundle) == 2
    assert load(bundle) == 2  # before, for a backend: "holds no PEM certificate"

    # A byte that is not ASCII inside a block: OpenSSL's file loader refuses the file, and
    # so does each side (before, the sidecar dropped the byte and loaded what was left).
    lines = first.ca.cert_pem.split(b"\n")
    lines[3] = lines[3][:8] + "é".encode() + lines[3][8:]
    bundle.write_bytes(b"\n".join(lines))
    with pytest.raises(ssl.SSLError):
        _openssl_file_loader(bundle)
    with pytest.raises((ValueError, OSError), match="holds no PEM certificate") as refused:
        load(bundle)
    assert str(bundle) in str(refused.value)
