"""`owngate backend cert issue` refuses what it would write wrongly: a name that is no host
name (it is also the files' name), a validity that is no period or outlives the CA, a CA
file that is not a CA's; and it signs with an organisation's RSA CA, not only its own
ECDSA ones (issue 15, layer 2)."""

from __future__ import annotations

import ssl
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.x509 import DNSName
from cryptography.x509.oid import NameOID
from cryptography.x509.verification import PolicyBuilder, Store

from gateway.cli.main import main
from gateway.pki import Issued


@pytest.fixture
def signer(tmp_path: Path) -> list[str]:
    """`backend cert issue` with a fresh CA of `owngate backend cert ca` (3650 days)."""
    assert main(["backend", "cert", "ca", "--out", str(tmp_path / "pki")]) == 0
    ca, key = str(tmp_path / "pki" / "ca.pem"), str(tmp_path / "pki" / "ca-key.pem")
    return ["backend", "cert", "issue", "--ca-cert", ca, "--ca-key", key]


def _usage_error(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2


@pytest.mark.parametrize(
    "name",
    ["../escaped", "a/b", "gpu..internal", "bad name", "gpu\x1b[31m", "-gpu", "", "gpu."],
)
def test_a_name_that_is_no_host_name_is_refused_and_nothing_written(
    signer: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    out = tmp_path / "out" / "deeper"
    _usage_error([*signer, f"--name={name}", "--out", str(out)])
    assert "is not a host name" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "name", ["fe80::1%eth0", "fe80::1%a b", "fe80::1%\n", "fe80::1%\x1b[31m", "fe80::1%$(id)"]
)
def test_an_address_with_a_scope_is_refused_and_nothing_written(
    signer: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    # `ipaddress` takes any text after `%` as an IPv6 zone: it went into the files' names
    # (spaces, newlines, escapes, shell syntax) and the subject CN, while the IP SAN the
    # certificate states has no zone at all (a zone names a link of one host, no peer's).
    out = tmp_path / "out" / "deeper"
    _usage_error([*signer, f"--name={name}", "--out", str(out)])
    assert "is not a host name" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["gpu-fra.internal", "10.0.0.7", "::1", "gateway"])
def test_host_names_and_addresses_are_names(signer: list[str], tmp_path: Path, name: str) -> None:
    assert main([*signer, "--name", name, "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / f"{name}.pem").is_file()


@pytest.mark.parametrize("days", ["nan", "inf", "-5", "0", "1e9", "ninety"])
def test_a_validity_that_is_no_period_is_a_usage_error(
    signer: list[str], tmp_path: Path, days: str
) -> None:
    _usage_error([*signer, "--name", "gpu.internal", "--days", days, "--out", str(tmp_path)])
    _usage_error(["backend", "cert", "ca", "--days", days, "--out", str(tmp_path / "ca")])
    assert not (tmp_path / "gpu.internal.pem").exists()


def test_a_certificate_that_would_outlive_its_ca_is_refused(
    signer: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [*signer, "--name", "gpu.internal", "--out", str(tmp_path)]
    assert main([*argv, "--days", "4000"]) == 1
    assert "the CA expires" in capsys.readouterr().err
    assert not (tmp_path / "gpu.internal.pem").exists()
    assert main([*argv, "--days", "3000"]) == 0


def test_a_leaf_certificate_is_not_taken_for_a_ca(
    signer: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*signer, "--name", "gpu.internal", "--out", str(tmp_path)]) == 0
    leaf = ["--ca-cert", str(tmp_path / "gpu.internal.pem")]
    leaf += ["--ca-key", str(tmp_path / "gpu.internal-key.pem")]
    argv = ["backend", "cert", "issue", *leaf, "--name", "other.internal"]
    assert main([*argv, "--out", str(tmp_path)]) == 1
    assert "not a CA's" in capsys.readouterr().err
    assert not (tmp_path / "other.internal.pem").exists()


def test_an_organisations_rsa_ca_signs_what_chains_to_it(tmp_path: Path) -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "acme RSA CA")])
    now = datetime.now(UTC)
    ca = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(key, hashes.SHA256())
    )
    (tmp_path / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "ca-key.pem").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    signer = ["--ca-cert", str(tmp_path / "ca.pem"), "--ca-key", str(tmp_path / "ca-key.pem")]
    argv = ["backend", "cert", "issue", *signer, "--name", "gpu.internal"]
    assert main([*argv, "--region", "eu-west-1", "--out", str(tmp_path)]) == 0
    issued = x509.load_pem_x509_certificate((tmp_path / "gpu.internal.pem").read_bytes())
    assert issued.issuer == name
    assert isinstance(issued.signature_hash_algorithm, hashes.SHA256)
    key.public_key().verify(
        issued.signature, issued.tbs_certificate_bytes, padding.PKCS1v15(), hashes.SHA256()
    )


