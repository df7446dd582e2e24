"""The web console (gateway/admin/console/) in a real browser: Debian's headless chromium
driven by selenium against a real `owngate serve` with simulated backends and its admin
listener, one token per role. For each role: log in, its page shows live data from the
gateway, a page of another role shows 403 and the role it needs, hostile text stays
text, and the browser's console log has no error; the API page (the interactive docs)
documents and calls every operation. A screenshot per page is kept
(tests/helpers/browser.py `artifacts_dir`). One browser and one gateway for the module;
each test logs in with its role on a freshly loaded page, so none leans on the page an
earlier test left behind."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium.webdriver.common.by import By

from gateway.provenance import load_signer, write_signing_key
from gateway.provenance.witness.app import create_witness_app
from gateway.provenance.witness.witness import Witness
from gateway.serving import ServerThread
from gateway.sim import SimSettings, create_sim_app
from gateway.tenants import hash_api_key
from tests.helpers.admin import ORIGIN, TOKENS, WITNESS
from tests.helpers.browser import Console, chromium, quit_browser
from tests.helpers.net import free_port
from tests.helpers.processes import KEY, GatewayProcess
from tests.helpers.waiting import until

pytestmark = pytest.mark.browser

ROLES = ("operator", "security", "auditor")
POLICY = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: eu-only, version: "1"}
spec:
  tenants: [acme]
  residency: {allow: [eu]}
  retention: {max_days: 30}
  fallback: {mode: never}
"""
CASES = """\
apiVersion: policy.owngate.dev/v1
kind: PolicyTest
metadata: {id: eu-only-cases}
cases:
  - name: a model only a US backend serves is refused by the residency rule
    input: {tenant: acme, model: us}
    expect: {refusal: eu-only/residency}
"""
HOSTILE = '<img src=x onerror="window.__owned=1">'


class Served:
    def __init__(self, process: GatewayProcess, admin: str, log: Path) -> None:
        self.process = process
        self.admin = admin
        self.console = f"{admin}/console/"
        self.log = log
        self.receipts: list[str] = []  # the x-owngate-receipt headers the chats got
        self.logged = 0  # requests of tenant acme in the log

    def chat(self, model: str, key: str = KEY) -> httpx.Response:
        answer = httpx.post(
            f"{self.process.url}/v1/chat/completions",
            headers={"authorization": f"Bearer {key}"},
            json={"model": model, "messages": [{"role": "user", "content": "hi"}]},
            timeout=10,
        )
        if answer.status_code != 401:  # authenticated: served or refused, and logged
            self.logged += 1
        return answer

    def log_size(self) -> int:
        note = self.log / "checkpoint"
        return int(note.read_text().split("\n")[1]) if note.exists() else 0


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    directory = tmp_path_factory.mktemp("console")
    (directory / "policies" / "tests").mkdir(parents=True)
    (directory / "policies" / "eu.yaml").write_text(POLICY)
    (directory / "policies" / "tests" / "eu.yaml").write_text(CASES)
    with contextlib.ExitStack() as stack:
        sims = [
            stack.enter_context(ServerThread(create_sim_app(settings)))
            for settings in (
                SimSettings.for_kind("vllm", models=("m",)),
                SimSettings.for_kind("llamacpp", models=("m", "us")),
            )
        ]
        write_signing_key(directory / "log.key", ORIGIN)
        log_verifier = load_signer(directory / "log.key").verifier()
        witness = stack.enter_context(
            Witness.open(directory / "witness.db", WITNESS, [log_verifier], new=True)
        )
        witness_url = stack.enter_context(ServerThread(create_witness_app(witness))).url
        yield from _serve(directory, [sim.url for sim in sims], witness_url)


def _serve(directory: Path, sims: list[str], witness: str) -> Iterator[Served]:
    admin_port = free_port()
    config = {
        "listen": {"host": "127.0.0.1", "port": free_port()},
        "logging": {"format": "json", "level": "warning"},
        "backends": [
            _backend("gpu-vllm", "vllm", sims[0], ["m"], "eu-west-1"),
            _backend("cpu-llamacpp", "llamacpp", sims[1], ["m"], "eu-central-1"),
            _backend("us-east", "vllm", sims[1], ["us"], "us-east-1"),
        ],
        "tenants": [{"id": "acme", "api_key_hashes": [hash_api_key(KEY)], "models": ["*"]}],
        "keys_file": "keys.yaml",
        "policy": {"paths": ["policies"]},
        "provenance": {
            "dir": "log",
            "origin": ORIGIN,
            "signing_key_file": "log.key",
            "checkpoint_interval_ms": 20,
            "witnesses": [{"url": witness, "vkey": WITNESS.vkey, "timeout_s": 2}],
        },
        "admin": {
            "listen": {"host": "127.0.0.1", "port": admin_port},
            "tokens": [{"hash": hash_api_key(TOKENS[role]), "role": role} for role in ROLES],
        },
    }
    process = GatewayProcess(config, directory).start()
    served = Served(process, f"http://127.0.0.1:{admin_port}", directory / "log")
    try:
        for _ in range(4):
            answer = served.chat("m")
            assert answer.status_code == 200
            served.receipts.append(answer.headers["x-owngate-receipt"])
        # Refused: the policy keeps acme in the EU, and `us` is not in its `/v1/models`.
        assert served.chat("us").status_code == 404
        # 4 dispatch and 4 completion records, 1 refusal
        until(lambda: served.log_size() >= 9, "the log's checkpoint over the requests")
        yield served
    finally:
        code = process.stop()
    assert code == 0, process.output()


