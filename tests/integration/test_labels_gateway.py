"""Data-class labels on the request path, over real sockets: they fail closed.

An empty, blank or contradictory label is refused (never read as "no label"), a policy
can make "no label" mean a class (`default_data_class`), and what a client puts in the
label or the model name never reaches the access log, the metrics or the provenance log
verbatim. Repeated headers go on the wire as separate header lines (httpx sends a list
of tuples as written).
"""

from __future__ import annotations

import base64
import json
import socket
from collections.abc import Callable, Iterator, MutableMapping
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from structlog.testing import capture_logs

from gateway.api.labels import EXCERPT_CHARS, excerpt
from gateway.app import create_app
from gateway.config.schema import ListenSettings
from gateway.provenance import load_signer, write_signing_key
from gateway.serving import ServerThread
from tests.helpers.gateways import (
    EU_ZERO,
    Gateway,
    Sim,
    backend,
    gateway_config,
    hosted_backend,
    served,
)
from tests.helpers.net import free_port
from tests.helpers.provenance import log_bytes, request_records, run_audit, run_audit_output
from tests.helpers.waiting import until

Build = Callable[..., tuple[Gateway, Sim, Sim]]

POLICY = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: eu-health, version: "1"}
spec:
  tenants: [acme]
  residency: {allow: [eu]}
  retention: {max_days: zero}
  fallback:
    mode: when_private_unavailable
    to: [{backend: hosted-eu}]
  data_classes:
    phi:
      fallback: {mode: never}
    public: {}
