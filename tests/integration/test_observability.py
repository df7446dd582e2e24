"""deploy/observability/: the Grafana dashboard and the Prometheus alert rules.

Every metric a dashboard panel, a dashboard variable or an alert rule reads must exist,
with samples, in a live gateway's `/metrics`: the gateway runs from a config file (so
config reloads are watched) in front of a simulated private backend, a dead private
one, a simulated hosted provider, with trust policies, the provenance log and a
witness, and serves requests that leave a sample in every family (a stream, a failed
attempt and its fallback, a refusal). The names come out of the PromQL by the tokenizer
in tests/helpers/promql.py. `promtool` (Debian's `prometheus` package, marker
`deploy_tools`) checks the rules file and runs its unit tests (alerts.test.yml).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import create_app
from gateway.config import load_config
from gateway.provenance import load_signer, write_signing_key
from gateway.provenance.formats.cosignature import Cosigner
from gateway.provenance.testing import seeded_signer
from gateway.provenance.witness.app import create_witness_app
from gateway.provenance.witness.witness import Witness
from gateway.serving import ServerThread
from gateway.tenants import hash_api_key
from tests.helpers.gateways import (
    ADMIN,
    ADMIN_HEADERS,
    EU_ZERO,
    HOSTED_ONLY_POLICY,
    TENANT_KEY,
    Sim,
    backend,
    hosted_backend,
)
from tests.helpers.net import free_port
from tests.helpers.paths import REPO_ROOT
from tests.helpers.prerequisites import promtool
from tests.helpers.promql import metric_names, variable_query_names
from tests.helpers.waiting import until

OBSERVABILITY = REPO_ROOT / "deploy" / "observability"
DASHBOARD = OBSERVABILITY / "grafana-dashboard.json"
ALERTS = OBSERVABILITY / "alerts.yml"
ALERT_TESTS = OBSERVABILITY / "alerts.test.yml"
ORIGIN = "gateway.example/log/observability"
WITNESS = Cosigner(seeded_signer("witness.example/observability"))
# What each `# TYPE` allows a PromQL expression to read, by the sample name's suffix.
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


# --- what the dashboard and the rules read ---------------------------------------------------


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))  # a collapsed row holds its panels


def dashboard_reads() -> dict[str, set[str]]:
    """Metric names by where the dashboard reads them (panel title, variable name)."""
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    reads: dict[str, set[str]] = {}
    for panel in _panels(dashboard["panels"]):
        for target in panel.get("targets", []):
            where = f"panel {panel['title']!r} target {target['refId']}"
            reads[where] = metric_names(target["expr"])
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            text = query["query"] if isinstance(query, dict) else query
            reads[f"variable ${variable['name']}"] = variable_query_names(text)
    return reads


def rule_reads() -> dict[str, set[str]]:
    """Metric names by the alert (or recording rule) whose expression reads them."""
    rules = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    return {
        f"rule {rule.get('alert') or rule['record']}": metric_names(rule["expr"])
        for group in rules["groups"]
        for rule in group["rules"]
    }


def exposition_names(text: str) -> dict[str, str]:
    """Each sample name with at least one sample in `text`, to its family's type."""
    names: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            names[sample.name] = family.type
    return names


def unknown(reads: dict[str, set[str]], exposed: dict[str, str]) -> list[str]:
    """Each name read that the exposition lacks, or reads with a suffix its type does not
    have (a counter's `_bucket`, a histogram without `_bucket`/`_sum`/`_count`)."""
    problems = []
    for where, names in sorted(reads.items()):
        for name in sorted(names):
            kind = exposed.get(name)
            if kind is None:
                problems.append(f"{where}: {name} is not in /metrics")
            elif kind in SUFFIXES and not any(name.endswith(s) for s in SUFFIXES[kind]):
                problems.append(f"{where}: {name} is a {kind} sample name it does not read")
    return problems


# --- a live gateway ----------------------------------------------------------------------------


@pytest.fixture
def witness_url(tmp_path: Path) -> Iterator[str]:
    """A witness that cosigns the test log's checkpoints (the log key is written here)."""
    write_signing_key(tmp_path / "log.key", ORIGIN)
    log_verifier = load_signer(tmp_path / "log.key").verifier()
    witness = Witness.open(tmp_path / "witness.db", WITNESS, [log_verifier], new=True)
    server = ServerThread(create_witness_app(witness)).start()
    yield server.url
    server.stop()
    witness.close()


@pytest.fixture
def live_metrics(start_sim: Callable[..., Sim], tmp_path: Path, witness_url: str) -> Iterator[str]:
    """The `/metrics` text of a gateway that has served a request of every kind."""
    private = start_sim("vllm", models=("m",), zero_latency=True)
    hosted = start_sim("vllm", models=("f",), zero_latency=True)
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "obs.yaml").write_text(HOSTED_ONLY_POLICY)
    settings = {
        "logging": {"format": "json", "level": "warning", "access_log": False},
        "backends": [
            backend("gpu", private.url, "m", **EU_ZERO, capacity={"max_concurrency": 4}),
            # Not probed (kind openai): a request for `f` tries it, fails, falls back.
            backend("dead", f"http://127.0.0.1:{free_port()}", "f", kind="openai", **EU_ZERO),
            hosted_backend("hosted", f"{hosted.url}/v1", "f"),
        ],
        "tenants": [{"id": "acme", "api_key_hashes": [hash_api_key(TENANT_KEY)], "models": ["*"]}],
        "admin": ADMIN,
        "policy": {"paths": ["policies"]},
        "provenance": {
            "dir": "log",
            "origin": ORIGIN,
            "signing_key_file": "log.key",
            "checkpoint_interval_ms": 20,
            "witnesses": [{"url": witness_url, "vkey": WITNESS.vkey, "timeout_s": 2}],
        },
    }
    config_file = tmp_path / "gateway.yaml"
    config_file.write_text(yaml.safe_dump(settings))
    app = create_app(
        load_config(config_file),
        environ={"HOSTED_KEY": "test-key"},
        config_dir=tmp_path,
        config_file=config_file,
    )
    server = ServerThread(app).start()
    try:
        yield _serve_and_scrape(server.url)
    finally:
        server.stop()


