"""Authenticated private backends over real TLS (issue 15, layers 1 and 2).

A simulator sits behind `TLSFront` (tests/helpers/tls.py), a TLS-terminating relay on
loopback with certificates made in the test by `gateway.pki`. The gateway must send a
request only over a connection whose certificate chains to the backend's CA, names it,
has not expired, matches its pins and (with `identity: certificate`) states the facts
gateway.yaml declares; the dispatch record names the key of that connection.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm

from gateway.config.schema import BackendSettings
from gateway.pki import issue
from gateway.provenance import write_signing_key
from gateway.upstream.http import HttpPool, UpstreamError
from gateway.upstream.tls import backend_tls
from tests.helpers.clock import FakeClock
from tests.helpers.gateways import ADMIN_HEADERS, Gateway, Sim, admin_status, backend, served
from tests.helpers.provenance import request_records
from tests.helpers.tls import Pki, TLSFront, patched, server_context
from tests.helpers.tls_fixtures import pki, sim, start_front  # fixtures, used by name
from tests.helpers.waiting import until, until_async

__all__ = ["pki", "sim", "start_front"]

ORIGIN = "test.owngate/tls/1"
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def _gateway(
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    url: str,
    tls: dict[str, Any],
    scrape: dict[str, Any] | None = None,
    clock: Callable[[], float] = time.monotonic,
    **facts: Any,
) -> Gateway:
    tmp_path.mkdir(parents=True, exist_ok=True)
    write_signing_key(tmp_path / "log.key", ORIGIN)
    provenance = {
        "dir": str(tmp_path / "log"),
        "origin": ORIGIN,
        "signing_key_file": str(tmp_path / "log.key"),
        "checkpoint_interval_ms": 20,
    }
    # kind openai is not probed: every refusal is a request's, unless `scrape` is given.
    kind = "openai" if scrape is None else "vllm"
    gpu = backend("gpu", url, "m", kind=kind, tls=tls, **facts)
    # On the real clock, a breaker opened by a refusal stays open while the test reads
    # /admin/status and /metrics: the default first cooldown (1 s) passed between the two
    # on a loaded machine, and /metrics then said the backend was up (half open).
    breaker = {"cooldown_s": 30.0} if clock is time.monotonic else {}
    return start_gateway(
        [gpu],
        provenance=provenance,
        scrape=scrape or {},
        clock=clock,
        routing={"breaker": breaker},
    )


def _chat(gateway: Gateway) -> httpx.Response:
    return httpx.post(
        f"{gateway.url}/v1/chat/completions", json=BODY, headers=gateway.headers, timeout=10
    )


def _peer(tmp_path: Path, response: httpx.Response) -> dict[str, Any] | None:
    request_id = response.headers["x-request-id"]
    dispatch = request_records(tmp_path / "log", request_id, "dispatch")[0]
    peer: dict[str, Any] | None = dispatch["backend"].get("peer")
    return peer


def _refused(gateway: Gateway, sim: Sim, before: int) -> str:
    """A request is refused without reaching the simulator; returns the breaker's reason
    (which /admin/status shows)."""
    return _refusal(gateway, sim, before)[0]


def _refusal(gateway: Gateway, sim: Sim, before: int) -> tuple[str, str]:
    """`_refused`, and the refused request's id."""
    response = _chat(gateway)
    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == "backend_unavailable"  # the why: metrics
    assert served(sim) == before
    entry = _status(gateway)
    assert entry["breaker"]["state"] == "open"  # at once: no retry mends a certificate
    assert entry["available"] is False
    metrics = httpx.get(f"{gateway.url}/metrics", headers=ADMIN_HEADERS, timeout=10).text
    assert 'owngate_upstream_errors_total{backend="gpu",kind="tls"} 1.0' in metrics
    assert 'owngate_backend_up{backend="gpu"} 0.0' in metrics
    reason: str = entry["breaker"]["last_error"]
    assert reason.startswith("tls: ")
    return reason, response.headers["x-request-id"]


def _status(gateway: Gateway) -> dict[str, Any]:
    """The backend `gpu` in /admin/status."""
    entry: dict[str, Any]
    (entry,) = [b for b in admin_status(gateway.url)["backends"] if b["id"] == "gpu"]
    return entry


