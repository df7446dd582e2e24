"""Backend TLS without sockets: the `tls:` and `identity:` config keys and their checks at
validation, the certificate-facts grammar, `owngate backend cert`, the dispatch record's
`peer`, and `require: [attested_facts]` in policies (issue 15, layers 1 and 2)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from gateway.cli.main import main
from gateway.config import ConfigError, parse_config
from gateway.pki import fact_uris, issue, make_ca
from gateway.policy import BackendFacts, PolicySet, parse_policies
from gateway.provenance import RecordError, dispatch_record, validate_record
from gateway.provenance.testing import EXAMPLE_BACKEND, EXAMPLE_POLICY, seeded_signer
from gateway.upstream.tls import facts_from_uris, retention_terms, spki_sha256
from gateway.validation import validate
from tests.helpers.gateways import backend, gateway_config

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _config_text(**gpu: Any) -> str:
    data = {"backends": [{**backend("gpu", "https://gpu.internal:8443", "m"), **gpu}]}
    return yaml.safe_dump(data)


@pytest.mark.parametrize(
    ("gpu", "message"),
    [
        ({"base_url": "http://gpu:80", "tls": {}}, "needs an https base_url"),
        ({"identity": "certificate"}, "identity: certificate needs tls.ca_file"),
        ({"tls": {"pin_spki_sha256": ["AAAA"]}}, "is not sha256// followed by the base64"),
        (  # base64 that no digest encodes to: it could never match
            {"tls": {"pin_spki_sha256": ["sha256//" + "A" * 42 + "B="]}},
            "is not sha256// followed by the base64",
        ),
        # other encodings of a digest: hex in either case, unpadded or URL-safe base64,
        # another prefix, blanks inside or around: refused at load, never a dead pin
        *(
            ({"tls": {"pin_spki_sha256": [pin]}}, "is not sha256// followed by the base64")
            for pin in (
                "sha256//" + "ab" * 32,
                "sha256//" + "AB" * 32,
                "ab" * 32,
                "sha256//" + "A" * 43,
                "sha256//" + "_" * 42 + "A=",
                "SHA256//" + "A" * 43 + "=",
                "sha256// " + "A" * 43 + "=",
                " sha256//" + "A" * 43 + "=",
                "sha256//" + "A" * 43 + "= ",
                "sha256//" + "A" * 43 + "=\n",
            )
        ),
        # facts no certificate can state: a backend that would never serve, found at load
        (
            {"identity": "certificate", "tls": {"ca_file": "ca.pem"}, "owner": "Acme Corp"},
            "no certificate can state owner 'Acme Corp'",
        ),
        (
            {"identity": "certificate", "tls": {"ca_file": "ca.pem"}, "region": "eu/west"},
            "no certificate can state region 'eu/west'",
        ),
        (
            {
                "identity": "certificate",
                "tls": {"ca_file": "ca.pem"},
                "retention": {"days": 1000000},
            },
            "no certificate can state retention.days 1000000",
        ),
        # an empty list written out is not "no pin" in disguise
        ({"tls": {"pin_spki_sha256": []}}, "pin_spki_sha256 is empty"),
        ({"tls": {"client_cert_file": "c.pem"}}, "client_cert_file and client_key_file go"),
        ({"tls": {"server_name": "bad name"}}, "server_name"),
        ({"tls": {"ca": "x"}}, "unknown key"),
    ],
)
def test_tls_settings_are_checked_where_they_are_written(gpu: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(_config_text(**gpu))
    assert any(
        message in str(issue) and "backends[0]" in str(issue) for issue in caught.value.issues
    )


@pytest.mark.parametrize("left_out", [("region",), ("owner",), ("region", "owner")])
def test_attested_facts_left_out_of_gateway_yaml_are_refused_naming_why(
    left_out: tuple[str, ...],
) -> None:
    # Written as issue 15 reads ("facts read from the certificate, not from gateway.yaml"),
    # the backend was refused with a bare "Field required": the error now says the
    # certificate proves the declared facts, and that they must be declared.
    gpu = {**backend("gpu", "https://gpu.internal:8443", "m")}
    gpu.update(identity="certificate", tls={"ca_file": "ca.pem"})
    for fact in left_out:
        gpu.pop(fact)
    with pytest.raises(ConfigError) as caught:
        parse_config(yaml.safe_dump({"backends": [gpu]}))
    problems = [str(issue) for issue in caught.value.issues]
    assert len(problems) == 1, problems
    assert f"identity: certificate, but {' and '.join(left_out)} not declared" in problems[0]
    assert "policies are decided on them before a connection" in problems[0]
    assert "Field required" not in problems[0]


def _problems(tmp_path: Path, tls: dict[str, Any]) -> list[str]:
    config = gateway_config([backend("gpu", "https://127.0.0.1:8443", "m", tls=tls)])
    return validate(config, environ={}, config_dir=tmp_path)


def test_validation_reads_the_tls_files_relative_to_the_config(tmp_path: Path) -> None:
    ca = make_ca("ca", now=NOW)
    client = issue(ca, "gateway", now=NOW, client=True)
    (tmp_path / "ca.pem").write_bytes(ca.cert_pem)
    (tmp_path / "c.pem").write_bytes(client.cert_pem)
    (tmp_path / "c-key.pem").write_bytes(client.key_pem)
    (tmp_path / "junk.pem").write_bytes(b"not a certificate\n")
    pair = {"client_cert_file": "c.pem", "client_key_file": "c-key.pem"}
    assert _problems(tmp_path, {"ca_file": "ca.pem", **pair}) == []
    assert _problems(tmp_path, {"ca_file": "missing.pem"}) == [
        f"backend gpu: tls.ca_file {tmp_path / 'missing.pem'}: No such file or directory"
    ]
    assert _problems(tmp_path, {"ca_file": "junk.pem"}) == [
        f"backend gpu: tls.ca_file {tmp_path / 'junk.pem'}: holds no PEM certificate"
    ]
    swapped = {"client_cert_file": "c.pem", "client_key_file": "ca.pem"}
    (problem,) = _problems(tmp_path, swapped)
    assert problem.startswith(f"backend gpu: tls.client_cert_file {tmp_path / 'c.pem'} and")


def test_a_tls_file_that_is_huge_or_not_a_file_is_refused_unread(tmp_path: Path) -> None:
    """`/dev/zero`, a FIFO or a multi-gigabyte file named by mistake (or by an admin API
    candidate config) is refused before it is read, never read whole or waited on."""
    with (tmp_path / "huge.pem").open("wb") as handle:
        handle.truncate(64 * 1024 * 1024)  # sparse: no disk used
    (tmp_path / "dir.pem").mkdir()
    assert _problems(tmp_path, {"ca_file": "huge.pem"}) == [
        f"backend gpu: tls.ca_file {tmp_path / 'huge.pem'}: larger than 4194304 bytes"
    ]
    assert _problems(tmp_path, {"ca_file": "dir.pem"}) == [
        f"backend gpu: tls.ca_file {tmp_path / 'dir.pem'}: not a regular file"
    ]


@pytest.mark.parametrize(
    ("uris", "stated"),
    [
        ([], (None, None, None)),
        (["https://example.org", "owngate:region:eu-west-1"], ("eu-west-1", None, None)),
        (
            ["owngate:region:eu-west-1", "owngate:owner:acme", "owngate:retention:none"],
            ("eu-west-1", "acme", "none"),
        ),
        (["owngate:retention:30d+training"], (None, None, "30d+training")),
        (["owngate:retention:30d+zdr"], (None, None, "30d+zdr")),
        (["owngate:retention:30d+zdr+training"], (None, None, "30d+zdr+training")),
    ],
)
def test_certificate_facts_grammar(uris: list[str], stated: tuple[str | None, ...]) -> None:
    found = facts_from_uris(uris)
    assert (found.region, found.owner, found.retention) == stated


@pytest.mark.parametrize(
    ("uris", "message"),
    [
        (["owngate:region:eu-west-1", "owngate:region:us-east-1"], "more than once"),
        (["owngate:region:"], "malformed"),
        (["owngate:region:eu west"], "malformed"),
        (["owngate:retention:30"], "malformed"),
        (["owngate:retention:030d"], "malformed"),
        # zero days with zero data retention is written `none`: one spelling per claim
        (["owngate:retention:0d+zdr"], "malformed"),
        (["owngate:retention:30d+training+zdr"], "malformed"),
        (["owngate:colour:blue"], "unknown certificate fact"),
        # `$` would let a trailing newline through: the value is the whole rest of the SAN
        (["owngate:region:eu-west-1\n"], "malformed"),
        (["owngate:retention:30d\n"], "malformed"),
        # A URI scheme is case-insensitive (RFC 3986): another reader takes this for the
        # region too, so the certificate is ambiguous, not one with a single region.
        (["owngate:region:eu-west-1", "OWNGATE:region:us-east-1"], "lowercase"),
        (["Owngate:region:us-east-1"], "lowercase"),
        # the same fact twice, even with one value: a SAN list is not a set to every reader
        (["owngate:region:eu-west-1", "owngate:region:eu-west-1"], "more than once"),
        (["owngate:REGION:us-east-1"], "unknown certificate fact"),
        # a look-alike letter (Cyrillic e), an escape, a second value: no fact reads so
        (["owngate:region:eu-w\u0435st-1"], "malformed"),
        (["owngate:region:eu%2Dwest-1"], "malformed"),
        (["owngate:region:eu-west-1:us-east-1"], "malformed"),
        (["owngate:owner:acme/other"], "malformed"),
    ],
)
def test_ambiguous_or_malformed_facts_attest_nothing(uris: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        facts_from_uris(uris)


def test_retention_terms_state_what_gateway_yaml_declares() -> None:
    assert retention_terms(0, True, False) == "none"
    assert retention_terms(0, False, False) == "0d"
    assert retention_terms(30, False, True) == "30d+training"
    # a zero-data-retention declaration with days kept is stated too, never dropped
    assert retention_terms(30, True, False) == "30d+zdr"
    assert retention_terms(30, True, True) == "30d+zdr+training"


def test_backend_cert_issues_what_the_gateway_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["backend", "cert", "ca", "--out", str(tmp_path)]) == 0
    assert capsys.readouterr().out == ""  # a CA's key is not a pin
    signer = ["backend", "cert", "issue", "--ca-cert", str(tmp_path / "ca.pem")]
    signer += ["--ca-key", str(tmp_path / "ca-key.pem")]
    argv = [*signer, "--name", "gpu-fra.internal"]
    argv += ["--region", "eu-central-1", "--owner", "acme", "--retention", "none"]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out.strip()
    cert = x509.load_pem_x509_certificate((tmp_path / "gpu-fra.internal.pem").read_bytes())
    assert printed == f"pin_spki_sha256: {spki_sha256(cert.public_bytes(Encoding.DER))}"
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["gpu-fra.internal"]
    stated = facts_from_uris(sans.get_values_for_type(x509.UniformResourceIdentifier))
    assert (stated.region, stated.owner, stated.retention) == ("eu-central-1", "acme", "none")
    assert (tmp_path / "gpu-fra.internal-key.pem").stat().st_mode & 0o777 == 0o600
    # Never overwritten; a fact outside the grammar is refused.
    assert main([*argv, "--out", str(tmp_path)]) == 1
    assert main([*argv[:-6], "--region", "eu west", "--out", str(tmp_path / "x")]) == 1
    client = ["--name", "gateway", "--client", "--out", str(tmp_path)]
    assert main([*signer, *client]) == 0
    assert main([*signer, *client[:3], "--region", "eu-west-1", "--out", str(tmp_path)]) == 2
    # zero data retention with days kept is a claim the certificate can state
    zdr = [*signer, "--name", "gpu-2.internal", "--retention", "30d+zdr", "--out"]
    assert main([*zdr, str(tmp_path)]) == 0
    cert = x509.load_pem_x509_certificate((tmp_path / "gpu-2.internal.pem").read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert facts_from_uris(sans.get_values_for_type(x509.UniformResourceIdentifier)).retention == (
        "30d+zdr"
    )


def test_backend_cert_leaves_no_new_key_beside_a_certificate_already_there(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["backend", "cert", "ca", "--out", str(tmp_path)]) == 0
    (tmp_path / "gpu.internal.pem").write_bytes(b"an older certificate\n")
    signer = ["--ca-cert", str(tmp_path / "ca.pem"), "--ca-key", str(tmp_path / "ca-key.pem")]
    argv = ["backend", "cert", "issue", *signer, "--name", "gpu.internal"]
    assert main([*argv, "--out", str(tmp_path)]) == 1
    assert "gpu.internal.pem: File exists" in capsys.readouterr().err
    assert not (tmp_path / "gpu.internal-key.pem").exists()  # a retry elsewhere is not blocked
    assert (tmp_path / "gpu.internal.pem").read_bytes() == b"an older certificate\n"


def test_backend_cert_reads_a_ca_file_bounded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["backend", "cert", "ca", "--out", str(tmp_path)]) == 0
    huge = tmp_path / "huge-key.pem"
    with huge.open("wb") as handle:
        handle.truncate(64 * 1024 * 1024)  # sparse: no disk used
    signer = ["--ca-cert", str(tmp_path / "ca.pem"), "--ca-key", str(huge)]
    argv = ["backend", "cert", "issue", *signer, "--name", "gpu.internal"]
    assert main([*argv, "--out", str(tmp_path)]) == 1
    assert f"cannot read the CA: {huge}: larger than" in capsys.readouterr().err
    (tmp_path / "junk-key.pem").write_bytes(b"not a key\n")
    signer[-1] = str(tmp_path / "junk-key.pem")
    argv = ["backend", "cert", "issue", *signer, "--name", "gpu.internal"]
    assert main([*argv, "--out", str(tmp_path)]) == 1
    assert f"{tmp_path / 'junk-key.pem'}: not a usable CA" in capsys.readouterr().err


def test_fact_uris_refuse_what_the_reader_would() -> None:
    assert fact_uris("eu-west-1", None, "30d") == [
        "owngate:region:eu-west-1",
        "owngate:retention:30d",
    ]
    with pytest.raises(ValueError, match="malformed"):
        fact_uris(None, "a:b", None)


def _dispatch(**peer: Any) -> dict[str, object]:
    return dispatch_record(
        request_id="r",
        time=NOW,
        tenant="acme",
        model="m",
        policy=EXAMPLE_POLICY,
        trace=[],
        backend=EXAMPLE_BACKEND,
        fallback_reason=None,
        request_commitment="ab" * 32,
        **peer,
    )


def test_the_dispatch_record_names_the_peer_and_old_records_stay_valid() -> None:
    pin = "sha256//" + "A" * 43 + "="
    record = _dispatch(peer_spki=pin, attested=True)
    assert record["backend"]["peer"] == {"spki_sha256": pin, "attested": True}  # type: ignore[index]
    validate_record(record)
    old = _dispatch()
    assert "peer" not in old["backend"]  # type: ignore[operator]
    validate_record(old)
    with pytest.raises(RecordError, match="peer_spki"):
        _dispatch(peer_spki="ab" * 32)
    tampered = {**record, "backend": {**record["backend"], "peer": {"spki_sha256": pin}}}  # type: ignore[dict-item]
    with pytest.raises(RecordError, match="backend"):
        validate_record(tampered)


_REQUIRING = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: p}
spec:
  tenants: [t]
  residency: {allow: ["*"]}
  retention: {max_days: any, training: true}
  fallback: {mode: never}
  require: [attested_facts]
"""