def _serve_and_scrape(url: str) -> str:
    headers = {"authorization": f"Bearer {TENANT_KEY}"}

    def chat(model: str, **extra: Any) -> httpx.Response:
        body = {"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
        return httpx.post(
            f"{url}/v1/chat/completions", json={**body, **extra}, headers=headers, timeout=30
        )

    assert chat("m").status_code == 200
    assert chat("m", stream=True).status_code == 200  # time to first token
    assert chat("f").status_code == 200  # `dead` fails (upstream error), `hosted` serves
    headers["x-data-class"] = "undeclared"
    assert chat("m").json()["error"]["code"] == "unknown_data_class"  # a policy refusal

    def scrape() -> str:
        return httpx.get(f"{url}/metrics", headers=ADMIN_HEADERS, timeout=10).text

    names = ("owngate_witness_cosigned_size", "owngate_provenance_checkpoint_size")
    until(
        lambda: all(n in exposition_names(scrape()) for n in names),
        "a cosigned checkpoint in /metrics",
        timeout=20,
        interval=0.05,
    )
    return scrape()


def test_every_metric_the_dashboard_and_the_rules_read_is_exported(live_metrics: str) -> None:
    exposed = exposition_names(live_metrics)
    reads = {**dashboard_reads(), **rule_reads()}
    assert all(reads.values()), [where for where, names in reads.items() if not names]
    assert unknown(reads, exposed) == []
    # The check itself: a made-up name, and a real metric read with a suffix it lacks.
    made_up = {"panel 'made up'": metric_names("rate(owngate_made_up_total[5m])")}
    wrong_suffix = {"rule Wrong": metric_names("histogram_quantile(0.9, owngate_requests_bucket)")}
    assert len(unknown({**made_up, **wrong_suffix}, exposed)) == 2
    assert unknown({"rule": {"owngate_requests"}}, exposed) == [
        "rule: owngate_requests is not in /metrics"  # a counter is read as `..._total`
    ]


def test_the_dashboard_and_the_rules_cover_what_the_issue_names() -> None:
    """Backend down, breaker open, fallback rate, policy reload failures, provenance not
    ready, witness lagging, Redis degraded, a hosted backend failing before it sends; and
    the dashboard's panels."""
    alerts = {where.removeprefix("rule "): names for where, names in rule_reads().items()}
    assert {
        "OwngateBackendDown": "owngate_backend_up",
        "OwngateBreakerOpen": "owngate_backend_breaker_state",
        "OwngateHighFallbackRate": "owngate_fallbacks_total",
        "OwngatePolicyReloadFailed": "owngate_policy_reload_failures_total",
        # A replica or worker left on an older set (its reload failed, a narrowing unmet).
        "OwngatePolicySetsDiffer": "owngate_policy_info",
        "OwngateProvenanceNotReady": "owngate_provenance_ready",
        "OwngateWitnessLagging": "owngate_witness_cosigned_size",
        "OwngateRedisDegraded": "owngate_state_healthy",
        "OwngateHostedFailsBeforeSending": "owngate_hosted_attempts_total",
    }.items() <= {(alert, name) for alert, names in alerts.items() for name in names}
    dashboard = set().union(*dashboard_reads().values())
    assert {
        "owngate_backend_waiting",
        "owngate_backend_inflight",
        "owngate_time_to_first_token_seconds_bucket",
        "owngate_requests_total",
        "owngate_backend_breaker_state",
        "owngate_fallbacks_total",
        "owngate_policy_refusals_total",
        "owngate_provenance_ready",
        "owngate_provenance_entries",
        "owngate_witness_cosigned_size",
        "owngate_state_healthy",
    } <= dashboard
    panels = list(_panels(json.loads(DASHBOARD.read_text(encoding="utf-8"))["panels"]))
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids))
    # Every query goes to the data source the importer picks (the `datasource` variable).
    sources = {t["datasource"]["uid"] for panel in panels for t in panel.get("targets", [])}
    assert sources == {"${datasource}"}
    rules = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    for group in rules["groups"]:
        for rule in group["rules"]:
            assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
            assert {"summary", "description", "runbook"} <= rule["annotations"].keys()


@pytest.mark.deploy_tools
def test_promtool_checks_the_rules_and_runs_their_unit_tests() -> None:
    binary = promtool()
    for argv in (
        [binary, "check", "rules", ALERTS.name],
        [binary, "test", "rules", ALERT_TESTS.name],
    ):
        done = subprocess.run(
            argv, cwd=OBSERVABILITY, capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.deploy_tools
def test_promtool_lints_the_live_exposition(live_metrics: str) -> None:
    """`/metrics` after a request of every kind is an exposition Prometheus takes as it
    is: `promtool check metrics` (Prometheus's own parser and lint) finds nothing."""
    done = subprocess.run(
        [promtool(), "check", "metrics"],
        input=live_metrics,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0 and not done.stdout.strip(), done.stdout + done.stderr
