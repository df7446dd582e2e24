"""`owngate audit report`: numbers equal to counts of the records, a safe self-contained page.

The log is written through the real writer: requests over several minutes, a retried
request (two dispatches, one request id), hosted fallbacks, refusals by two rules,
tenants, backend ids and rules holding markup and quotes, and a checkpoint cosigned by a
witness. The test counts the records itself and compares them with the JSON report.
"""

from __future__ import annotations

import asyncio
import calendar
import dataclasses
import json
import shutil
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from gateway.provenance import ProvenanceLog, verify_log
from gateway.provenance.audit import report as report_module
from gateway.provenance.audit.report import Invocation, audit_report, bucket_seconds
from gateway.provenance.audit.report_html import render_html
from gateway.provenance.formats.cosignature import Cosigner
from gateway.provenance.formats.layout import cosigned_path
from gateway.provenance.formats.records import (
    BackendRef,
    Retention,
    TraceStep,
    admin_record,
    refusal_record,
)
from gateway.provenance.testing import (
    EXAMPLE_HOSTED,
    EXAMPLE_POLICY,
    log_request,
    seeded_signer,
)
from tests.helpers.provenance import records, run_audit

ORIGIN = "gateway.example/log/report"
SIGNER = seeded_signer(ORIGIN)
WITNESS = Cosigner(seeded_signer("witness.example/w1"))
EVIL_TENANT = "<script>alert('t')</script>\"&"
EVIL_RULE = 'deny"><script>alert(1)</script>'
EVIL_BACKEND = BackendRef(
    "evil<b>\"'", "private", "vllm", "acme", "acme", "eu<i>", Retention(0, True, False)
)
COSIGNED_AT = 1767225700  # 2026-01-01T00:01:40Z


async def _refuse(log: ProvenanceLog, number: int, rule: str, tenant: str) -> None:
    await log.append(
        refusal_record(
            request_id=f"req-{number}",
            time=datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=number),
            tenant=tenant,
            model="gpt-4o",
            policy=EXAMPLE_POLICY,
            trace=[TraceStep(EXAMPLE_HOSTED.id, "excluded", rule)],
            rule=rule,
            reason="policy_denied",
            request_commitment=None,
        )
    )


@pytest.fixture(scope="module")
def logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("log")

    async def build() -> None:
        log = await ProvenanceLog.open(path, ORIGIN, SIGNER)
        for n in range(5):
            await log_request(log, n)
        await log_request(log, 3)  # a retry: a second dispatch of req-3
        await log_request(log, 70, backend=EXAMPLE_HOSTED, fallback_reason="private_saturated")
        await log_request(log, 95, tenant=EVIL_TENANT, backend=EVIL_BACKEND)
        await _refuse(log, 100, "hosted.deny", "acme-app")
        await log.append(  # an admin action (the admin API's): no request, no tenant
            admin_record(
                request_id="adm_1",
                time=datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=110),
                role="operator",
                token="0123456789ab",
                action="reload",
                subject="config",
                change_digest="0" * 64,
                outcome="done",
            )
        )
        signed = await log.checkpoint()
        cosigned = cosigned_path(path, signed.checkpoint.size)
        cosigned.parent.mkdir()
        line = WITNESS.cosign(signed.checkpoint.text(), COSIGNED_AT).line()
        cosigned.write_bytes(signed.note + line.encode())
        await _refuse(log, 130, EVIL_RULE, EVIL_TENANT)
        await log_request(log, 400, backend=EXAMPLE_HOSTED, fallback_reason="private_down")
        await log.close()

    asyncio.run(build())
    return path


def _report(logdir: Path, **kwargs: Any) -> dict[str, Any]:
    run = Invocation(str(logdir), ("--key", SIGNER.vkey))
    return audit_report(logdir, [SIGNER.verifier()], run, now=time.time(), **kwargs)


def _seconds(moment: str) -> int:
    return calendar.timegm(time.strptime(moment[:19], "%Y-%m-%dT%H:%M:%S"))


def _bucketed(found: list[tuple[str, str]], width: int) -> list[dict[str, Any]]:
    """{key, bucket, count} rows for (key, record time) pairs, counted here."""
    tally = Counter(
        (key, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(_seconds(t) - _seconds(t) % width)))
        for key, t in found
    )
    return [{"key": k, "bucket": b, "count": n} for (k, b), n in sorted(tally.items())]