"""

PROVENANCE = {
    "dir": "log",
    "origin": "test.owngate/log/1",
    "signing_key_file": "log.key",
    "checkpoint_interval_ms": 50,
}


@pytest.fixture
def setup(start_sim: Callable[..., Sim], tmp_path: Path) -> Iterator[Build]:
    """(gateway, private sim, hosted sim): PHI never falls back, other traffic may."""
    started: list[ServerThread] = []

    def build(
        *,
        private_up: bool = True,
        spec: str = "",
        provenance: bool = False,
        header: str = "",
        tenant: str = "acme",
        max_header_bytes: int | None = None,
    ) -> tuple[Gateway, Sim, Sim]:
        private_sim = start_sim("vllm", models=("m",), zero_latency=True)
        hosted_sim = start_sim("vllm", models=("m",), zero_latency=True)
        url = private_sim.url if private_up else f"http://127.0.0.1:{free_port()}"
        backends = [
            backend("gpu-eu", url, "m", **EU_ZERO),
            hosted_backend("hosted-eu", f"{hosted_sim.url}/v1", "m"),
        ]
        policies = tmp_path / "policies"
        policies.mkdir(exist_ok=True)
        text = POLICY.replace("  tenants: [acme]\n", f"  tenants: [{tenant}]\n{spec}")
        if header:
            text += (
                "---\napiVersion: policy.owngate.dev/v1\nkind: PolicySet\n"
                f"metadata: {{id: s}}\nspec: {{data_class_header: {header}}}\n"
            )
        (policies / "policy.yaml").write_text(text)
        extra: dict[str, Any] = {"policy": {"paths": [str(policies)]}}
        if provenance:
            write_signing_key(tmp_path / "log.key", "test.owngate/log/1")
            extra["provenance"] = PROVENANCE
        config = gateway_config(backends, **extra)
        app = create_app(config, environ={"HOSTED_KEY": "test-key"}, config_dir=tmp_path)
        listen = (
            None if max_header_bytes is None else ListenSettings(max_header_bytes=max_header_bytes)
        )
        started.append(ServerThread(app, listen=listen).start())
        return Gateway(app, started[-1]), private_sim, hosted_sim

    yield build
    for server in started:
        server.stop()


def chat(
    gateway: Gateway,
    labels: list[str] | None = None,
    model: str = "m",
    header: str = "x-data-class",
) -> httpx.Response:
    """POST a chat request with one `<header>: <label>` line per entry of `labels`,
    written to the socket byte for byte (HTTP clients refuse blank values)."""
    body = orjson.dumps(
        {"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    )
    lines = [
        b"POST /v1/chat/completions HTTP/1.1",
        b"host: gateway",
        f"authorization: Bearer {gateway.key}".encode(),
        b"content-type: application/json",
        b"content-length: " + str(len(body)).encode(),
        b"connection: close",
        *(f"{header}:{label}".encode("latin-1") for label in labels or []),
    ]
    url = httpx.URL(gateway.url)
    assert url.host in ("127.0.0.1", "localhost") and url.port is not None
    with socket.create_connection((url.host, url.port), timeout=30) as sock:
        sock.sendall(b"\r\n".join(lines) + b"\r\n\r\n" + body)
        received = b""
        while chunk := sock.recv(65536):  # the gateway closes: connection: close
            received += chunk
    head, _, content = received.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = [(name, value) for name, _, value in (h.partition(": ") for h in header_lines)]
    return httpx.Response(int(status_line.split()[1]), headers=headers, content=content)


def _access_lines(
    logs: list[MutableMapping[str, Any]], count: int
) -> list[MutableMapping[str, Any]]:
    """The access lines of `count` requests, once written: a `connection: close` answer's
    line comes once its wait saw the answer taken (a poll after the gateway's close), which
    may be after the client read to the end (gateway/body_writer.py `taken`)."""

    def lines() -> list[MutableMapping[str, Any]]:
        return [e for e in list(logs) if e["event"] == "request"]

    until(lambda: len(lines()) >= count, f"{count} access lines", timeout=30)
    return lines()


def refused_label(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 400, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["code"] == "unknown_data_class"
    assert error["param"] == "x-data-class"
    return error


def test_an_empty_copy_before_phi_cannot_hide_it(setup: Build) -> None:
    gateway, private, hosted_sim = setup(private_up=False)
    refused_label(chat(gateway, ["", "phi"]))
    assert served(hosted_sim) == 0 and served(private) == 0
    # The same request without the empty copy is PHI: refused, and still never hosted.
    response = chat(gateway, ["phi"])
    assert response.status_code == 503
    assert "eu-health/data_classes.phi/fallback" in response.json()["error"]["message"]
    assert served(hosted_sim) == 0


@pytest.mark.parametrize("value", ["", "   ", "\t", ",", "phi,", " , phi"])
def test_an_empty_or_blank_label_is_refused(setup: Build, value: str) -> None:
    gateway, private, hosted_sim = setup(private_up=False)
    refused_label(chat(gateway, [value]))
    assert served(hosted_sim) == 0 and served(private) == 0


@pytest.mark.parametrize(
    "labels", [["public", "phi"], ["phi", "public"], ["public, phi"], ["public", "phi, public"]]
)
def test_copies_that_disagree_are_refused_never_first_wins(setup: Build, labels: list[str]) -> None:
    gateway, _private, hosted_sim = setup(private_up=False)
    error = refused_label(chat(gateway, labels))
    assert "disagree" in error["message"]
    assert served(hosted_sim) == 0


@pytest.mark.parametrize("labels", [["phi", "phi"], ["phi", " PHI "], ["phi, Phi"]])
def test_copies_naming_the_same_class_are_that_class(setup: Build, labels: list[str]) -> None:
    gateway, private, hosted_sim = setup(private_up=False)
    response = chat(gateway, labels)
    assert response.status_code == 503, response.text  # PHI with the private tier down
    assert "eu-health/data_classes.phi/fallback" in response.json()["error"]["message"]
    assert served(hosted_sim) == 0 and served(private) == 0
    up, private_up, _hosted = setup(private_up=True)
    assert chat(up, labels).status_code == 200
    assert served(private_up) == 1


@pytest.mark.parametrize(
    "label",
    [
        "\u0440hi",  # a Cyrillic er for the p
        "phi\u200b",  # a zero-width space after it
        "\uff50\uff48\uff49",  # fullwidth letters
        "phi;q=1",
        "phi public",
        '"phi"',
    ],
)
def test_a_look_alike_of_a_class_is_refused_never_read_as_no_label(
    setup: Build, label: str
) -> None:
    # Sent as UTF-8 bytes. No label would let this tenant's request fall back to hosted
    # (the private tier is down); a look-alike of `phi` is neither `phi` nor no label.
    gateway, private, hosted_sim = setup(private_up=False)
    refused_label(chat(gateway, [label.encode().decode("latin-1")]))
    assert served(hosted_sim) == 0 and served(private) == 0


@pytest.mark.parametrize("label", ["\xa0phi", "phi\x85", "public\xa0", "\x85public"])
def test_a_latin1_space_around_a_class_is_a_look_alike_never_that_class(
    setup: Build, label: str
) -> None:
    # Raw bytes 0xa0 (NBSP) and 0x85 (NEL): HTTP allows them in a value (obs-text), but
    # they are not its whitespace (SP, HTAB). Python's `str.strip()` took them for it,
    # so `public\xa0` was `public` and fell back to hosted, `phi\x85` was `phi`, where
    # their UTF-8 spellings were refused as the look-alikes they are.
    gateway, private, hosted_sim = setup(private_up=False)
    refused_label(chat(gateway, [label]))
    assert served(hosted_sim) == 0 and served(private) == 0
    assert chat(gateway, [" public\t"]).status_code == 200  # SP and HTAB are stripped
    assert served(hosted_sim) == 1


def test_default_data_class_makes_an_unlabelled_request_phi(setup: Build) -> None:
    gateway, _private, hosted_sim = setup(private_up=False, spec="  default_data_class: phi\n")
    with capture_logs() as logs:
        response = chat(gateway)
    assert response.status_code == 503, response.text
    assert "eu-health/data_classes.phi/fallback" in response.json()["error"]["message"]
    assert served(hosted_sim) == 0
    access = [e for e in logs if e["event"] == "request"]
    assert [(e["data_class"], e["data_class_defaulted"]) for e in access] == [("phi", True)]
    # A label the client does send still counts: `public` may fall back.
    assert chat(gateway, ["public"]).status_code == 200
    assert served(hosted_sim) == 1
    # /v1/models lists what an unlabelled request may use: with PHI the default, `m`
    # (private only for PHI) stays listed.
    models = httpx.get(f"{gateway.url}/v1/models", headers=gateway.headers, timeout=10)
    assert [m["id"] for m in models.json()["data"]] == ["m"]


def test_the_configured_header_name_matches_in_any_case(setup: Build) -> None:
    gateway, _private, hosted_sim = setup(private_up=False, header="X-Tenant-Class")
    response = chat(gateway, ["phi"], header="x-TENANT-class")
    assert response.status_code == 503, response.text  # PHI, private down: never hosted
    assert served(hosted_sim) == 0
    error = chat(gateway, ["", "phi"], header="X-Tenant-Class").json()["error"]
    assert (error["code"], error["param"]) == ("unknown_data_class", "x-tenant-class")


def test_a_per_tenant_default_overrides_the_policy_default(setup: Build) -> None:
    spec = "  default_data_class: public\n  default_data_class_by_tenant: {acme: phi}\n"
    gateway, _private, hosted_sim = setup(private_up=False, spec=spec)
    response = chat(gateway)
    assert response.status_code == 503, response.text
    assert served(hosted_sim) == 0


def test_a_huge_label_is_refused_recorded_and_never_logged(setup: Build, tmp_path: Path) -> None:
    # The listener's default 32 KiB head limit would answer 431 before the app saw it:
    # raised here so the label itself reaches the policy.
    gateway, private, hosted_sim = setup(provenance=True, max_header_bytes=256 * 1024)
    label = "Jane-Doe-born-1970-" * 3700  # ~70 KB, over a log entry's 64 KiB
    with capture_logs() as logs:
        response = chat(gateway, [label])
        error = refused_label(response)
    assert len(error["message"]) < 400  # bounded, whatever the client sent
    assert served(private) == 0 and served(hosted_sim) == 0
    refusals = request_records(tmp_path / "log", response.headers["x-request-id"])
    assert [(r["type"], r["rule"], r["reason"]) for r in refusals] == [
        ("refusal", "eu-health/data_classes", "unknown_data_class")
    ]
    assert b"Jane-Doe" not in log_bytes(tmp_path / "log")
    assert logs and "Jane-Doe" not in repr(logs)
    access = [e for e in logs if e["event"] == "request"]
    assert [(e["status"], e["data_class"]) for e in access] == [(400, "<unknown>")]


def test_an_undeclared_label_is_logged_as_unknown(setup: Build) -> None:
    gateway, _private, _hosted = setup()
    canary = "patient-CANARY-4d2a"
    with capture_logs() as logs:
        refused_label(chat(gateway, [canary]))
        assert chat(gateway, ["PHI"]).status_code == 200
        access = _access_lines(logs, 2)
    assert canary not in repr(logs)
    assert [e["data_class"] for e in access] == ["<unknown>", "phi"]
    metrics = httpx.get(f"{gateway.url}/metrics", timeout=10).text
    assert canary not in metrics


def test_a_tenant_without_a_policy_logs_no_label(setup: Build) -> None:
    gateway, _private, _hosted = setup(tenant="someone-else")  # acme has no policy
    canary = "patient-CANARY-77b0"
    with capture_logs() as logs:
        response = chat(gateway, [canary])
    # Deny by default, whatever the label: no model is in its `/v1/models`, so each is
    # the 404 of a model that does not exist (the record names `default-deny`).
    assert response.status_code == 404
    assert canary.lower() not in repr(logs).lower()


def test_a_model_name_no_backend_serves_never_reaches_the_logs(setup: Build) -> None:
    gateway, _private, _hosted = setup()
    canary = "CANARY-model-9e1f-" + "x" * 5000
    with capture_logs() as logs:
        response = chat(gateway, model=canary)
        assert chat(gateway).status_code == 200
        access = _access_lines(logs, 2)
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "model_not_found"
    assert len(response.json()["error"]["message"]) < 400
    assert "CANARY-model" not in repr(logs)
    assert [e["model"] for e in access] == ["<unknown>", "m"]
    metrics = httpx.get(f"{gateway.url}/metrics", timeout=10).text
    assert "CANARY-model" not in metrics


def test_a_label_on_a_policy_without_classes_is_still_refused(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway]
) -> None:
    """Without policy files (the built-in private-only set) an empty label is refused too."""
    sim = start_sim("vllm", models=("m",), zero_latency=True)
    gateway = start_gateway([backend("gpu", sim.url, "m")])
    refused_label(chat(gateway, [""]))
    assert chat(gateway).status_code == 200


def test_an_excerpt_is_bounded_and_printable() -> None:
    assert excerpt("phi") == "phi"
    assert excerpt("a\x00b\u202ec\n") == "a\\x00b\\u202ec\\n"
    cut = excerpt("x" * 10_000)
    assert cut == "x" * EXCERPT_CHARS + "..."


def test_an_unknown_path_is_quoted_bounded(setup: Build) -> None:
    gateway, _private, _hosted = setup()
    response = httpx.get(f"{gateway.url}/{'p' * 5000}", timeout=10)
    assert response.status_code == 404
    assert len(response.json()["error"]["message"]) < 200


def _class_of(log: Path, response: httpx.Response) -> tuple[str, object]:
    """The type of the request's one dispatch or refusal record and the data class it
    names (KeyError when it names none: a record written before it did)."""
    (record,) = [
        r
        for r in request_records(log, response.headers["x-request-id"])
        if r["type"] in ("dispatch", "refusal")
    ]
    return record["type"], record["data_class"]


def test_the_records_name_the_class_the_gateway_applied_never_the_label(
    setup: Build, tmp_path: Path
) -> None:
    """An auditor re-deciding a record needs the class it was decided under: each
    dispatch and refusal record names it as the policy's own class name (the label's
    class, after the gateway's normalisation), null when none applied (no label, no
    default; a label naming no class, refused), never the client's text."""
    gateway, _private, _hosted = setup(provenance=True, max_header_bytes=256 * 1024)
    log = tmp_path / "log"
    labelled = chat(gateway, [" PHI\t"])
    assert labelled.status_code == 200, labelled.text
    assert _class_of(log, labelled) == ("dispatch", "phi")
    assert _class_of(log, chat(gateway, ["public"])) == ("dispatch", "public")
    assert _class_of(log, chat(gateway)) == ("dispatch", None)
    policy_read = [
        "CANARY-class-unknown",  # a name the policy does not define
        "\x9b2J\x9b0;0HCANARY\x85phi",  # C1 controls (8-bit CSI, NEL): obs-text to HTTP
        "CANARY-huge-" + "q" * 64 * 1024,  # 64 KiB
    ]
    for label in policy_read:
        response = chat(gateway, [label])
        refused_label(response)
        assert _class_of(log, response) == ("refusal", None), label[:40]
    for label in ["\x1b[2JCANARY\r\x07phi", "\x00CANARY\x7f"]:  # C0 controls, DEL
        response = chat(gateway, [label])  # refused by the listener: no header has them
        assert response.status_code == 400, response.text
        assert response.json()["error"]["code"] != "unknown_data_class"
    written = log_bytes(log)
    assert b"CANARY" not in written and b"qqqqqqqq" not in written
    assert b"PHI" not in written
    # The auditor's tools count dispatches per class, and verify the log holding them.
    key = load_signer(tmp_path / "log.key").vkey
    assert run_audit(["verify", str(log), "--key", key]) == 0
    code, shown = run_audit_output(["show", str(log), "--json"])
    assert code == 0, shown
    assert json.loads(shown)["data_classes"] == {"phi": 1, "public": 1, "(none)": 1}
    receipt = tmp_path / "phi.receipt"
    receipt.write_bytes(base64.b64decode(labelled.headers["x-owngate-receipt"]))
    argv = ["receipt", "verify", str(receipt), "--key", key, "--log", str(log)]
    code, shown = run_audit_output(argv)
    assert code == 0, shown
    assert "policy eu-health version 1 under data class phi\n" in shown, shown