def test_the_record_names_the_key_the_backend_presented(
    start_gateway: Callable[..., Gateway],
    start_front: Callable[[Any], TLSFront],
    sim: Sim,
    pki: Pki,
    tmp_path: Path,
) -> None:
    cert = pki.server()
    front = start_front(server_context(pki, cert))
    tls = {"ca_file": str(pki.directory / "ca.pem"), "pin_spki_sha256": [cert.pin]}
    gateway = _gateway(start_gateway, tmp_path, front.url, tls)
    response = _chat(gateway)
    assert response.status_code == 200, response.text
    assert served(sim) == 1
    assert _peer(tmp_path, response) == {"spki_sha256": cert.pin, "attested": False}


def test_a_certificate_from_another_ca_gets_no_request(
    start_gateway: Callable[..., Gateway],
    start_front: Callable[[Any], TLSFront],
    sim: Sim,
    pki: Pki,
    tmp_path: Path,
) -> None:
    other = Pki.create(tmp_path / "other", "another CA")
    front = start_front(server_context(other, other.server()))
    gateway = _gateway(
        start_gateway, tmp_path, front.url, {"ca_file": str(pki.directory / "ca.pem")}
    )
    reason = _refused(gateway, sim, 0)
    assert "certificate verify failed: unable to get local issuer certificate" in reason
    assert front.handshakes == 0


def test_a_key_not_pinned_gets_no_request(
    start_gateway: Callable[..., Gateway],
    start_front: Callable[[Any], TLSFront],
    sim: Sim,
    pki: Pki,
    tmp_path: Path,
) -> None:
    presented, pinned = pki.server(), pki.server()  # same CA, same name: only the key differs
    front = start_front(server_context(pki, presented))
    tls = {"ca_file": str(pki.directory / "ca.pem"), "pin_spki_sha256": [pinned.pin]}
    gateway = _gateway(start_gateway, tmp_path, front.url, tls)
    reason, request_id = _refusal(gateway, sim, 0)
    assert reason == f"tls: certificate key {presented.pin} is not among tls.pin_spki_sha256"
    # The refused attempt is logged like any failed one; its dispatch names no peer.
    (refused,) = request_records(tmp_path / "log", request_id, "dispatch")
    assert "peer" not in refused["backend"]
    (completion,) = request_records(tmp_path / "log", request_id, "completion")
    assert (completion["status"], completion["error"]) == (503, "gpu: tls")


def test_an_expired_certificate_gets_no_request(
    start_gateway: Callable[..., Gateway],
    start_front: Callable[[Any], TLSFront],
    sim: Sim,
    pki: Pki,
    tmp_path: Path,
) -> None:
    front = start_front(server_context(pki, pki.server(expired=True)))
    gateway = _gateway(
        start_gateway, tmp_path, front.url, {"ca_file": str(pki.directory / "ca.pem")}
    )
    assert "certificate has expired" in _refused(gateway, sim, 0)


def test_a_backend_refused_for_its_certificate_serves_again_once_it_presents_a_good_one(
    start_gateway: Callable[..., Gateway],
    start_front: Callable[[Any], TLSFront],
    sim: Sim,
    pki: Pki,
    tmp_path: Path,
) -> None:
    # Expired, then renewed: the breaker keeps it out for its cooldown, then its probe
    # request closes the breaker, and the record names the renewed certificate's key.
    clock = FakeClock()
    front = start_front(server_context(pki, pki.server(expired=True)))
    tls = {"ca_file": str(pki.directory / "ca.pem")}
    gateway = _gateway(start_gateway, tmp_path, front.url, tls, clock=clock)
    assert "certificate has expired" in _refused(gateway, sim, 0)
    renewed = pki.server()
    front.swap(server_context(pki, renewed))
    assert _chat(gateway).status_code == 503  # the cooldown has not passed
    assert served(sim) == 0
    clock.now += 60.0  # past routing.breaker.max_cooldown_s
    response = _chat(gateway)
    assert response.status_code == 200, response.text
    assert served(sim) == 1
    assert _peer(tmp_path, response) == {"spki_sha256": renewed.pin, "attested": False}
    breaker = _status(gateway)["breaker"]
    assert (breaker["state"], breaker["last_error"]) == ("closed", None)