def _backend(id: str, kind: str, url: str, models: list[str], region: str) -> dict[str, object]:
    return {
        "id": id,
        "kind": kind,
        "base_url": url,
        "models": [{"name": m} for m in models],
        "region": region,
        "owner": "test",
        "retention": {"days": 0, "zero_data_retention": True},
    }


@pytest.fixture(scope="module")
def console(served: Served, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    downloads = tmp_path_factory.mktemp("downloads")
    driver = chromium(downloads)
    try:
        yield Console(driver, served.console, downloads)
    finally:
        quit_browser(driver)


@pytest.fixture(autouse=True)
def no_browser_errors(console: Console) -> Iterator[None]:
    """Every test ends with a clean browser console log: a script that throws, a module
    that fails to load or an asset the CSP refuses is a SEVERE entry there."""
    console.errors()  # what earlier tests left
    yield
    assert console.errors() == []


def test_the_operator_sees_the_live_backends_and_reloads(console: Console) -> None:
    console.login(TOKENS["operator"], "operator")
    for backend in ("gpu-vllm", "cpu-llamacpp", "us-east"):
        console.find(f'[data-backend="{backend}"]')
    console.wait_text("#page", lambda t: "ready" in t and "3 backends" in t, "the summary")
    console.wait_text(".chart h3", lambda t: t == "In-flight", "the in-flight chart")
    console.wait(
        lambda d: sum(
            int(e.text)
            for e in d.find_elements(By.CSS_SELECTOR, "[data-requests]")
            if e.text != "-"
        ),
        "the requests the backends served in the timeline's window",
    )
    # the charts grow as new samples come (polled with ?since=: only the newer ones)
    first = int(console.find("#backend-charts[data-samples]").get_attribute("data-samples") or 0)
    console.wait(
        lambda d: (
            int(d.find_element(By.ID, "backend-charts").get_attribute("data-samples")) > first
        ),
        "a newer sample added to the charts",
    )
    console.screenshot("operator")
    console.find("#action-drain").click()  # dismissed: nothing is done
    console.wait(lambda d: d.switch_to.alert, "the confirm dialog").dismiss()
    assert console.text("#action-result") == ""
    console.find("#action-reload").click()
    console.wait(lambda d: d.switch_to.alert, "the confirm dialog").accept()
    result = console.wait_text(
        '[data-action-result="reload"]', lambda t: "logged at index" in t, "the reload result"
    )
    assert int(result.split("logged at index ")[1].split(",")[0]) > 0
    console.screenshot("operator-reloaded")


def test_the_operator_is_refused_the_auditor_page(console: Console) -> None:
    console.login(TOKENS["operator"], "operator")
    console.go("auditor")
    text = console.wait_text('[data-forbidden="auditor"]', lambda t: "403" in t, "the 403 page")
    assert "needs the auditor role" in text
    console.screenshot("operator-on-auditor-403")


def test_the_security_page_shows_the_policy_and_explains(console: Console) -> None:
    console.login(TOKENS["security"], "security")
    console.find('[data-policy-id="owngate"]')  # the set (no PolicySet document: its default)
    explain(console, "acme", "us")
    trace = console.wait_text("#explain-result", lambda t: "us-east" in t, "the explain trace")
    assert "eu-only/residency" in trace, trace  # the rule that excluded it
    # tenants -> the policy binding each -> its rules, with the refusal counted on its rule
    assert console.text('[data-tenant-policy="acme"]') == "eu-only"
    console.wait_text(
        '[data-refusals="eu-only/residency"]', lambda t: t == "1", "the refusal on its rule"
    )
    console.find("#run-tests").click()
    summary = console.wait_text("#test-summary", lambda t: "1 of 1" in t, "the policy tests")
    assert summary.startswith("passed"), summary
    console.screenshot("security")


def test_the_security_role_creates_and_revokes_a_key(console: Console, served: Served) -> None:
    console.login(TOKENS["security"], "security")
    before = len(console.driver.find_elements(By.CSS_SELECTOR, "[data-key]"))
    console.find("#key-create button[type=submit]").click()
    key = console.wait_text("#new-key", lambda t: t.startswith("og-"), "the new key, shown once")
    assert "shown once" in console.text("#key-created")
    console.wait(
        lambda d: len(d.find_elements(By.CSS_SELECTOR, "[data-key]")) == before + 1,
        "the new key in the list",
    )
    assert served.chat("m", key).status_code == 200  # it works at once
    console.screenshot("security-key-created")
    console.find("#key-revoke button[type=submit]").click()  # the new key's digest is filled in
    console.wait(lambda d: d.switch_to.alert, "the confirm dialog").accept()
    console.wait_text("#key-created", lambda t: t.startswith("revoked"), "the revocation")
    assert served.chat("m", key).status_code == 401


def explain(console: Console, tenant: str, model: str) -> None:
    for field, value in (("#explain-tenant", tenant), ("#explain-model", model)):
        console.find(field).clear()
        console.find(field).send_keys(value)
    console.find("#explain-form button[type=submit]").click()


def test_hostile_text_shows_as_text(console: Console) -> None:
    """A model name (client-controlled, echoed in the decision and its errors) that is
    markup reaches the page as the text it is: no element is made, no handler runs."""
    console.login(TOKENS["security"], "security")
    explain(console, "acme", HOSTILE)
    console.wait_text("#explain-result", lambda t: HOSTILE in t, "the hostile model as text")
    assert console.driver.find_elements(By.CSS_SELECTOR, "#page img") == []
    assert console.driver.execute_script("return window.__owned") is None


def test_the_security_role_is_refused_the_operator_page(console: Console) -> None:
    console.login(TOKENS["security"], "security")
    console.go("operator")
    text = console.wait_text('[data-forbidden="operator"]', lambda t: "403" in t, "the 403 page")
    assert "needs the operator role" in text


def test_the_auditor_sees_the_log(console: Console, served: Served) -> None:
    console.login(TOKENS["auditor"], "auditor")
    size = console.wait_text("#log-size", lambda t: t.isdigit() and int(t) > 0, "the log size")
    assert int(size) <= served.log_size()
    # the witness cosigns every checkpoint: coverage reaches all of it
    console.wait_text("#witness-coverage", lambda t: t == "100.0%", "the witness coverage")
    assert "witness.example/admin-api" in console.text("[data-witnesses]")
    console.wait_text(".chart h3", lambda t: t == "Log size and checkpoints", "the log chart")
    console.screenshot("auditor")


def test_the_auditor_sees_where_requests_went_and_downloads_the_report(
    console: Console, served: Served
) -> None:
    console.login(TOKENS["auditor"], "auditor")
    tenants = console.wait_text('[data-breakdown="tenant"]', lambda t: "acme" in t, "per tenant")
    assert f"acme {served.logged}" in tenants
    regions = console.text('[data-breakdown="region"]')
    assert "eu-" in regions and "us-east-1" not in regions  # the policy kept acme in the EU
    console.screenshot("auditor-report")
    console.find("#report-download").click()
    report = console.downloads / "owngate-audit-report.html"
    console.wait(lambda d: report.exists() and report.stat().st_size > 0, "the downloaded report")
    assert report.read_text().lstrip().lower().startswith("<!doctype html")


def test_the_auditor_verifies_a_receipt(console: Console, served: Served) -> None:
    """The header as the client got it: which backend served it, its inclusion checked."""
    console.login(TOKENS["auditor"], "auditor")
    field = console.find("#receipt")
    field.send_keys(served.receipts[0])
    console.find("#receipt-form button[type=submit]").click()
    valid = console.wait_text("#receipt-valid", lambda t: t != "", "the verification")
    assert valid == "valid receipt", console.text("#receipt-result")
    assert console.text("#receipt-backend") in {"gpu-vllm", "cpu-llamacpp"}
    assert console.text("#receipt-inclusion").startswith("checked against checkpoint size")
    console.screenshot("auditor-receipt")
    field.clear()
    field.send_keys(served.receipts[1][:-8] + "AAAAAAA=")  # its signature altered
    console.find("#receipt-form button[type=submit]").click()
    console.wait_text("#receipt-valid", lambda t: t == "NOT valid", "the altered receipt refused")


def test_the_auditor_is_refused_the_security_page(console: Console) -> None:
    console.login(TOKENS["auditor"], "auditor")
    console.go("security")
    text = console.wait_text('[data-forbidden="security"]', lambda t: "403" in t, "the 403 page")
    assert "needs the security role" in text
    console.screenshot("auditor-on-security-403")


def operation(console: Console, name: str) -> str:
    """The CSS selector of the API page's block for `name` ("GET /path"), opened."""
    css = f'details[data-operation="{name}"]'
    console.find(f"{css} > summary").click()
    console.wait(lambda d: d.find_element(By.CSS_SELECTOR, css).get_attribute("open"), name)
    return css


def test_the_api_page_documents_every_operation_and_tries_them(
    console: Console, served: Served
) -> None:
    """The interactive docs, drawn from /openapi.json by the console's own scripts: every
    operation is there, its schemas resolved, and "try it" calls it with the token."""
    console.login(TOKENS["auditor"], "api")
    schema = httpx.get(f"{served.admin}/openapi.json", timeout=10).json()
    count = sum(len(item) for item in schema["paths"].values())
    console.find(f'[data-operations="{count}"]')
    whoami = operation(console, "GET /admin/v1/whoami")
    text = console.text(whoami)
    assert "any role" in text and "The caller's role and what it may use" in text
    assert "may" in console.text(f'{whoami} [data-response="200"]')  # WhoAmI, from its $ref
    console.find(f"{whoami} button[type=submit]").click()
    answer = console.wait_text(f"{whoami} [data-answer]", lambda t: t != "", "the answer")
    assert '"role": "auditor"' in answer, answer
    assert console.text(f"{whoami} [data-status]").startswith("200")
    console.screenshot("api-whoami")
    # a body prefilled from the schema (its required field), then sent as edited
    verify = operation(console, "POST /admin/v1/receipts/verify")
    body = console.find(f"{verify} textarea[data-body]")
    assert json.loads(body.get_attribute("value") or "") == {"receipt": {}}
    body.clear()
    body.send_keys(json.dumps({"receipt": served.receipts[0]}))
    console.find(f"{verify} button[type=submit]").click()
    answer = console.wait_text(f"{verify} [data-answer]", lambda t: t != "", "the verification")
    assert '"valid": true' in answer, answer
    console.screenshot("api-receipt-verify")


def test_docs_opens_the_api_page(console: Console, served: Served) -> None:
    console.login(TOKENS["security"], "security")
    assert console.find('#nav a[data-page="api"]').is_displayed()  # every role has it
    console.driver.get(f"{served.admin}/docs")
    console.find('#page[data-page="api"] [data-operation="GET /admin/v1/keys"]')
    assert console.driver.current_url == served.console + "#api"


def test_the_api_page_asks_before_a_change_and_shows_refusals(console: Console) -> None:
    console.login(TOKENS["operator"], "api")
    drain = operation(console, "POST /admin/v1/drain")
    console.find(f"{drain} button[type=submit]").click()
    console.wait(lambda d: d.switch_to.alert, "the confirm dialog").dismiss()
    assert console.text(f"{drain} .try-result") == ""  # nothing sent
    # a path parameter that would make another path is refused before anything is sent
    records = operation(console, "GET /admin/v1/log/requests/{request_id}")
    console.find(f'{records} input[data-param="request_id"]').send_keys("..")
    console.find(f"{records} button[type=submit]").click()
    console.wait_text(f"{records} .try-result", lambda t: "needs a value" in t, "the refusal")
    # an operation of another role: the API's 403 shown as it answered
    cosignatures = operation(console, "GET /admin/v1/log/cosignatures")
    console.find(f"{cosignatures} button[type=submit]").click()
    answer = console.wait_text(f"{cosignatures} [data-answer]", lambda t: t != "", "the 403")
    assert '"code": "permission_denied"' in answer, answer
    assert console.text(f"{cosignatures} [data-status]").startswith("403")
    console.screenshot("api-operator-refused")
    # the browser logs the 403 it fetched, and nothing else
    entries: list[dict[str, Any]] = []

    def logged(driver: Any) -> list[dict[str, Any]]:
        entries.extend(console.errors())  # each call returns the entries since the last
        return entries

    console.wait(logged, "the 403 in the browser's log")
    assert all("403" in entry["message"] for entry in entries), entries


def test_a_script_error_is_caught(console: Console) -> None:
    """The clean-log check above can fail: a script error on the page is a SEVERE entry."""
    console.driver.execute_script("setTimeout(() => { throw new Error('broken page'); }, 0)")
    entries = console.wait(lambda d: console.errors(), "the script error in the log")
    assert any("broken page" in entry["message"] for entry in entries)