def test_a_refusal_and_a_defaulted_request_name_the_class_they_were_decided_under(
    setup: Build, tmp_path: Path
) -> None:
    """The policy's `default_data_class` is the class an unlabelled request is recorded
    under; a PHI request refused (its class never falls back, the private tier is down)
    is recorded under `phi`, the class whose rule refused it."""
    gateway, _private, _hosted = setup(
        private_up=False, provenance=True, spec="  default_data_class: public\n"
    )
    log = tmp_path / "log"
    unlabelled = chat(gateway)
    assert unlabelled.status_code == 200, unlabelled.text  # public: may fall back
    assert _class_of(log, unlabelled) == ("dispatch", "public")
    refused = chat(gateway, ["phi"])
    assert refused.status_code == 503, refused.text
    assert _class_of(log, refused) == ("refusal", "phi")


def test_a_model_the_tenant_is_not_shown_is_recorded_under_the_unlabelled_class(
    setup: Build, tmp_path: Path
) -> None:
    """A request for a model no backend serves (or the key may not use) is refused (404)
    before its label is read, decided as an unlabelled one: its refusal record names the
    class that decision applied (the policy's default), whatever label the client sent,
    a class's name or any other text, never the label."""
    gateway, _private, _hosted = setup(provenance=True, spec="  default_data_class: public\n")
    log = tmp_path / "log"
    for label in (["phi"], ["CANARY-not-a-class"], None):
        response = chat(gateway, label, model="CANARY-no-such-model")
        assert response.status_code == 404, response.text
        assert response.json()["error"]["code"] == "model_not_found"
        assert _class_of(log, response) == ("refusal", "public"), label
    assert b"CANARY" not in log_bytes(log)