def test_a_certificate_for_another_name_gets_no_request_unless_server_name_says_so(
    start_gateway: Callable[..., Gateway],
    start_front: Callable[[Any], TLSFront],
    sim: Sim,
    pki: Pki,
    tmp_path: Path,
) -> None:
    front = start_front(server_context(pki, pki.server("gpu-fra.internal")))
    ca = str(pki.directory / "ca.pem")
    gateway = _gateway(start_gateway, tmp_path / "a", front.url, {"ca_file": ca})
    assert "IP address mismatch, certificate is not valid for '127.0.0.1'" in _refused(
        gateway, sim, 0
    )
    named = _gateway(
        start_gateway, tmp_path / "b", front.url, {"ca_file": ca, "server_name": "gpu-fra.internal"}
    )
    assert _chat(named).status_code == 200


def test_mutual_tls_without_the_client_certificate_gets_no_request(
    start_gateway: Callable[..., Gateway],
    start_front: Callable[[Any], TLSFront],
    sim: Sim,
    pki: Pki,
    tmp_path: Path,
) -> None:
    front = start_front(server_context(pki, pki.server(), client_ca=pki))
    ca = str(pki.directory / "ca.pem")
    anonymous = _gateway(start_gateway, tmp_path / "a", front.url, {"ca_file": ca})
    # TLS 1.3: the server refuses the missing certificate after the client's handshake
    # ended, by closing before it reads the request (an alert, if it sends one, is "tls").
    response = _chat(anonymous)
    assert response.status_code == 503
    assert served(sim) == 0 and front.handshakes == 0 and front.failed >= 1
    assert _status(anonymous)["breaker"]["last_error"] in (
        "closed: backend closed the connection before answering",
        "tls: tlsv13 alert certificate required",
    )
    cert, key = pki.write("gateway-client", pki.client())
    tls = {"ca_file": ca, "client_cert_file": str(cert), "client_key_file": str(key)}
    mutual = _gateway(start_gateway, tmp_path / "b", front.url, tls)
    assert _chat(mutual).status_code == 200
    assert served(sim) == 1


def test_a_certificate_swapped_mid_run_shows_in_the_record_and_fails_the_pin(
    start_gateway: Callable[..., Gateway],
    start_front: Callable[[Any], TLSFront],
    sim: Sim,
    pki: Pki,
    tmp_path: Path,
) -> None:
    first, second = pki.server(), pki.server()
    front = start_front(server_context(pki, first))
    ca = str(pki.directory / "ca.pem")
    unpinned = _gateway(start_gateway, tmp_path / "a", front.url, {"ca_file": ca})
    pinned = _gateway(
        start_gateway, tmp_path / "b", front.url, {"ca_file": ca, "pin_spki_sha256": [first.pin]}
    )
    response = _chat(unpinned)
    assert _peer(tmp_path / "a", response) == {"spki_sha256": first.pin, "attested": False}
    assert _chat(pinned).status_code == 200
    assert served(sim) == 2

    front.swap(server_context(pki, second))  # open connections dropped: the next is new
    response = _chat(unpinned)
    assert response.status_code == 200
    assert _peer(tmp_path / "a", response) == {"spki_sha256": second.pin, "attested": False}
    reason = _refused(pinned, sim, 3)
    assert second.pin in reason


