"""`owngate demo` starts, prints a working key and snippet and the admin API with a token
per role, serves, and stops on Ctrl-C. Its private backends sit behind mutual-TLS `owngate
attest` sidecars: every receipt it hands out for them, and its whole log, verify as
two-party statements with the commands the banner prints."""

from __future__ import annotations

import base64
import json
import os
import queue
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.helpers.doc_recipes import provenance_recipes
from tests.helpers.dropped_sockets import dropped_sockets
from tests.helpers.provenance import run_audit
from tests.helpers.waiting import until

PRIVATE = ("gpu-vllm", "cpu-llamacpp")


@pytest.fixture(autouse=True)
def _no_socket_dropped_open() -> Iterator[None]:
    """Each test closes the clients it opened: one left open in a cycle (an SDK client)
    was found by a later test's garbage collection, which failed in its stead."""
    with dropped_sockets() as dropped:
        yield
    assert not dropped, f"sockets left open: {dropped}"


def _demo_in(cwd: Path) -> subprocess.Popen[str]:
    """`owngate demo` on a free port, run in `cwd` (where it writes its logs)."""
    return subprocess.Popen(
        [sys.executable, "-m", "gateway", "demo", "--port", "0"],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _read_banner(proc: subprocess.Popen[str], timeout: float = 30.0) -> str:
    assert proc.stdout is not None
    lines: queue.Queue[str] = queue.Queue()
    stdout = proc.stdout

    def pump() -> None:
        for line in stdout:
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    text = ""
    deadline = time.monotonic() + timeout
    while "Ctrl-C stops everything" not in text and time.monotonic() < deadline:
        try:
            text += lines.get(timeout=0.5)
        except queue.Empty:
            if proc.poll() is not None:
                break
    return text


def test_demo_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "demo", "--port", "0"],
        # the demo sets a placeholder OPENAI_API_KEY for its own gateway only
        env={k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        banner = _read_banner(proc)
        url = re.search(r"running at (http://\S+)", banner)
        key = re.search(r"demo API key \(shown once\):\s+(og-\S+)", banner)
        eu_key = re.search(r"EU tenant key \(shown once\):\s+(og-\S+)", banner)
        assert url and key and eu_key, banner
        assert "curl -s" in banner and "from openai import OpenAI" in banner
        receipts: list[bytes] = []  # every receipt the demo handed out
        hello: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Hello!"}]
        # Closed as the block ends: an SDK client is a reference cycle, so one left open
        # kept its keep-alive socket until a later garbage collection, which found it
        # unclosed (a ResourceWarning in whichever test that was, or at session end).
        with openai.OpenAI(base_url=f"{url[1]}/v1", api_key=key[1], max_retries=0) as client:
            for _ in range(3):  # the router may pick either private backend
                raw = client.chat.completions.with_raw_response.create(
                    model="llama-3.1-8b", messages=hello
                )
                assert raw.parse().choices[0].message.content
                receipts.append(base64.b64decode(raw.headers["x-owngate-receipt"]))
            assert {m.id for m in client.models.list()} >= {"llama-3.1-8b", "gpt-4o-mini"}
            # Hosted only, and the demo tenant's policy allows it: served through LiteLLM.
            hosted = client.chat.completions.with_raw_response.create(
                model="gpt-4o-mini", messages=hello
            )
            assert hosted.parse().choices[0].message.content
            receipts.append(base64.b64decode(hosted.headers["x-owngate-receipt"]))
        with openai.OpenAI(base_url=f"{url[1]}/v1", api_key=eu_key[1], max_retries=0) as eu:
            assert "gpt-4o-mini" not in {m.id for m in eu.models.list()}
            # Not among demo-eu's models: the 404 of one that does not exist (its refusal
            # record names the rule, docs/security.md "Routing internals are not public").
            with pytest.raises(openai.NotFoundError, match="does not exist") as no:
                eu.chat.completions.create(model="gpt-4o-mini", messages=hello)
            receipts.append(base64.b64decode(no.value.response.headers["x-owngate-receipt"]))
        receipts.append(base64.b64decode(reply_headers(url[1], key[1])["x-owngate-receipt"]))
        receipts.append(streamed_receipt(url[1], key[1]))
        # The private answers' receipts, as handed out and as fetched again later.
        exchanges = [private_exchange(url[1], key[1], stream) for stream in (False, True) * 2]
        check_admin_api(banner)
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    audit = re.search(r"owngate audit verify (/\S+) --key (\S+)", banner)
    assert audit, banner
    backend_keys = sorted(set(re.findall(r"--backend-key (\S+)", banner)))
    attest_logs = re.findall(r"--attest-log (\S+)", banner)
    assert [k.split("=")[0] for k in backend_keys] == sorted(PRIVATE), banner
    assert sorted(a.split("=")[0] for a in attest_logs) == sorted(PRIVATE), banner
    two_party = [arg for k in backend_keys for arg in ("--backend-key", k)]
    served = check_receipts(tmp_path, receipts, audit[1], audit[2], two_party, capsys)
    assert "openai" in served and served & set(PRIVATE), served
    verified = subprocess.run(
        [sys.executable, "-m", "gateway", "audit", "verify", audit[1], "--key", audit[2]]
        + two_party
        + [arg for a in attest_logs for arg in ("--attest-log", a)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert verified.returncode == 0, verified.stdout + verified.stderr
    check_two_party(tmp_path, exchanges, audit[1], audit[2], backend_keys, capsys)
    for backend in served & set(PRIVATE):
        assert re.search(
            rf"backend {backend}: \d+ answer\(s\) countersigned by its key; its sidecar's log "
            r"\(\d+ entries\) agrees",
            verified.stdout,
        ), verified.stdout


def check_receipts(
    tmp_path: Path,
    receipts: list[bytes],
    log: str,
    key: str,
    backend_keys: list[str],
    capsys: pytest.CaptureFixture[str],
) -> set[str]:
    """Every receipt verifies against the log; each one for a private backend as a
    two-party statement (countersigned by that backend's sidecar key), the hosted one's
    and the refusal's as the gateway's alone. The backends the receipts name."""
    named: set[str] = set()
    for number, receipt in enumerate(receipts):
        path = tmp_path / f"{number}.receipt"
        path.write_bytes(receipt)
        capsys.readouterr()
        assert (
            run_audit(["receipt", "verify", str(path), "--key", key, "--log", log, *backend_keys])
            == 0
        )
        out = capsys.readouterr().out
        backend = re.search(r"dispatch entry \d+ to backend (\S+),", out)
        if backend is None:
            assert "refusal entry" in out, out
            continue
        named.add(backend[1])
        countersigned = f"ok: countersigned by backend {backend[1]}'s key" in out
        assert countersigned == (backend[1] in PRIVATE), out
    return named


@dataclass(frozen=True)
class Exchange:
    """A private answer as the client has it: the bytes it sent and received, the receipt
    it was handed (the header, or a stream's final comment) and the one it fetched again
    from `GET /v1/provenance/receipts/{id}` once its completion was recorded."""

    request: bytes
    response: bytes
    handed: bytes
    fetched: bytes


def private_exchange(url: str, key: str, stream: bool) -> Exchange:
    body = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "hi"}]}
    headers = {"authorization": f"Bearer {key}"}
    answer = httpx.post(
        f"{url}/v1/chat/completions",
        headers=headers,
        json={**body, "stream": stream},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    if stream:
        received, _, line = answer.content.partition(b": owngate-receipt ")
        handed = base64.b64decode(line.strip())
    else:
        received, handed = answer.content, base64.b64decode(answer.headers["x-owngate-receipt"])
    fetched: list[bytes] = []

    def countersigned() -> bool:  # once the completion that accepted it is recorded
        got = httpx.get(
            f"{url}/v1/provenance/receipts/{answer.headers['x-request-id']}",
            headers=headers,
            timeout=10,
        )
        fetched[:] = [got.content]
        return got.status_code == 200 and "attestation" in json.loads(got.content)

    until(countersigned, "the fetched receipt carries the countersignature")
    return Exchange(answer.request.content, received, handed, fetched[0])


def check_two_party(
    tmp_path: Path,
    exchanges: list[Exchange],
    log: str,
    key: str,
    backend_keys: list[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Each private answer's receipts, handed out and fetched, verify as the backend's
    statement over exactly the bytes the client sent and received: with `owngate audit
    receipt verify` and with docs/provenance.md's independent recipe (public keys only)."""
    verify = provenance_recipes()["verify_countersignature"]
    vkeys = dict(k.split("=", 1) for k in backend_keys)
    flags = [arg for k in backend_keys for arg in ("--backend-key", k)]
    for number, exchange in enumerate(exchanges):
        (tmp_path / f"x{number}.request").write_bytes(exchange.request)
        (tmp_path / f"x{number}.response").write_bytes(exchange.response)
        for form, receipt in (("handed", exchange.handed), ("fetched", exchange.fetched)):
            path = tmp_path / f"x{number}-{form}.receipt"
            path.write_bytes(receipt)
            check = ["receipt", "verify", str(path), "--key", key, "--log", log, *flags]
            check += ["--request-body", str(tmp_path / f"x{number}.request")]
            check += ["--response-body", str(tmp_path / f"x{number}.response")]
            capsys.readouterr()
            assert run_audit(check) == 0, capsys.readouterr()
            said = capsys.readouterr().out
            assert "ok: the backend countersigned this request body" in said, said
            assert "ok: the backend countersigned this response body" in said, said
            backend = json.loads(base64.b64decode(json.loads(receipt)["payload"]))["backend"]
            assert backend in PRIVATE
            statement = verify(receipt, key, vkeys, exchange.request, exchange.response)
            assert (
                statement["request_id"]
                == json.loads(base64.b64decode(json.loads(receipt)["payload"]))["request_id"]
            )
        assert (
            json.loads(exchange.fetched)["attestation"]
            == json.loads(exchange.handed)["attestation"]
        )


def streamed_receipt(url: str, key: str) -> bytes:
    """A streamed answer's receipt (its final SSE comment)."""
    body: dict[str, Any] = {
        "model": "llama-3.1-8b",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
    }
    response = httpx.post(
        f"{url}/v1/chat/completions",
        headers={"authorization": f"Bearer {key}"},
        json=body,
        timeout=30,
    )
    assert response.status_code == 200, response.text
    (line,) = [x for x in response.text.splitlines() if x.startswith(": owngate-receipt ")]
    return base64.b64decode(line.removeprefix(": owngate-receipt "))


def check_admin_api(banner: str) -> None:
    """The admin URL and role tokens the banner prints work, each within its role."""
    admin = re.search(r"Admin API .* at (http://127\.0\.0\.1:\d+)\n", banner)
    tokens = dict(
        re.findall(r"(operator|security|auditor) token \(shown once\):\s+(og-admin-\S+)", banner)
    )
    assert admin and set(tokens) == {"operator", "security", "auditor"}, banner
    assert f"{admin[1]}/openapi.json" in banner and f"{admin[1]}/log/" in banner
    console = re.search(r"web console: (http://127\.0\.0\.1:\d+/console/)\s", banner)
    assert console and console[1] == f"{admin[1]}/console/", banner
    page = httpx.get(console[1], timeout=10)
    assert page.status_code == 200 and "owngate console" in page.text

    def get(path: str, role: str) -> httpx.Response:
        headers = {"authorization": f"Bearer {tokens[role]}"}
        return httpx.get(f"{admin[1]}{path}", headers=headers, timeout=10)

    status = get("/admin/v1/status", "operator")
    assert status.status_code == 200, status.text
    assert {b["id"] for b in status.json()["backends"]} >= {"gpu-vllm", "cpu-llamacpp"}
    refused = get("/admin/v1/status", "auditor")
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "permission_denied"
    assert get("/admin/v1/policies", "security").status_code == 200
    # validated against the environment the demo's gateway runs with (its OPENAI_API_KEY)
    hosted = {
        "id": "openai",
        "kind": "hosted",
        "provider": "openai",
        "api_key_env": "OPENAI_API_KEY",
        "base_url": "http://127.0.0.1:9/v1",
        "owner": "provider",
        "region": "eu-west-1",
        "retention": {"days": 0, "zero_data_retention": True},
        "models": [{"name": "gpt-4o-mini", "provider_model": "openai/gpt-4o-mini"}],
    }
    candidate = {"backends": [hosted], "tenants": [{"id": "t", "models": ["*"]}]}
    validated = httpx.post(
        f"{admin[1]}/admin/v1/config/validate",
        headers={"authorization": f"Bearer {tokens['operator']}"},
        json={"yaml": json.dumps(candidate)},
        timeout=10,
    )
    assert validated.json() == {"valid": True, "problems": []}, validated.text
    checkpoint = get("/log/checkpoint", "auditor")
    assert checkpoint.status_code == 200
    assert checkpoint.text.startswith("owngate-demo/log\n")
    check_security_role(banner, admin[1], tokens["security"])


def check_security_role(banner: str, admin: str, token: str) -> None:
    """What the console's security page does, against the demo: its "Run policy tests"
    runs the demo policy set's own cases (they were missing: 400), and a key it creates
    works on the public port at once and is refused once revoked (the demo had no
    keys_file and no config file to reload: 400)."""
    url = re.search(r"running at (http://\S+)", banner)
    assert url, banner
    headers = {"authorization": f"Bearer {token}"}
    # without a token a loopback client reads, and changes nothing: it minted keys before
    assert "Without a token a loopback client may only read (GET)" in banner
    unsigned = httpx.post(f"{admin}/admin/v1/keys", json={"tenant": "demo-eu"}, timeout=30)
    assert unsigned.status_code == 401, unsigned.text
    assert unsigned.json()["error"]["code"] == "missing_api_key"
    assert httpx.get(f"{admin}/admin/v1/keys", timeout=30).status_code == 200
    tested = httpx.post(f"{admin}/admin/v1/policies/test", headers=headers, json={}, timeout=30)
    assert tested.status_code == 200, tested.text
    assert tested.json()["passed"] is True and tested.json()["total"] > 0, tested.text
    created = httpx.post(
        f"{admin}/admin/v1/keys", headers=headers, json={"tenant": "demo-eu"}, timeout=30
    )
    assert created.status_code == 201, created.text
    key, digest = created.json()["key"], created.json()["hash"]

    def status_with(api_key: str) -> int:
        return httpx.post(
            f"{url[1]}/v1/chat/completions",
            headers={"authorization": f"Bearer {api_key}"},
            json={"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "hi"}]},
            timeout=30,
        ).status_code

    assert status_with(key) == 200
    revoked = httpx.delete(f"{admin}/admin/v1/keys/{digest}", headers=headers, timeout=30)
    assert revoked.status_code == 200, revoked.text
    assert status_with(key) == 401


def reply_headers(url: str, key: str) -> dict[str, str]:
    response = httpx.post(
        f"{url}/v1/chat/completions",
        headers={"authorization": f"Bearer {key}"},
        json={"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "hi"}]},
        timeout=30,
    )
    assert response.status_code == 200
    return dict(response.headers)


# A shell as a new user's: the system's tools, not the checkout's venv on PATH.
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"


def _as_printed(command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run a command the banner printed, pasted as is into a new user's shell."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = SYSTEM_PATH
    return subprocess.run(
        ["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_the_banners_commands_work_as_printed_and_a_signal_stops_the_demo_cleanly(
    sig: signal.Signals, tmp_path: Path
) -> None:
    """The Python snippet, `status` and the audit the banner prints run as pasted into a
    shell without the venv on PATH: before, the snippet was indented inside its heredoc
    (its `PY` never ended it; Python refused the indent) and named a bare `python` and
    `owngate` that such a shell resolves to another install or nothing.

    Ctrl-C (or the SIGTERM of `timeout`, `kill`, `docker stop`) ends the demo with exit
    0 and no traceback, after the sidecars signed their final checkpoints, so the audit
    passes. uvicorn re-raised the signal it handled: on SIGINT asyncio then cancelled the
    admin API's shutdown (an ERROR traceback), on SIGTERM the process died (-15) before
    the sidecars closed their logs, and the audit failed with an entry missing from a
    sidecar's log."""
    proc = _demo_in(tmp_path)
    try:
        banner = _read_banner(proc)
        snippet = re.search(r"^ *(\S+ - <<'PY'\n.*?^ *PY\n)", banner, re.MULTILINE | re.DOTALL)
        status = re.search(r"^Backends: (.*?)   \(no admin token", banner, re.MULTILINE)
        assert snippet and status, banner
        answered = _as_printed(snippet[1], tmp_path)
        assert answered.returncode == 0 and answered.stdout.strip(), answered.stderr
        shown = _as_printed(status[1], tmp_path)
        assert shown.returncode == 0 and "cpu-llamacpp" in shown.stdout, shown.stderr
    finally:
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "Traceback" not in err, err
    audit = re.search(r"^  (\S+ audit verify /\S+ (?:[^\n]*\\\n)+[^\n]*\n)", banner, re.MULTILINE)
    assert audit, banner
    verified = _as_printed(audit[1], tmp_path)
    assert verified.returncode == 0, verified.stdout + verified.stderr


_BANNER_CURL = re.compile(r"curl -s (?:[^\n]*\\\n)*[^\n]*")


def _send_as_curl(command: str, *, without: str = "") -> httpx.Response:
    """The request a banner's `curl` command sends, pasted as printed (its `\\` line ends
    joined): the options it uses (`-s`, `-X`, `-H`, `-d`, a method from `-d` as curl
    picks it) and nothing else: one it does not know fails, so a banner that grows a new
    option is read again here. `without`: a header left out (lower case)."""
    words = shlex.split(command.replace("\\\n", " "))
    assert words[0] == "curl", command
    method, url, data = "", "", None
    headers: dict[str, str] = {}
    rest = iter(words[1:])
    for word in rest:
        if word == "-s":
            continue
        if word == "-X":
            method = next(rest)
        elif word == "-H":
            name, _, value = next(rest).partition(":")
            if name.strip().lower() != without:
                headers[name.strip()] = value.strip()
        elif word == "-d":
            data = next(rest)
        elif not word.startswith("-") and not url:
            url = word
        else:
            raise AssertionError(f"a curl option this test does not read: {word!r} in {command}")
    if data is not None and not any(h.lower() == "content-type" for h in headers):
        headers["Content-Type"] = "application/x-www-form-urlencoded"  # as curl's -d sends
    method = method or ("POST" if data is not None else "GET")
    return httpx.request(method, url, headers=headers, content=data, timeout=60)


def test_every_curl_and_audit_the_banner_prints_works_as_printed(tmp_path: Path) -> None:
    """What a new user does with the banner, command by command: every `curl` it prints
    (chat, models, metrics, each role's admin calls with its printed token) answers 2xx
    as printed; sent without its token, each admin call that reads still answers and each
    that writes is 401 `missing_api_key`, as the banner says; the chat's receipt, saved
    as the banner says (`receipt.json`), verifies with the banner's `receipt verify` as
    pasted, the live log with its `audit verify URL`, and after Ctrl-C the whole log with
    its two-party `audit verify`. The other tests here read the banner's URLs and tokens
    but send their own requests; these are the banner's own commands."""
    proc = _demo_in(tmp_path)
    try:
        banner = _read_banner(proc)
        url = re.search(r"running at (http://\S+)", banner)
        admin = re.search(r"Admin API .* at (http://127\.0\.0\.1:\d+)\n", banner)
        assert url and admin, banner
        curls = _BANNER_CURL.findall(banner)
        # chat, models, metrics; operator: status, reload; security: policies, a key;
        # auditor: the checkpoint
        assert len(curls) == 8, curls
        for command in curls:
            answer = _send_as_curl(command)
            assert 200 <= answer.status_code < 300, (command, answer.status_code, answer.text)
            if "/v1/chat/completions" in command:
                assert answer.json()["choices"][0]["message"]["content"], answer.text
                receipt = base64.b64decode(answer.headers["x-owngate-receipt"])
                (tmp_path / "receipt.json").write_bytes(receipt)
            if command.split()[2].startswith(admin[1]):
                bare = _send_as_curl(command, without="authorization")
                if answer.request.method == "GET":
                    assert bare.status_code == 200, (command, bare.text)
                else:
                    assert bare.status_code == 401, (command, bare.text)
                    assert bare.json()["error"]["code"] == "missing_api_key", bare.text
            if "/admin/v1/keys" in command:  # the new tenant key works at once
                chat = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "hi"}]}
                served = httpx.post(
                    f"{url[1]}/v1/chat/completions",
                    headers={"authorization": f"Bearer {answer.json()['key']}"},
                    json=chat,
                    timeout=60,
                )
                assert served.status_code == 200, served.text
        assert (tmp_path / "receipt.json").exists(), curls
        receipt_verify = re.search(
            r"^  (\S+ audit receipt verify receipt\.json (?:[^\n]*\\\n)+[^\n]*\n)",
            banner,
            re.MULTILINE,
        )
        live = re.search(r"^  (\S+ audit verify http\S+ (?:[^\n]*\\\n)+[^\n]*\n)", banner, re.M)
        assert receipt_verify and live, banner
        checked = _as_printed(receipt_verify[1], tmp_path)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert "ok: countersigned by backend" in checked.stdout, checked.stdout
        assert "its completion, recorded this countersignature" in checked.stdout
        fetched = _as_printed(live[1], tmp_path)
        assert fetched.returncode == 0, fetched.stdout + fetched.stderr
        assert re.search(r"answer\(s\) countersigned by its key", fetched.stdout), fetched.stdout
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    audit = re.search(r"^  (\S+ audit verify /\S+ (?:[^\n]*\\\n)+[^\n]*\n)", banner, re.MULTILINE)
    assert audit, banner
    verified = _as_printed(audit[1], tmp_path)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "its sidecar's log" in verified.stdout, verified.stdout


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_signal_sent_as_soon_as_the_banner_is_out_stops_the_demo_cleanly(
    sig: signal.Signals, tmp_path: Path
) -> None:
    """A script that starts the demo, waits for its banner and stops it at once (`timeout`,
    a CI step, `docker stop`) gets what the README says: exit 0, once the sidecars have
    signed their final checkpoints, and the banner's audit passes. The banner was printed
    before uvicorn took the signals (it does when it starts running): a SIGTERM in between
    killed the demo (-15) with the sidecars' logs unsigned, a Ctrl-C ended it with 130."""
    proc = _demo_in(tmp_path)
    try:
        banner = _read_banner(proc)
        assert "Ctrl-C stops everything" in banner, banner
    finally:
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "Traceback" not in err, err
    audit = re.search(r"^  (\S+ audit verify /\S+ (?:[^\n]*\\\n)+[^\n]*\n)", banner, re.MULTILINE)
    assert audit, banner
    verified = _as_printed(audit[1], tmp_path)
    assert verified.returncode == 0, verified.stdout + verified.stderr
