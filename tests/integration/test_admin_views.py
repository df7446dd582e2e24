"""The admin API's views for the console (gateway/admin/): who a token is, the
timelines sampled from a running `owngate serve` with a simulated backend, tenants,
the policy test cases, receipt verification, witness cosignatures and the audit report."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.canonical import canonical_json
from gateway.provenance import (
    ProvenanceLog,
    Receipt,
    load_signer,
    make_receipt,
    seal_receipts,
    write_signing_key,
)
from gateway.provenance.testing import log_request, seeded_signer
from tests.helpers.admin import CASES, ORIGIN, TOKENS, WITNESS, Served, bearer, serve_admin
from tests.helpers.provenance import batch_receipts, run_audit
from tests.helpers.waiting import until


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    directory = tmp_path_factory.mktemp("admin-views")
    with serve_admin(directory, witness=True, sample_interval_s=0.2) as gateway:
        yield gateway


def test_whoami_names_the_role_and_what_it_may_use(served: Served) -> None:
    for role in ("operator", "security", "auditor"):
        assert served.get("/admin/v1/whoami", role).json() == {"role": role, "may": [role]}
    full = served.get("/admin/v1/whoami", "admin").json()
    assert full == {"role": "full", "may": ["operator", "security", "auditor"]}
    assert served.get("/admin/v1/whoami").status_code == 401


def _sum(samples: list[dict[str, Any]], after: float, value: Any) -> int:
    return sum(value(sample) for sample in samples if sample["t"] > after)


def test_the_timelines_show_the_requests_sent(served: Served) -> None:
    def newest(path: str, role: str) -> dict[str, Any]:
        answer: dict[str, Any] = served.get(f"/admin/v1/timeline/{path}", role).json()
        return answer

    first = newest("backends", "operator")
    assert first["interval_s"] == 0.2
    until(lambda: newest("backends", "operator")["samples"], "a first sample", timeout=20)
    start = newest("backends", "operator")["samples"][-1]["t"]  # what came before is in it
    for _ in range(3):
        assert served.chat().status_code == 200

    def requests() -> int:
        samples = newest("backends", "operator")["samples"]
        return _sum(samples, start, lambda s: s["backends"]["gpu"]["requests"])

    until(lambda: requests() >= 3, "3 requests in the backends timeline", timeout=20)
    assert requests() == 3
    samples = newest("backends", "operator")["samples"]
    served_in = [s["backends"]["gpu"] for s in samples if s["t"] > start]
    assert all(row["errors"] == 0 and row["breaker"] == "closed" for row in served_in)
    assert all(row["error_rate"] in (None, 0.0) for row in served_in)
    times = [s["t"] for s in samples]
    assert times == sorted(times)

    def decisions() -> int:
        samples = newest("policies", "security")["samples"]
        return _sum(samples, start, lambda s: sum(s["decisions"].values()))

    until(lambda: decisions() >= 3, "the decisions in the policies timeline", timeout=20)
    rules = {r for s in newest("policies", "security")["samples"] for r in s["decisions"]}
    assert rules == {"builtin-private-only/private"}  # the rule that admitted gpu

    def logged() -> int:
        return newest("log", "auditor")["samples"][-1]["checkpoint_size"] or 0

    until(lambda: logged() >= 6, "the 6 records in the log timeline", timeout=20)
    last = newest("log", "auditor")["samples"][-1]
    assert last["entries"] >= last["checkpoint_size"]

    def cosigned() -> int:
        return newest("log", "auditor")["samples"][-1]["cosigned_size"] or 0

    until(lambda: cosigned() >= 6, "the witness's cosignature in the log timeline", timeout=20)


def test_tenants_show_their_limits_and_use(served: Served) -> None:
    tenants = served.get("/admin/v1/tenants", "operator").json()["tenants"]
    assert [t["id"] for t in tenants] == ["acme"]
    acme = tenants[0]
    assert acme["models"] == ["*"] and acme["keys"] == 1
    unlimited = {"requests_per_minute": None, "tokens_per_minute": None}
    assert acme["limits"] == {
        **unlimited,
        "concurrent_requests": None,
        "reserved_tokens_per_answer": None,
        "reserved_tokens_per_media": None,
    }
    none = {"inflight": None, "requests": None, "tokens": None, "reserved": None}
    assert acme["use"] == {**none, "scope": "process"}


def test_policy_cases_run_against_the_running_set(served: Served) -> None:
    report = served.post("/admin/v1/policies/test", "security", {"cases_yaml": CASES}).json()
    assert (report["passed"], report["total"], report["failed"]) == (False, 2, 1)
    first, second = report["cases"]
    assert first == {"name": "admin-cases: private only", "passed": True, "problems": []}
    assert second["passed"] is False and "hosted" in second["problems"][0]
    assert 0 < report["coverage"] < 1
    # the running set is the built-in one: it has no case files of its own
    own = served.post("/admin/v1/policies/test", "security", {})
    assert own.status_code == 400 and "no test cases" in own.json()["error"]["message"]


@pytest.mark.parametrize(
    ("cases_yaml", "named"),
    [
        ("cases: [unclosed", "not valid YAML"),
        ("kind: Policy\napiVersion: policy.owngate.dev/v1\n", "expected kind PolicyTest"),
        (CASES.replace("input: {tenant: acme", "input: {tenant: 7, tenant: acme", 1), "tenant"),
        (CASES.replace("    input: {tenant: acme, model: m}\n", "", 1), "input"),
        ("[" * 5000 + "]" * 5000, "nests too deep"),  # PyYAML's recursion: was a 500
    ],
)
def test_malformed_cases_are_a_400_naming_the_problem(
    served: Served, cases_yaml: str, named: str
) -> None:
    # the deep case: PyYAML's scanner is quadratic in flow nesting up to its recursion
    # error, about a second of CPU here, many on a loaded machine
    answer = served.post(
        "/admin/v1/policies/test", "security", {"cases_yaml": cases_yaml}, timeout=120
    )
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["code"] == "invalid_request" and named in error["message"]


def test_bodies_are_bounded(served: Served) -> None:
    big = {"cases_yaml": "#" * (256 * 1024 + 1)}
    over = served.post("/admin/v1/policies/test", "security", big)
    assert over.status_code == 400 and over.json()["error"]["param"] is None
    assert "cases_yaml" in over.json()["error"]["message"]
    huge = served.post("/admin/v1/config/validate", "security", {"yaml": "#" * (1 << 21)})
    assert huge.status_code == 413 and huge.json()["error"]["code"] == "request_too_large"

    def chunks() -> Iterator[bytes]:  # no Content-Length: read up to the bound, no further
        yield b'{"yaml": "'
        for _ in range(40):
            yield b"#" * 65536
        yield b'"}'

    streamed = httpx.post(
        f"{served.admin}/admin/v1/config/validate",
        headers={"authorization": "Bearer og-admin-security-token-0123456789"},
        content=chunks(),
        timeout=10,
    )
    assert streamed.status_code == 413, streamed.text
    assert streamed.json()["error"]["code"] == "request_too_large"


def test_a_receipt_is_verified_with_its_record_in_the_log(served: Served, tmp_path: Path) -> None:
    answer, signed_receipt = batch_receipts(served.chat)[0]  # v2: with its batch's path
    header = base64.b64encode(signed_receipt).decode()
    envelope = json.loads(signed_receipt)
    request_id = answer.headers["x-request-id"]
    found = served.get(f"/admin/v1/log/requests/{request_id}", "auditor")
    until(
        lambda: served.get(f"/admin/v1/log/requests/{request_id}", "auditor").status_code == 200,
        "a checkpoint covering the request",
        timeout=20,
        detail=lambda: found.text,
    )
    for given in (header, envelope, json.dumps(envelope)):
        verdict = served.post("/admin/v1/receipts/verify", "auditor", {"receipt": given}).json()
        assert verdict["valid"] is True and verdict["problems"] == [], verdict
        assert (verdict["request_id"], verdict["backend"], verdict["region"]) == (
            request_id,
            "gpu",
            "eu-west-1",
        )
        assert verdict["policy"]["id"] == "builtin-private-only"
        inclusion = verdict["inclusion"]
        assert inclusion["checked"] is True and inclusion["checkpoint_size"] > verdict["log_index"]
        assert inclusion["root"]
    assert (
        served.post("/admin/v1/receipts/verify", "operator", {"receipt": header}).status_code == 403
    )

    payload = json.loads(base64.b64decode(envelope["payload"]))
    altered = {**envelope, "payload": _b64({**payload, "backend": "elsewhere"})}
    lifted = {**envelope, "position": envelope["position"] + 1}
    write_signing_key(tmp_path / "other.key", ORIGIN)
    forged = make_receipt(Receipt.from_payload(payload), load_signer(tmp_path / "other.key"))
    big = {**envelope, "payloadType": 10**30}  # what orjson cannot encode
    deep = "[" * 20000 + "]" * 20000  # past json's recursion limit: was a 500
    # A moved position is refused for what it breaks, which depends on the batch's size
    # and where the receipt sat in it: past the batch (index), a path of the wrong length
    # for the new position, or a root that does not match.
    moved = ("index", "inclusion proof", "root hash")
    bad_ones: tuple[tuple[object, tuple[str, ...]], ...] = (
        (altered, ("root hash",)),
        (lifted, moved),
        (forged.decode(), ("trusted",)),
        ("{", ("JSON",)),
        (big, ("DSSE",)),
        (deep, ("JSON",)),
    )
    for bad, problems in bad_ones:
        verdict = served.post("/admin/v1/receipts/verify", "auditor", {"receipt": bad}).json()
        assert verdict["valid"] is False and verdict["request_id"] is None, verdict
        assert any(p in verdict["problems"][0] for p in problems), verdict
        assert verdict["inclusion"]["checked"] is False
    # signed by the log's own key, but naming what the log does not hold
    log_key = load_signer(served.log.parent / "log.key")
    absent = {**payload, "index": 10**6}
    other = {**payload, "dispatch_hash": "00" * 32}
    for receipt, problem in ((absent, "missing"), (other, "not the record")):
        single = make_receipt(Receipt.from_payload(receipt), log_key).decode()
        index = Receipt.from_payload(receipt).index
        batched = seal_receipts([(index, canonical_json(receipt))], ORIGIN, log_key)[0].decode()
        for signed in (single, batched):  # v1 and v2 receipts alike
            verdict = served.post(
                "/admin/v1/receipts/verify", "auditor", {"receipt": signed}
            ).json()
            assert verdict["valid"] is False and verdict["request_id"] == request_id, verdict
            assert problem in verdict["problems"][0] and not verdict["inclusion"]["checked"]
    too_big = served.post("/admin/v1/receipts/verify", "auditor", {"receipt": "x" * 70000})
    assert too_big.status_code == 400 and too_big.json()["error"]["param"] == "receipt"


def test_a_receipt_object_is_read_as_sent(served: Served) -> None:
    """The receipt as a JSON object in the body: FastAPI's parse keeps the last of
    duplicated member names (and passes lone surrogates); the verdict must be the CLI's,
    which refuses duplicated names, and a lone surrogate is a malformed receipt, not a 500."""
    _, signed = batch_receipts(served.chat)[0]
    doubled = signed[:-1] + b',"payloadType":"application/vnd.owngate.receipt+json"}'
    headers = {**bearer("auditor"), "content-type": "application/json"}
    for body, problem in (
        (b'{"receipt": ' + doubled + b"}", "duplicated member name"),
        (b'{"receipt": "{\\ud800}"}', "not JSON"),
    ):
        answer = httpx.post(
            f"{served.admin}/admin/v1/receipts/verify", headers=headers, content=body, timeout=10
        )
        assert answer.status_code == 200, answer.text
        verdict = answer.json()
        assert verdict["valid"] is False and problem in verdict["problems"][0], verdict


def _b64(value: dict[str, Any]) -> str:
    return base64.b64encode(canonical_json(value)).decode()


def test_witness_cosignatures_of_the_latest_checkpoint(served: Served) -> None:
    assert served.chat().status_code == 200
    served.wait_for_size(2)

    def cosigned() -> dict[str, Any]:
        found: dict[str, Any] = served.get("/admin/v1/log/cosignatures", "auditor").json()
        return found

    until(lambda: cosigned()["witnesses"][0]["valid"], "a cosignature", timeout=20)
    found = cosigned()
    checkpoint = found["checkpoint"]
    assert checkpoint["text"].startswith(f"{ORIGIN}\n{checkpoint['size']}\n{checkpoint['root']}\n")
    (witness,) = found["witnesses"]
    assert (witness["name"], witness["key_id"]) == tuple(WITNESS.vkey.split("+")[:2])
    assert witness["timestamp"] > 0 and 0 < witness["cosigned_size"] <= checkpoint["size"]
    assert witness["lag"] == checkpoint["size"] - witness["cosigned_size"]
    assert found["coverage"] == witness["cosigned_size"] / checkpoint["size"]
    note = (served.log / "cosigned" / f"{witness['cosigned_size']:020d}").read_bytes()
    assert note.decode().count("\n— witness.example/admin-api ") == 1
    assert served.get("/admin/v1/log/cosignatures", "security").status_code == 403


def test_the_live_log_s_report(served: Served, tmp_path: Path) -> None:
    before = served.size()
    for _ in range(2):
        assert served.chat().status_code == 200
    served.wait_for_size(before + 4)  # each: its dispatch and completion records
    answer = served.get("/admin/v1/log/report?format=json", "auditor")
    assert answer.status_code == 200 and answer.headers["content-type"] == "application/json"
    report = answer.json()
    assert report["verification"]["ok"] is True, report["verification"]
    url = f"{served.admin}/log/"
    assert report["log"] == url
    command = report["verification"]["command"]
    assert command.startswith(f"owngate audit verify {url} --key {served.vkey}")
    assert report["totals"]["dispatches"] >= 2
    page = served.get("/admin/v1/log/report?format=html", "auditor")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    disposition = page.headers["content-disposition"]
    assert disposition == 'attachment; filename="owngate-audit-report.html"'
    assert "<svg" in page.text and 'src="http' not in page.text and 'href="http' not in page.text
    assert served.get("/admin/v1/log/report", "operator").status_code == 403
    assert served.get("/admin/v1/log/report?format=xml", "auditor").status_code == 400

    # `owngate audit report URL` (the admin listener's /log/) gives the same figures
    size = served.size()
    flags = ["--key", served.vkey, "--origin", ORIGIN, "--token", TOKENS["auditor"]]
    out, html = tmp_path / "report.json", tmp_path / "report.html"
    assert run_audit(["report", url, *flags, "--json", str(out), "--html", str(html)]) == 0
    assert TOKENS["auditor"] not in out.read_text() + html.read_text()  # never in a command
    remote = json.loads(out.read_text())
    assert remote["log"] == url and remote["verification"]["ok"] is True
    local = tmp_path / "local.json"
    directory = ["report", str(served.log), "--key", served.vkey, "--origin", ORIGIN]
    assert run_audit([*directory, "--json", str(local)]) == 0
    assert served.size() == size  # nothing logged in between: both saw the same log
    mirrored = json.loads(local.read_text())
    assert remote["totals"] == mirrored["totals"]
    # the records' figures; tlog-tiles serves no checkpoint history and no cosigned/
    for name in set(mirrored["figures"]) - {"checkpoints", "cosignatures"}:
        figure = mirrored["figures"][name]
        assert remote["figures"][name]["counts"] == figure["counts"], name
        commands = [c.replace(str(served.log), url) for c in figure["commands"]]
        assert remote["figures"][name]["commands"] == commands, name
    assert html.read_text().startswith("<!DOCTYPE html>")
    assert run_audit(["report", url, "--key", served.vkey, "--json", str(out)]) == 2  # no token


def test_the_live_report_of_a_log_whose_key_was_rotated(tmp_path: Path) -> None:
    # docs/provenance.md, "Keys": once the rotation is done the gateway loads only the new
    # key; the log's first checkpoints carry only the retired one. The live report said
    # "VERIFICATION FAILED" for that honest log (no signature by a trusted key).
    retired = seeded_signer(ORIGIN, 7)

    async def before_the_rotation() -> None:
        log = await ProvenanceLog.open(tmp_path / "log", ORIGIN, retired)
        await log_request(log, 0)
        await log.close()

    asyncio.run(before_the_rotation())
    # step 3 of the rotation: the old verifier key listed as retired (the log's newest
    # checkpoint is its alone, and the gateway opens a log only from one of its keys)
    with serve_admin(tmp_path, provenance={"retired_verifier_keys": [retired.vkey]}) as served:
        assert served.chat().status_code == 200
        served.wait_for_size(4)
        report = served.get("/admin/v1/log/report?format=json", "auditor").json()
    verification = report["verification"]
    assert verification["ok"] is True, verification
    assert verification["summary"]["earlier_checkpoints"] >= 1
    assert "--accept-earlier-keys" in verification["command"]