def test_after_a_swap_each_record_names_the_key_of_the_connection_that_carried_it(
    start_gateway: Callable[..., Gateway],
    start_front: Callable[[Any], TLSFront],
    pki: Pki,
    tmp_path: Path,
) -> None:
    # The front keeps its kept-alive connections across the swap, as a server whose
    # certificate was replaced does: the pooled connection goes on presenting the old key
    # while a new one presents the new key, both in the gateway's pool at once. The
    # front's own account of which connection carried which request id is the truth
    # every dispatch record must match, not the key the backend presents now.
    first, second = pki.server(), pki.server()
    old, new = server_context(pki, first), server_context(pki, second)
    front = start_front(old)
    gateway = _gateway(
        start_gateway, tmp_path, front.url, {"ca_file": str(pki.directory / "ca.pem")}
    )
    ids = [_chat(gateway).headers["x-request-id"]]  # connection 0, kept alive in the pool
    front.swap(new, keep_open=True)
    front.hold(0)
    with ThreadPoolExecutor(1) as threads:
        held = threads.submit(_chat, gateway)  # on connection 0, its answer held
        until(lambda: len(front.carried[0].request_ids()) == 2, "a request on connection 0")
        ids.append(_chat(gateway).headers["x-request-id"])  # 0 busy: a new one, new key
        front.release(0)
        ids.append(held.result(10).headers["x-request-id"])
    ids += [_chat(gateway).headers["x-request-id"] for _ in range(4)]  # either one now
    pins = {id(old): first.pin, id(new): second.pin}
    truth = {rid: pins[id(c.context)] for c in front.carried for rid in c.request_ids()}
    assert len(front.carried) == 2 and sorted(truth) == sorted(ids)
    assert {truth[ids[1]], truth[ids[2]]} == {first.pin, second.pin}
    for request_id in ids:
        (dispatch,) = request_records(tmp_path / "log", request_id, "dispatch")
        assert dispatch["backend"]["peer"] == {"spki_sha256": truth[request_id], "attested": False}


def test_facts_the_certificate_contradicts_exclude_the_backend_naming_both(
    start_gateway: Callable[..., Gateway],
    start_front: Callable[[Any], TLSFront],
    sim: Sim,
    pki: Pki,
    tmp_path: Path,
) -> None:
    stated = pki.server(region="eu-central-1", owner="test", retention="0d")
    front = start_front(server_context(pki, stated))
    ca = str(pki.directory / "ca.pem")
    declared = _gateway(
        start_gateway, tmp_path / "a", front.url, {"ca_file": ca}, identity="certificate"
    )  # gateway.yaml says eu-west-1 (tests.helpers.gateways.backend)
    reason = _refused(declared, sim, 0)
    assert "the certificate says 'eu-central-1', gateway.yaml says 'eu-west-1'" in reason

    matching = _gateway(
        start_gateway,
        tmp_path / "b",
        front.url,
        {"ca_file": ca},
        identity="certificate",
        region="eu-central-1",
    )
    response = _chat(matching)
    assert response.status_code == 200
    assert _peer(tmp_path / "b", response) == {"spki_sha256": stated.pin, "attested": True}


_FACTS = ["owngate:owner:test", "owngate:retention:0d"]


@pytest.mark.parametrize(
    ("uris", "said"),
    [
        # two regions: which one the backend is in, the certificate does not say
        (["owngate:region:eu-west-1", "owngate:region:us-east-1"], "more than once"),
        (["owngate:region:eu-west-1", "owngate:region:eu-west-1"], "more than once"),
        # the same scheme to other readers (RFC 3986): a second, hidden region
        (["owngate:region:eu-west-1", "OWNGATE:region:us-east-1"], "lowercase"),
        # a region name in another case is another region, not the declared one
        (["owngate:region:EU-WEST-1"], "the certificate says 'EU-WEST-1'"),
        (["owngate:region:"], "malformed certificate fact 'owngate:region:'"),
        ([], "the certificate states no region"),
    ],
    ids=["two-regions", "region-twice", "uppercase-scheme", "region-case", "empty", "none"],
)
def test_a_certificate_whose_region_is_ambiguous_or_empty_gets_no_request(
    uris: list[str],
    said: str,
    start_gateway: Callable[..., Gateway],
    start_front: Callable[[Any], TLSFront],
    sim: Sim,
    pki: Pki,
    tmp_path: Path,
) -> None:
    # `identity: certificate` against a real TLS server whose certificate states the
    # region twice, in a scheme spelled otherwise, in another case, empty or not at all:
    # the backend gets nothing, with the reason in its breaker.
    stated = issue(pki.ca, "127.0.0.1", now=datetime.now(UTC), days=1, uris=[*uris, *_FACTS])
    front = start_front(server_context(pki, stated))
    ca = str(pki.directory / "ca.pem")
    gateway = _gateway(start_gateway, tmp_path, front.url, {"ca_file": ca}, identity="certificate")
    assert said in _refused(gateway, sim, 0)