def test_the_numbers_are_the_counts_of_the_records(logdir: Path) -> None:
    report = _report(logdir, witnesses=[WITNESS.verifier()])
    assert report["verification"]["ok"] is True
    logged = records(logdir)
    dispatches = [r for r in logged if r["type"] == "dispatch"]
    refusals = [r for r in logged if r["type"] == "refusal"]
    completions = [r for r in logged if r["type"] == "completion"]
    assert [r for r in logged if r["type"] == "admin"]  # counted as an entry, not a request
    first: dict[str, dict[str, Any]] = {}
    for record in logged:
        if record["type"] in ("dispatch", "refusal"):
            first.setdefault(record["request_id"], record)
    totals = report["totals"]
    assert totals["completions"] == len(completions)
    assert totals["entries"] == len(logged) == report["verification"]["summary"]["size"]
    assert (totals["dispatches"], totals["refusals"], totals["requests"]) == (
        len(dispatches),
        len(refusals),
        len(first),
    )
    assert totals["requests"] == len(dispatches) + len(refusals) - 1  # the retry
    width = totals["bucket_seconds"]
    assert width == bucket_seconds(_seconds(logged[0]["time"]), _seconds(logged[-1]["time"]))
    assert width == 10  # 400 s in at most 60 buckets
    figures = report["figures"]
    expected = {
        "dispatches_by_backend": [(r["backend"]["id"], r["time"]) for r in dispatches],
        "dispatches_by_region": [(r["backend"]["region"], r["time"]) for r in dispatches],
        "dispatches_by_data_class": [("(not recorded)", r["time"]) for r in dispatches],
        "requests_by_tenant": [(r["tenant"], r["time"]) for r in first.values()],
        "fallbacks_by_reason": [(r["fallback"], r["time"]) for r in dispatches if r["fallback"]],
        "refusals_by_rule": [(r["rule"], r["time"]) for r in refusals],
    }
    for name, found in expected.items():
        assert figures[name]["counts"] == _bucketed(found, width), name
        assert figures[name]["totals"] == dict(Counter(key for key, _ in found)), name
    assert figures["dispatches_by_backend"]["totals"]["vllm-eu-1"] == 6
    fallbacks = {r["key"]: (r["count"], r["rate"]) for r in figures["fallbacks_by_reason"]["rates"]}
    assert fallbacks == {
        "private_down": (1, 1 / len(dispatches)),
        "private_saturated": (1, 1 / len(dispatches)),
    }
    rules = {r["key"]: (r["count"], r["rate"]) for r in figures["refusals_by_rule"]["rates"]}
    assert rules == {EVIL_RULE: (1, 1 / len(first)), "hosted.deny": (1, 1 / len(first))}
    history = sorted(int(p.name) for p in (logdir / "checkpoints").iterdir())
    assert [p["size"] for p in figures["checkpoints"]["points"]] == history
    assert figures["checkpoints"]["points"][-1]["time"] == logged[-1]["time"]
    cosigned = figures["cosignatures"]
    size = int(next((logdir / "cosigned").iterdir()).name)
    assert cosigned["points"] == [
        {"size": size, "witness": str(WITNESS), "time": "2026-01-01T00:01:40Z"}
    ]
    assert cosigned["newest_by"] == {str(WITNESS): size}
    assert (cosigned["files"], cosigned["checked"]) == (1, True)
    unchecked = _report(logdir)["figures"]["cosignatures"]
    assert (unchecked["files"], unchecked["checked"], unchecked["points"]) == (1, False, [])


