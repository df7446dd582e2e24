"""Issue 15, layers 1 and 2, as an attacker and a sceptical auditor read them: real TLS
(certificates made here by `gateway.pki`, a TLS front before a simulator), a real gateway.

- a certificate not yet valid, or one swapped mid-run to a key that *is* pinned but is
  certified for another name, gets no request;
- `require: [attested_facts]` keeps a tenant's requests off every backend whose facts are
  only declared: when the attested backend's certificate contradicts gateway.yaml, the
  request is refused, never sent to a declared-only private backend (failover) or to the
  hosted fallback the policy lists, also when the rule comes from a data class;
- a refusal's reason names what failed and carries nothing the client sent.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.pki import issue
from tests.helpers.gateways import (
    ADMIN_HEADERS,
    EU_ZERO,
    Gateway,
    Sim,
    admin_status,
    backend,
    hosted_backend,
    logged_gateway,
    served,
)
from tests.helpers.provenance import records, request_records
from tests.helpers.tls import Pki, TLSFront, server_context
from tests.helpers.tls_fixtures import pki, sim, start_front  # fixtures, used by name

__all__ = ["pki", "sim", "start_front"]

ORIGIN = "test.owngate/tls-acceptance/1"
SECRET = "the-client-secret-prompt-7f3a"
BODY = {"model": "m", "messages": [{"role": "user", "content": SECRET}], "max_tokens": 2}


def _chat(gateway: Gateway, **headers: str) -> httpx.Response:
    return httpx.post(
        f"{gateway.url}/v1/chat/completions",
        json=BODY,
        headers={**gateway.headers, **headers},
        timeout=30,
    )


def _breaker(gateway: Gateway, backend_id: str) -> dict[str, Any]:
    (entry,) = [b for b in admin_status(gateway.url)["backends"] if b["id"] == backend_id]
    breaker: dict[str, Any] = entry["breaker"]
    return breaker


def _single(
    start_gateway: Callable[..., Gateway], tmp_path: Path, url: str, tls: dict[str, Any]
) -> Gateway:
    gpu = backend("gpu", url, "m", kind="openai", tls=tls)
    return logged_gateway(start_gateway, tmp_path, [gpu], ORIGIN)


def test_a_certificate_not_yet_valid_gets_no_request(
    start_gateway: Callable[..., Gateway],
    start_front: Callable[[Any], TLSFront],
    sim: Sim,
    pki: Pki,
    tmp_path: Path,
) -> None:
    now = datetime.now(UTC)
    future = issue(pki.ca, "127.0.0.1", now=now, not_before=now + timedelta(hours=6), days=1)
    front = start_front(server_context(pki, future))
    gateway = _single(
        start_gateway, tmp_path, front.url, {"ca_file": str(pki.directory / "ca.pem")}
    )
    response = _chat(gateway)
    assert response.status_code == 503, response.text
    assert served(sim) == 0
    breaker = _breaker(gateway, "gpu")
    assert breaker["state"] == "open"
    assert "certificate is not yet valid" in breaker["last_error"]
    assert SECRET not in response.text


def test_a_swap_to_a_pinned_key_certified_for_another_name_gets_no_request(
    start_gateway: Callable[..., Gateway],
    start_front: Callable[[Any], TLSFront],
    sim: Sim,
    pki: Pki,
    tmp_path: Path,
) -> None:
    """Both keys are pinned; the second certificate names another host. The pin alone
    must not admit it: the name is checked on every connection, also after a swap."""
    first, elsewhere = pki.server(), pki.server("gpu-other.internal")
    front = start_front(server_context(pki, first))
    tls = {"ca_file": str(pki.directory / "ca.pem"), "pin_spki_sha256": [first.pin, elsewhere.pin]}
    gateway = _single(start_gateway, tmp_path, front.url, tls)
    answered = _chat(gateway)
    assert answered.status_code == 200
    assert served(sim) == 1
    front.swap(server_context(pki, elsewhere))
    response = _chat(gateway)
    assert response.status_code == 503, response.text
    assert served(sim) == 1
    assert "IP address mismatch" in _breaker(gateway, "gpu")["last_error"]
    # the one answer served names the first key, and no record names the other (once a
    # checkpoint covers the served request's records: read before it, none were there)
    request_records(tmp_path / "log", answered.headers["x-request-id"], "completion")
    peers = [r["backend"].get("peer") for r in records(tmp_path / "log") if r["type"] == "dispatch"]
    assert {"spki_sha256": first.pin, "attested": False} in peers
    assert all(p is None or p["spki_sha256"] != elsewhere.pin for p in peers)


_REQUIRING = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {{id: attested-only, version: "1"}}
spec:
  tenants: [acme]
  residency: {{allow: [eu]}}
  retention: {{max_days: zero}}
  fallback: {{mode: when_private_unavailable, to: [{{backend: hosted}}]}}
{rules}
"""
_TOP = "  require: [attested_facts]\n"
_DATA_CLASS = "  data_classes:\n    phi:\n      require: [attested_facts]\n"


