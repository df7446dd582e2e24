"""`owngate attest --client-ca` anchors chains as a backend's `tls.ca_file` does
(gateway/upstream/tls_anchors.py): an issuing CA named without its root admits the client
certificates it issued and none of its root's other CAs'; a root still binds the CAs
below it; a file mixing the two is refused when the sidecar starts. Handshakes run over
memory buffers (`ssl.MemoryBIO`), no socket."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import NameOID

from gateway.attest import listener_context
from gateway.cli.main import main
from tests.helpers.cert_chains import Signer, chain_cert

_ROUNDS = 20  # handshake flights: TLS 1.3 with a client certificate takes three


def _pem(*certs: Signer) -> bytes:
    return b"".join(cert.public_bytes(serialization.Encoding.PEM) for cert, _ in certs)


def _write(directory: Path, stem: str, leaf: Signer, *chain: Signer) -> tuple[Path, Path]:
    cert, key = directory / f"{stem}.pem", directory / f"{stem}-key.pem"
    cert.write_bytes(_pem(leaf, *chain))
    key.write_bytes(
        leaf[1].private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert, key


def _admitted(server: ssl.SSLContext, directory: Path, client: Signer, *chain: Signer) -> bool:
    """Whether the server side of `server` completes a handshake with a client presenting
    `client` (and `chain` after it), over memory buffers."""
    cert, key = _write(directory, "client", client, *chain)
    outbound = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    outbound.check_hostname = False
    outbound.verify_mode = ssl.CERT_NONE  # the server's side is what is judged here
    outbound.load_cert_chain(cert, key)
    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    server_in, server_out = ssl.MemoryBIO(), ssl.MemoryBIO()
    near = outbound.wrap_bio(to_client, to_server)
    far = server.wrap_bio(server_in, server_out, server_side=True)
    done = {"client": False, "server": False}
    for _ in range(_ROUNDS):
        for side, tls in (("client", near), ("server", far)):
            if done[side]:
                continue
            try:
                tls.do_handshake()
                done[side] = True
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                pass
            except ssl.SSLError:
                return False
        server_in.write(to_server.read())
        to_client.write(server_out.read())
        if done["server"]:
            return True
    raise AssertionError(f"no verdict after {_ROUNDS} flights")


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Signer]:
    root = chain_cert("org root", None, ca=True)
    gateways = chain_cert("gateways CA", root, ca=True)
    users = chain_cert("users CA", root, ca=True)
    return {"root": root, "gateways": gateways, "users": users}


def _sidecar(tmp_path: Path, pki: dict[str, Signer], ca_file: bytes) -> ssl.SSLContext:
    (tmp_path / "client-ca.pem").write_bytes(ca_file)
    cert, key = _write(tmp_path, "sidecar", chain_cert("127.0.0.1", pki["root"], ca=False))
    return listener_context(cert, key, tmp_path / "client-ca.pem")


def test_an_issuing_ca_alone_admits_the_clients_it_issued(
    tmp_path: Path, pki: dict[str, Signer]
) -> None:
    """Before: refused (`unable to get issuer certificate`), so the only working file was
    the root's, which admits the other CAs' clients too (next test)."""
    server = _sidecar(tmp_path, pki, _pem(pki["gateways"]))
    gateway = chain_cert("gateway", pki["gateways"], ca=False, client=True)
    assert _admitted(server, tmp_path, gateway)
    assert _admitted(server, tmp_path, gateway, pki["gateways"])


def test_an_issuing_ca_alone_admits_none_of_its_roots_other_cas_clients(
    tmp_path: Path, pki: dict[str, Signer]
) -> None:
    server = _sidecar(tmp_path, pki, _pem(pki["gateways"]))
    user = chain_cert("someone", pki["users"], ca=False, client=True)
    assert not _admitted(server, tmp_path, user, pki["users"])
    assert not _admitted(server, tmp_path, user, pki["users"], pki["root"])


def test_a_root_admits_every_ca_below_it_as_before(tmp_path: Path, pki: dict[str, Signer]) -> None:
    """What naming the root means, unchanged (a guard for the test above)."""
    server = _sidecar(tmp_path, pki, _pem(pki["root"]))
    user = chain_cert("someone", pki["users"], ca=False, client=True)
    assert _admitted(server, tmp_path, user, pki["users"])
    assert not _admitted(server, tmp_path, user)  # its CA neither sent nor trusted


def test_a_client_ca_mixing_a_lone_ca_with_a_root_and_its_ca_is_refused(
    tmp_path: Path, pki: dict[str, Signer], capsys: pytest.CaptureFixture[str]
) -> None:
    lone = chain_cert("other team CA", chain_cert("other root", None, ca=True), ca=True)
    mixed = _pem(pki["root"], pki["gateways"], lone)
    with pytest.raises(ValueError, match="other team CA"):
        _sidecar(tmp_path, pki, mixed)
    cert, key = tmp_path / "sidecar.pem", tmp_path / "sidecar-key.pem"
    argv = ["attest", "--listen", "127.0.0.1:0", "--backend", "http://127.0.0.1:9"]
    argv += ["--key", str(tmp_path / "absent.key"), "--log", str(tmp_path / "log")]
    argv += ["--tls-cert", str(cert), "--tls-key", str(key)]
    argv += ["--client-ca", str(tmp_path / "client-ca.pem")]
    assert main(argv) == 2
    assert "--client-ca" in capsys.readouterr().err


def test_a_ca_whose_issuer_field_spells_its_root_s_name_otherwise_is_bound_by_that_root(
    tmp_path: Path, pki: dict[str, Signer]
) -> None:
    """OpenSSL matches an issuer's name as X.509 compares names (case and runs of spaces
    aside: `ORG  Root` is `org root`), so a root and the CA below it whose issuer field
    spells the root's name in capitals build one chain, the root's limits binding it.
    The anchor check compared the names as written: it took that CA for one without its
    issuer, set `VERIFY_X509_PARTIAL_CHAIN`, and the CA became an anchor of its own: the
    clients it issued were admitted past its root's path length of 0."""
    root = chain_cert("strict root", None, ca=True, path_length=0)
    spelled = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "STRICT  Root")])
    below = chain_cert("below the root", root, ca=True, issuer_name=spelled)
    server = _sidecar(tmp_path, pki, _pem(root, below))
    client = chain_cert("someone", below, ca=False, client=True)
    assert not _admitted(server, tmp_path, client, below)
    assert not _admitted(server, tmp_path, client)
    # OpenSSL chains them so: under a root without that limit, the same spelling admits.
    root = chain_cert("open root", None, ca=True)
    spelled = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "OPEN  Root")])
    below = chain_cert("below the root", root, ca=True, issuer_name=spelled)
    server = _sidecar(tmp_path, pki, _pem(root, below))
    assert _admitted(server, tmp_path, chain_cert("someone", below, ca=False, client=True), below)