class _Page(HTMLParser):
    """Tags, attributes and text of a page; fails on tags closed out of order."""

    VOID = frozenset({"meta", "br", "hr", "img", "input", "link"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.open: list[str] = []
        self.tags: Counter[str] = Counter()
        self.attributes: list[tuple[str, str | None]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags[tag] += 1
        self.attributes.extend(attrs)
        if tag not in self.VOID:
            self.open.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags[tag] += 1
        self.attributes.extend(attrs)

    def handle_endtag(self, tag: str) -> None:
        assert self.open and self.open[-1] == tag, f"</{tag}> closes {self.open[-1:]}"
        self.open.pop()

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def _parse(page: str) -> _Page:
    parser = _Page()
    parser.feed(page)
    parser.close()
    assert parser.open == [], f"unclosed: {parser.open}"
    return parser


def test_the_page_is_self_contained_well_formed_and_escapes_the_log(logdir: Path) -> None:
    report = _report(logdir, witnesses=[WITNESS.verifier()])
    page = render_html(report)
    parsed = _parse(page)
    assert parsed.tags["script"] == 0 and "<script" not in page
    for name, value in parsed.attributes:
        assert name not in ("src", "href", "xlink:href"), (name, value)
        assert "http" not in (value or ""), (name, value)
    assert parsed.tags["svg"] == 8  # six time series, checkpoints, cosignatures
    assert parsed.tags["rect"] > 0 and parsed.tags["circle"] > 0
    text = "".join(parsed.text)
    for value in (EVIL_TENANT, EVIL_RULE, EVIL_BACKEND.id, EVIL_BACKEND.region):
        assert value in text  # shown, as text
    assert "&lt;script&gt;alert(&#x27;t&#x27;)&lt;/script&gt;&quot;&amp;" in page
    assert "deny&quot;&gt;&lt;script&gt;" in page
    for figure in report["figures"].values():
        for command in figure["commands"]:
            assert command in text  # every reproduce command, verbatim
    assert "VERIFIED" in text and "FAILED" not in text


def test_a_tampered_log_gets_a_failed_report_and_exit_1(
    logdir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(logdir, copy, ignore=shutil.ignore_patterns(".lock"))
    bundle = copy / "tile" / "entries" / "000.p" / f"{len(records(logdir))}"
    data = bundle.read_bytes()
    bundle.write_bytes(data.replace(b"private_saturated", b"private_saturatee"))
    out_html, out_json = tmp_path / "report.html", tmp_path / "report.json"
    argv = ["report", str(copy), "--key", SIGNER.vkey]
    assert run_audit([*argv, "--html", str(out_html), "--json", str(out_json)]) == 1
    assert "FAILED" in capsys.readouterr().err
    report = json.loads(out_json.read_text())
    verification = report["verification"]
    assert verification["ok"] is False and verification["index"] is not None
    assert "does not hash to its leaf" in verification["error"]
    assert report["totals"] is None and report["figures"] == {}
    page = out_html.read_text()
    parsed = _parse(page)
    assert parsed.tags["svg"] == 0
    text = "".join(parsed.text)
    assert "VERIFICATION FAILED" in text and "VERIFIED" not in text
    assert page.index("VERIFICATION FAILED") < page.index(verification["error"][:20])
    assert "<title>FAILED" in page


def test_entries_that_no_longer_hash_to_the_verified_root_fail(
    logdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The entries are read twice (verify_log, then the figures): a log that changes in
    between is a failure, not a report of whatever the second read found."""
    verified = verify_log(logdir, [SIGNER.verifier()])
    other = dataclasses.replace(verified, root=bytes(32))
    monkeypatch.setattr(report_module, "verify_log", lambda *_a, **_k: other)
    report = _report(logdir)
    assert report["verification"]["ok"] is False and report["figures"] == {}
    assert "changed while the report read it" in report["verification"]["error"]


def test_a_log_of_several_bundles_spans_hours(tmp_path: Path) -> None:
    async def build() -> None:
        log = await ProvenanceLog.open(tmp_path, ORIGIN, SIGNER)
        for n in range(0, 300 * 60, 60):  # 300 requests, one a minute: 600 entries
            await log_request(log, n, tenant=f"t{n % 7}")
        await log.close()

    asyncio.run(build())
    report = _report(tmp_path)
    totals = report["totals"]
    assert (totals["entries"], totals["requests"], totals["dispatches"]) == (600, 300, 300)
    assert totals["bucket_seconds"] == 300  # 299 minutes: 60 buckets of 5 minutes
    by_tenant = report["figures"]["requests_by_tenant"]
    assert by_tenant["totals"] == dict(Counter(f"t{n % 7}" for n in range(0, 300 * 60, 60)))
    assert sum(row["count"] for row in by_tenant["counts"]) == 300
    assert _parse(render_html(report)).tags["svg"] == 5  # no fallback, refusal, witness


TEN_YEARS = 10 * 365 * 86400
BACK_TO_1970 = -calendar.timegm((2026, 1, 1, 0, 0, 0))  # 2026-01-01 -> 1970-01-01


def test_records_of_a_clock_that_stepped_get_wider_buckets_not_millions(tmp_path: Path) -> None:
    """The wall clock stepped 10 years forward and back to 1970 between the first and
    the last entry (5 s apart): the buckets widen to a week, so the page holds a few
    bars. Before, they were 1 s wide and the page made a list of 300 million empty ones
    (`MemoryError`, or gigabytes of the gateway's memory from `/admin/report.html`)."""
    moments = [0, TEN_YEARS, 2, BACK_TO_1970, 5]

    async def build() -> None:
        log = await ProvenanceLog.open(tmp_path, ORIGIN, SIGNER)
        for n in moments:
            await log_request(log, n)
        await log.close()

    asyncio.run(build())
    report = _report(tmp_path)
    totals = report["totals"]
    assert totals["bucket_seconds"] == 604800  # a multiple of the 1 s chosen from the ends
    logged = records(tmp_path)
    counts = report["figures"]["dispatches_by_backend"]["counts"]
    dispatches = [(r["backend"]["id"], r["time"]) for r in logged if r["type"] == "dispatch"]
    assert counts == _bucketed(dispatches, 604800)  # exact: what the jq command counts
    assert len(counts) == 3 and sum(row["count"] for row in counts) == len(moments)
    page = render_html(report)
    assert len(page) < 200_000
    # 3 buckets: the backend, region, data class and tenant charts
    assert _parse(page).tags["rect"] == 3 * 4


def test_the_cli_writes_both_and_refuses_no_output(
    logdir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_html, out_json = tmp_path / "r.html", tmp_path / "r.json"
    argv = ["report", str(logdir), "--key", SIGNER.vkey, "--witness-key", WITNESS.vkey]
    assert run_audit([*argv, "--html", str(out_html), "--json", str(out_json)]) == 0
    report = json.loads(out_json.read_text())
    assert report["format"] == "owngate-audit-report/1"
    assert report["verification"]["summary"]["witnesses"]["witnessed_size"] > 0
    assert "--witness-key" in report["verification"]["command"]
    assert "<svg" in out_html.read_text()
    capsys.readouterr()
    assert run_audit([*argv[:4], "--json", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["totals"] == report["totals"]
    assert run_audit(argv) == 2