@pytest.mark.parametrize("where", ["policy", "data_class"])
def test_require_attested_facts_never_fails_over_to_declared_facts(
    start_gateway: Callable[..., Gateway],
    start_front: Callable[[Any], TLSFront],
    start_sim: Callable[..., Sim],
    sim: Sim,
    pki: Pki,
    tmp_path: Path,
    where: str,
) -> None:
    """`att` attests eu-west-1 through its certificate; `decl` (plain HTTP) and the hosted
    fallback declare the same facts in gateway.yaml only. While `att`'s certificate agrees,
    it serves; once it is swapped for one stating another region, the requiring tenant's
    requests are refused: never `decl`, never the hosted fallback."""
    stated = pki.server(region="eu-west-1", owner="test", retention="none")
    front = start_front(server_context(pki, stated))
    declared = start_sim("vllm", models=("m",), zero_latency=True)
    hosted = start_sim("vllm", models=("m",), zero_latency=True)
    policies = tmp_path / "policies"
    policies.mkdir()
    rules = _TOP if where == "policy" else _DATA_CLASS
    (policies / "p.yaml").write_text(_REQUIRING.format(rules=rules))
    backends = [
        backend(
            "att",
            front.url,
            "m",
            kind="openai",
            tls={"ca_file": str(pki.directory / "ca.pem")},
            identity="certificate",
            **EU_ZERO,
        ),
        backend("decl", declared.url, "m", kind="openai", **EU_ZERO),
        hosted_backend("hosted", f"{hosted.url}/v1", "m"),
    ]
    gateway = logged_gateway(
        start_gateway,
        tmp_path,
        backends,
        ORIGIN,
        policy={"paths": [str(policies)]},
        environ={"HOSTED_KEY": "k"},
    )
    label = {"x-data-class": "phi"} if where == "data_class" else {}
    for _ in range(3):
        response = _chat(gateway, **label)
        assert response.status_code == 200, response.text
    assert (served(sim), served(declared), served(hosted)) == (3, 0, 0)

    front.swap(server_context(pki, pki.server(region="us-east-1", owner="test", retention="none")))
    for _ in range(3):
        response = _chat(gateway, **label)
        assert response.status_code == 503, response.text
        assert SECRET not in response.text
    assert (served(sim), served(declared), served(hosted)) == (3, 0, 0)
    reason = _breaker(gateway, "att")["last_error"]
    assert "the certificate says 'us-east-1', gateway.yaml says 'eu-west-1'" in reason
    metrics = httpx.get(f"{gateway.url}/metrics", headers=ADMIN_HEADERS, timeout=10).text
    assert 'owngate_upstream_errors_total{backend="att",kind="tls"}' in metrics
    # every record of the requiring tenant names `att` or nothing (once a checkpoint covers
    # the last request's records)
    request_records(tmp_path / "log", response.headers["x-request-id"])
    sent_to = {r["backend"]["id"] for r in records(tmp_path / "log") if r["type"] == "dispatch"}
    assert sent_to == {"att"}