def _require_policy(attested: bool) -> PolicySet:
    gpu = BackendFacts(
        id="gpu-eu",
        tier="private",
        kind="vllm",
        provider="own",
        region="eu-west-1",
        owner="own",
        retention_days=0,
        zero_data_retention=True,
        training=False,
        models=frozenset({"m"}),
        attested=attested,
    )
    return parse_policies([("p.yaml", _REQUIRING)], (gpu,))


def test_a_rule_requiring_attested_facts_refuses_a_declared_only_backend() -> None:
    refused = _require_policy(attested=False).decide("t", "m", None)
    assert refused.eligible == ()
    (step,) = [t for t in refused.trace if t.backend == "gpu-eu"]
    assert (step.verdict, step.rule) == ("excluded", "p/require")
    assert "only declared in gateway.yaml" in step.reason
    assert _require_policy(attested=True).decide("t", "m", None).eligible == ("gpu-eu",)


def test_a_reload_rebuilds_a_backend_whose_certificate_files_changed(tmp_path: Path) -> None:
    from gateway.app import assemble

    (tmp_path / "ca.pem").write_bytes(make_ca("one", now=NOW).cert_pem)
    config = gateway_config(
        [backend("gpu", "https://127.0.0.1:8443", "m", tls={"ca_file": "ca.pem"})]
    )
    first = assemble(config, {}, config_dir=tmp_path)
    same = assemble(config, {}, config_dir=tmp_path, running=first)
    assert same.registry.backends["gpu"] is first.registry.backends["gpu"]  # pool kept
    (tmp_path / "ca.pem").write_bytes(make_ca("two", now=NOW).cert_pem)
    rotated = assemble(config, {}, config_dir=tmp_path, running=same)
    assert rotated.registry.backends["gpu"] is not first.registry.backends["gpu"]
    assert rotated.registry.backends["gpu"].tls is not None