def _ca(name: str, now: datetime, issuer: Issued | None = None) -> Issued:
    """An organisation's CA: its root (`issuer` None, no path length limit) or an issuing
    CA under it (what step-ca issues from)."""
    key = ec.generate_private_key(ec.SECP256R1())
    signer = key if issuer is None else serialization.load_pem_private_key(issuer.key_pem, None)
    assert isinstance(signer, ec.EllipticCurvePrivateKey)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject if issuer is None else issuer.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=365))
        .add_extension(
            x509.BasicConstraints(ca=True, path_length=None if issuer is None else 0), True
        )
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), True
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
    )
    if issuer is not None:
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(signer.public_key()), False
        )
    return Issued(
        builder.sign(signer, hashes.SHA256()).public_bytes(serialization.Encoding.PEM),
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext, name: str) -> None:
    """A TLS handshake in memory, with the OpenSSL the gateway's connections use."""
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    tls_client = client.wrap_bio(c_in, c_out, server_hostname=name)
    tls_server = server.wrap_bio(s_in, s_out, server_side=True)
    done = {"client": False, "server": False}
    for _ in range(10):
        for side, tls in (("client", tls_client), ("server", tls_server)):
            if not done[side]:
                try:
                    tls.do_handshake()
                    done[side] = True
                except ssl.SSLWantReadError:
                    pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if all(done.values()):
            return
    raise AssertionError("the handshake did not finish")


def test_a_certificate_of_an_issuing_ca_carries_its_chain_to_the_root(tmp_path: Path) -> None:
    """Signed by an organisation's issuing CA (not its root), the certificate file held
    the leaf alone: a server given it sent no intermediate, and a client trusting the
    root (the gateway with it as `ca_file`, `openssl s_client -CAfile root.pem`) could
    not chain it. The file now holds the leaf, then the issuing CA, as servers send it."""
    now = datetime.now(UTC)
    root = _ca("acme root", now)
    issuing = _ca("acme issuing CA", now, issuer=root)
    (tmp_path / "ca.pem").write_bytes(issuing.cert_pem)
    (tmp_path / "ca-key.pem").write_bytes(issuing.key_pem)
    signer = ["--ca-cert", str(tmp_path / "ca.pem"), "--ca-key", str(tmp_path / "ca-key.pem")]
    argv = ["backend", "cert", "issue", *signer, "--name", "gpu.internal", "--out", str(tmp_path)]
    assert main([*argv, "--region", "eu-west-1"]) == 0
    written = (tmp_path / "gpu.internal.pem").read_bytes()
    leaf, *chain = x509.load_pem_x509_certificates(written)
    assert leaf.subject.rfc4514_string() == "CN=gpu.internal"
    assert chain == [issuing.certificate]
    verifier = (
        PolicyBuilder()
        .store(Store([root.certificate]))
        .build_server_verifier(DNSName("gpu.internal"))
    )
    verifier.verify(leaf, chain)  # raises VerificationError if it does not chain

    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(tmp_path / "gpu.internal.pem", tmp_path / "gpu.internal-key.pem")
    client = ssl.create_default_context(cadata=root.cert_pem.decode())
    _handshake(server, client, "gpu.internal")


def test_a_certificate_of_a_root_ca_holds_the_leaf_alone(signer: list[str], tmp_path: Path) -> None:
    assert main([*signer, "--name", "gpu.internal", "--out", str(tmp_path)]) == 0
    assert len(x509.load_pem_x509_certificates((tmp_path / "gpu.internal.pem").read_bytes())) == 1