def test_a_zero_data_retention_flag_the_certificate_does_not_state_excludes_the_backend(
    start_gateway: Callable[..., Gateway],
    start_front: Callable[[Any], TLSFront],
    sim: Sim,
    pki: Pki,
    tmp_path: Path,
) -> None:
    # gateway.yaml declares 30 days with zero data retention; a certificate that says only
    # `30d` must not let the record call that claim attested.
    ca = str(pki.directory / "ca.pem")
    zdr = {"days": 30, "zero_data_retention": True}
    silent = pki.server(region="eu-west-1", owner="test", retention="30d")
    declared = _gateway(
        start_gateway,
        tmp_path / "a",
        start_front(server_context(pki, silent)).url,
        {"ca_file": ca},
        identity="certificate",
        retention=zdr,
    )
    reason = _refused(declared, sim, 0)
    assert "the certificate says '30d', gateway.yaml says '30d+zdr'" in reason

    stating = pki.server(region="eu-west-1", owner="test", retention="30d+zdr")
    matching = _gateway(
        start_gateway,
        tmp_path / "b",
        start_front(server_context(pki, stating)).url,
        {"ca_file": ca},
        identity="certificate",
        retention=zdr,
    )
    response = _chat(matching)
    assert response.status_code == 200, response.text
    assert _peer(tmp_path / "b", response) == {"spki_sha256": stating.pin, "attested": True}


def test_the_health_probe_uses_the_backend_tls_and_says_why_it_failed(
    start_gateway: Callable[..., Gateway],
    start_front: Callable[[Any], TLSFront],
    sim: Sim,
    pki: Pki,
    tmp_path: Path,
) -> None:
    presented, pinned = pki.server(), pki.server()
    front = start_front(server_context(pki, presented))
    tls = {"ca_file": str(pki.directory / "ca.pem"), "pin_spki_sha256": [pinned.pin]}
    scrape = {"interval_s": 0.05, "timeout_s": 5, "staleness_s": 1}
    gateway = _gateway(start_gateway, tmp_path, front.url, tls, scrape)

    until(lambda: bool(_status(gateway)["health_error"]), "the probe to mark the backend down")
    entry = _status(gateway)
    assert entry["health_error"].startswith("/health: tls: certificate key ")
    assert entry["metrics_error"].startswith("tls: certificate key ")
    metrics = httpx.get(f"{gateway.url}/metrics", headers=ADMIN_HEADERS, timeout=10).text
    assert 'owngate_backend_up{backend="gpu"} 0.0' in metrics
    assert served(sim) == 0


def test_a_connection_leased_for_its_record_never_reconnects_to_another_key(
    start_front: Callable[[Any], TLSFront], pki: Pki, tmp_path: Path
) -> None:
    # The dispatch record names the key of the connection the gateway leased; if the
    # backend closes it before the request is written, the request may go on a new one
    # only if that presents the same key.
    first, second = pki.server(), pki.server()
    front = start_front(server_context(pki, first))
    settings = BackendSettings.model_validate(
        backend("gpu", front.url, "m", tls={"ca_file": str(pki.directory / "ca.pem")})
    )

    async def run() -> None:
        pool = _pool(front.url, settings, tmp_path, max_connections=2)
        try:
            same = await pool.connect()
            assert same.peer is not None and same.peer.spki_sha256 == first.pin
            front.swap(server_context(pki, first))  # dropped; a new one has the same key
            await until_async(lambda: same.closed, "the front to drop the connection")
            response = await pool.request(b"GET", b"/health", [], b"", connection=same)
            assert response.status == 200
            await response.read()
            other = await pool.connect()
            front.swap(server_context(pki, second))
            await until_async(lambda: other.closed, "the front to drop the connection")
            with pytest.raises(UpstreamError) as caught:
                await pool.request(b"GET", b"/health", [], b"", connection=other)
            # Not "tls", which opens the breaker at once: the key is allowed (a replica
            # behind the same name, a renewed certificate), only not the record's.
            assert (caught.value.kind, caught.value.detail) == (
                "closed",
                "the backend presented another certificate on reconnecting",
            )
            assert pool.open_connections == 0
        finally:
            await pool.close()

    asyncio.run(run())


