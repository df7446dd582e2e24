"""The demo's private backends as a careful deployment runs them (docs/provenance.md, all
three layers): each simulator behind its own `owngate attest` sidecar (in this process),
which the gateway reaches over mutual TLS with certificates from a throwaway CA made here
(layer 1: the dispatch record names the sidecar's key, which gateway.yaml pins), whose
certificate states the backend's region, owner and retention (layer 2: `identity:
certificate`), and which countersigns every answer with the backend host's own Ed25519 key
into its own log (layer 3: two-party receipts).

The CA's key is written to the demo's temporary directory and used for nothing else; the
facts in each certificate are the ones gateway/demo/gateway.yaml declares for it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from gateway.attest import AttestSettings, AttestThread, listener_context
from gateway.pki import Issued, fact_uris, issue, make_ca
from gateway.provenance import write_signing_key

__all__ = ["PRIVATE", "Sidecar", "start_sidecars"]

# The demo's private backends (their ids in gateway.yaml) and the simulator each fronts.
PRIVATE = {"gpu-vllm": "vllm", "cpu-llamacpp": "llamacpp"}
# What gateway.yaml declares for both: the certificates must say the same.
_FACTS = fact_uris("eu-west-1", "acme-ml-platform", "none")
_DOMAIN = "owngate-demo.internal"


@dataclass(frozen=True, slots=True)
class Sidecar:
    """One running sidecar: where the gateway reaches it and what an auditor needs."""

    backend: str  # the backend's id in gateway.yaml
    url: str  # https://127.0.0.1:PORT
    server_name: str  # the name its certificate is issued for (tls.server_name)
    pin: str  # tls.pin_spki_sha256 of its certificate
    vkey: str  # its countersigning key's verifier key (attest.key, --backend-key)
    log: Path  # its statement log (--attest-log)


def start_sidecars(
    stack: contextlib.ExitStack, directory: Path, sims: dict[str, str]
) -> dict[str, Sidecar]:
    """Make the PKI in `directory/pki` (ca.pem, the gateway's gateway.pem and
    gateway-key.pem) and start one mTLS sidecar per private backend in front of its
    simulator (`sims`: simulator name -> URL), each with its key and log under
    `directory/attest`; they stop when `stack` closes. Keyed by backend id."""
    now = datetime.now(UTC)
    pki, attest = directory / "pki", directory / "attest"
    pki.mkdir(mode=0o700)
    attest.mkdir(mode=0o700)
    ca = make_ca("owngate demo CA", now=now, days=1)
    ca_file = _write(pki, "ca", ca)[0]
    _write(pki, "gateway", issue(ca, "owngate-demo-gateway", now=now, days=1, client=True))
    sidecars = {}
    for backend, sim in PRIVATE.items():
        server_name = f"{backend}.{_DOMAIN}"
        issued = issue(ca, server_name, now=now, days=1, uris=_FACTS)
        cert, key = _write(pki, backend, issued)
        signing_key = attest / f"{backend}.key"
        vkey = write_signing_key(signing_key, f"{_DOMAIN}/{backend}")
        settings = AttestSettings(
            backend=sims[sim], key_file=signing_key, log_dir=attest / f"{backend}-log"
        )
        context = listener_context(cert, key, client_ca=ca_file)
        server = stack.enter_context(AttestThread(settings, ssl_context=context))
        sidecars[backend] = Sidecar(
            backend, server.url, server_name, issued.pin, vkey, settings.log_dir
        )
    return sidecars


def _write(directory: Path, stem: str, issued: Issued) -> tuple[Path, Path]:
    cert, key = directory / f"{stem}.pem", directory / f"{stem}-key.pem"
    cert.write_bytes(issued.cert_pem)
    key.touch(mode=0o600)
    key.write_bytes(issued.key_pem)
    return cert, key