def test_validation_without_secrets_does_not_read_tls_files(tmp_path: Path) -> None:
    tls = {"ca_file": "ca.pem", "client_cert_file": "c.pem", "client_key_file": "k.pem"}
    config = gateway_config([backend("gpu", "https://127.0.0.1:8443", "m", tls=tls)])
    assert len(validate(config, environ={}, config_dir=tmp_path)) == 1  # the CA, first
    assert validate(config, environ={}, config_dir=tmp_path, secrets=False) == []


def test_an_encrypted_client_key_is_refused_without_a_prompt(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization

    client = issue(make_ca("ca", now=NOW), "gateway", now=NOW, client=True)
    key = serialization.load_pem_private_key(client.key_pem, password=None)
    locked = key.private_bytes(
        Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret"),
    )
    (tmp_path / "c.pem").write_bytes(client.cert_pem)
    (tmp_path / "k.pem").write_bytes(locked)
    (problem,) = _problems(tmp_path, {"client_cert_file": "c.pem", "client_key_file": "k.pem"})
    assert problem.endswith("not a PEM certificate and its unencrypted key (it is encrypted)")


def test_two_attested_backends_with_one_key_are_refused() -> None:
    """A countersignature names its key, not its backend: with one key for two backends,
    a request meant for one and answered by the other (a typo, a DNS change) would pass
    the gateway's check and the audit (issue 15, layer 3)."""
    vkey = seeded_signer("gpu.test/attest").verifier().vkey
    other = seeded_signer("gpu.test/attest", 2).verifier().vkey
    two = [
        backend("gpu-a", "http://10.0.0.1:8101", "m", attest={"key": vkey}),
        backend("gpu-b", "http://10.0.0.2:8101", "m", attest={"key": " " + vkey}),
    ]
    with pytest.raises(ConfigError) as caught:
        parse_config(yaml.safe_dump({"backends": two}))
    assert any(
        "backends 'gpu-a' and 'gpu-b' have one attest.key" in str(issue)
        for issue in caught.value.issues
    )
    two[1]["attest"] = {"key": other}
    assert len(parse_config(yaml.safe_dump({"backends": two})).backends) == 2


def test_an_attested_backends_base_url_is_the_sidecars_root() -> None:
    """The sidecar relays only the paths a gateway sends (`/v1/chat/completions`,
    `/health`, ...): under a path prefix every request and probe would get its 404."""
    vkey = seeded_signer("gpu.test/attest").verifier().vkey
    prefixed = backend("gpu", "http://10.0.0.1:8101/api", "m", attest={"key": vkey})
    with pytest.raises(ConfigError) as caught:
        parse_config(yaml.safe_dump({"backends": [prefixed]}))
    assert any("the sidecar's root" in str(issue) for issue in caught.value.issues)
    root = backend("gpu", "http://10.0.0.1:8101/", "m", attest={"key": vkey})
    assert parse_config(yaml.safe_dump({"backends": [root]})).backends[0].attest is not None