def test_a_certificate_fact_that_is_not_text_is_a_tls_refusal(
    start_gateway: Callable[..., Gateway],
    start_front: Callable[[Any], TLSFront],
    sim: Sim,
    pki: Pki,
    tmp_path: Path,
) -> None:
    # A URI SAN is an IA5String; a CA (or a step-ca template copying what the requester
    # asked for) can still put a byte above 0x7f in one, and OpenSSL's handshake accepts
    # it. Reading it must refuse the backend like any unreadable certificate, never fail
    # the request as the gateway's own error with the breaker left closed.
    stated = pki.server(region="eu-west-1", owner="test", retention="0d")
    hostile = patched(pki, stated, b"owngate:owner:test", b"owngate:owner:t\xffst")
    front = start_front(server_context(pki, hostile))
    tls = {"ca_file": str(pki.directory / "ca.pem")}
    gateway = _gateway(start_gateway, tmp_path, front.url, tls, identity="certificate")
    reason = _refused(gateway, sim, 0)
    assert reason.startswith("tls: the backend's certificate cannot be read (")
    assert reason.isascii() and reason.isprintable()


def test_a_certificate_fact_quoted_in_a_refusal_is_escaped_and_bounded(
    start_gateway: Callable[..., Gateway],
    start_front: Callable[[Any], TLSFront],
    sim: Sim,
    pki: Pki,
    tmp_path: Path,
) -> None:
    # The certificate's URI reaches the breaker's reason (/admin/status), the log and the
    # client's error: an escape sequence or a newline in it must arrive escaped, and a
    # SAN of kilobytes must not.
    long = "owngate:region:" + "\x1b[31m\n" + "x" * 4000
    hostile = issue(pki.ca, "127.0.0.1", now=datetime.now(UTC), days=1, uris=[long])
    front = start_front(server_context(pki, hostile))
    tls = {"ca_file": str(pki.directory / "ca.pem")}
    gateway = _gateway(start_gateway, tmp_path, front.url, tls, identity="certificate")
    reason = _refused(gateway, sim, 0)
    assert reason.startswith("tls: malformed certificate fact 'owngate:region:\\x1b[31m\\n")
    assert "\x1b" not in reason and "\n" not in reason
    assert len(reason) < 200


@pytest.mark.parametrize(
    "failure",
    [
        UnsupportedAlgorithm("Curve 1.2.156.10197.1.301 is not supported"),  # an SM2 key
        ValueError("error parsing asn1 value"),
    ],
)
def test_a_certificate_the_gateway_cannot_read_is_a_tls_refusal_that_frees_its_slot(
    start_front: Callable[[Any], TLSFront],
    pki: Pki,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    failure: Exception,
) -> None:
    # A trusted CA may issue a certificate whose key `cryptography` cannot parse (an SM2
    # or GOST key); OpenSSL's handshake accepts it, reading its key does not. Injected at
    # the parse seam: the leaf's DER as the check reads it.
    front = start_front(server_context(pki, pki.server()))
    settings = BackendSettings.model_validate(
        backend("gpu", front.url, "m", tls={"ca_file": str(pki.directory / "ca.pem")})
    )

    def unreadable(der: bytes) -> x509.Certificate:
        raise failure

    monkeypatch.setattr(x509, "load_der_x509_certificate", unreadable)

    async def run() -> None:
        pool = _pool(front.url, settings, tmp_path, max_connections=1)
        try:
            for _ in range(2):  # the second would wait for a leaked slot: "busy"
                with pytest.raises(UpstreamError) as caught:
                    await pool.connect()
                assert caught.value.kind == "tls"
                assert caught.value.detail.startswith("the backend's certificate cannot be read")
                assert pool.open_connections == 0
        finally:
            await pool.close()

    asyncio.run(run())


def _pool(url: str, settings: BackendSettings, tmp_path: Path, *, max_connections: int) -> HttpPool:
    """The upstream pool to `url` with the backend's TLS context, 5 s timeouts."""
    pool, _ = HttpPool.for_url(
        url,
        connect_timeout=5,
        first_byte_timeout=5,
        read_timeout=5,
        max_connections=max_connections,
        tls=backend_tls(settings, "127.0.0.1", tmp_path),
    )
    return pool
