"""The admin API (gateway/admin/) on its own listener of a real `owngate serve` process:
roles (401/403/200 per endpoint), admin actions written to the provenance log (which
`owngate audit verify` still accepts), the log as C2SP tlog-tiles over HTTP (strict
paths, content types, caching), `owngate audit verify URL`, and the OpenAPI schema
(served, and published in docs/admin-openapi.json)."""

from __future__ import annotations

import hashlib
import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml

from gateway.admin.app import openapi_schema
from gateway.config import GatewaySettings
from gateway.provenance import TlogProof, load_verifiers, verify_tlog_proof
from gateway.tenants import hash_api_key, read_keys_file
from tests.helpers.admin import CASES, ORIGIN, TOKENS, Served, bearer, serve_admin
from tests.helpers.gateways import backend, gateway_config
from tests.helpers.paths import REPO_ROOT
from tests.helpers.processes import KEY, owngate_argv
from tests.helpers.provenance import records, run_audit
from tests.helpers.raw_http import exchange
from tests.helpers.waiting import until


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serve_admin(tmp_path_factory.mktemp("admin-api")) as gateway:
        yield gateway


# (method, path, body, the roles allowed besides full access)
READS = [
    ("GET", "/admin/v1/status", None, {"operator"}),
    ("GET", "/admin/v1/policies", None, {"security"}),
    ("POST", "/admin/v1/policies/explain", {"tenant": "acme", "model": "m"}, {"security"}),
    ("GET", "/admin/v1/config", None, {"operator", "security"}),
    ("POST", "/admin/v1/config/validate", {"yaml": "{}"}, {"operator", "security"}),
    ("GET", "/admin/v1/keys", None, {"security"}),
    ("GET", "/log/checkpoint", None, {"auditor"}),
    ("GET", "/admin/v1/whoami", None, {"operator", "security", "auditor"}),
    ("GET", "/admin/v1/timeline/backends", None, {"operator"}),
    ("GET", "/admin/v1/timeline/policies", None, {"security"}),
    ("GET", "/admin/v1/timeline/log", None, {"auditor"}),
    ("GET", "/admin/v1/tenants", None, {"operator", "security"}),
    ("POST", "/admin/v1/policies/test", {"cases_yaml": CASES}, {"security"}),
    ("POST", "/admin/v1/receipts/verify", {"receipt": "{}"}, {"auditor"}),
    ("GET", "/admin/v1/log/cosignatures", None, {"auditor"}),
    ("GET", "/admin/v1/log/requests/nope", None, set()),  # auditor: 404, tested below
]
ACTIONS = [  # only refused here: the allowed role acts in the tests below
    ("POST", "/admin/v1/reload", None, {"operator"}),
    ("POST", "/admin/v1/drain", None, {"operator"}),
    ("POST", "/admin/v1/keys", {"tenant": "acme"}, {"security"}),
    ("DELETE", "/admin/v1/keys/" + "0" * 64, None, {"security"}),
]


def _call(served: Served, method: str, path: str, body: Any, role: str | None) -> httpx.Response:
    headers = bearer(role) if role else {}
    return httpx.request(method, f"{served.admin}{path}", headers=headers, json=body, timeout=10)


def _error_code(response: httpx.Response) -> str:
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    code: str = error["code"]
    return code


@pytest.mark.parametrize(("method", "path", "body", "allowed"), READS + ACTIONS)
def test_each_endpoint_answers_only_its_roles(
    served: Served, method: str, path: str, body: Any, allowed: set[str]
) -> None:
    served.chat()  # something in the log: /log/checkpoint exists
    served.wait_for_size(1)
    missing = _call(served, method, path, body, None)
    assert missing.status_code == 401 and _error_code(missing) == "missing_api_key"
    wrong = httpx.request(
        method, f"{served.admin}{path}", headers={"authorization": "Bearer nope"}, timeout=10
    )
    assert wrong.status_code == 401 and _error_code(wrong) == "invalid_api_key"
    for role in ("operator", "security", "auditor"):
        if (role in allowed and (method, path, body, allowed) in ACTIONS) or not allowed:
            continue
        answer = _call(served, method, path, body, role)
        if role in allowed:
            assert answer.status_code == 200, (role, answer.text)
        else:
            assert answer.status_code == 403, (role, answer.text)
            assert _error_code(answer) == "permission_denied"
    if (method, path, body, allowed) in READS and allowed:
        assert _call(served, method, path, body, "admin").status_code == 200


def test_status_names_every_backend_with_its_routing_state(served: Served) -> None:
    status = served.get("/admin/v1/status", "operator").json()
    assert status["status"] == "ready"
    (gpu,) = status["backends"]
    assert gpu["id"] == "gpu" and gpu["breaker"]["state"] == "closed"
    assert {"inflight", "waiting", "kv_usage", "prefilling_tokens", "scores"} <= set(gpu)


def test_policies_and_explain(served: Served) -> None:
    policies = served.get("/admin/v1/policies", "security").json()
    assert policies["builtin"] is True and policies["digest"]
    explained = served.post(
        "/admin/v1/policies/explain", "security", {"tenant": "acme", "model": "m"}
    ).json()
    assert explained["private"] == ["gpu"] and explained["policy_digest"] == policies["digest"]
    assert explained["trace"][0]["backend"] == "gpu"
    bad = served.post("/admin/v1/policies/explain", "security", {"tenant": "acme"})
    assert bad.status_code == 400 and _error_code(bad) == "invalid_request"


def test_actions_are_logged_and_the_log_still_verifies(served: Served) -> None:
    before = served.get("/admin/v1/config", "operator").json()
    reloaded = served.post("/admin/v1/reload", "operator").json()
    assert reloaded["action"] == "reload" and reloaded["log_index"] is not None
    created = served.post("/admin/v1/keys", "security", {"tenant": "acme"})
    assert created.status_code == 201, created.text
    key = created.json()["key"]
    assert served.chat(key).status_code == 200  # active at once (the config was reloaded)
    listed = served.get("/admin/v1/keys", "security").json()["keys"]
    assert {"tenant": "acme", "hash_prefix": hash_api_key(key)[7:19], "revoked": False} in listed
    assert key not in json.dumps(listed)
    digest = hash_api_key(key).removeprefix("sha256:")
    revoked = served.post("/admin/v1/keys/revoke-by-post", "security")
    assert revoked.status_code in (404, 405)
    revoked = httpx.delete(
        f"{served.admin}/admin/v1/keys/{digest}", headers=bearer("security"), timeout=10
    )
    assert revoked.status_code == 200, revoked.text
    assert served.chat(key).status_code == 401
    # the key came and went: the same config runs again
    assert served.get("/admin/v1/config", "operator").json()["digest"] == before["digest"]
    last = revoked.json()["log_index"]
    served.wait_for_size(last + 1)
    admin = [r for r in records(served.log) if r["type"] == "admin"]
    assert [r["action"] for r in admin][-3:] == ["reload", "key_create", "key_revoke"]
    assert admin[-1]["role"] == "security"
    assert admin[-1]["token"] == hash_api_key(TOKENS["security"])[7:19]
    assert admin[-1]["change_digest"] == revoked.json()["change_digest"]
    # the record names the revoked key: an auditor recomputes the digest from it alone
    named = {"hash": "sha256:" + digest, "tenant": "acme"}
    assert admin[-1]["change_digest"] == hashlib.sha256(orjson.dumps(named)).hexdigest()
    assert [r["outcome"] for r in admin][-3:] == ["done", "done", "done"]
    assert run_audit(["verify", str(served.log), "--key", served.vkey]) == 0
    assert run_audit(["prove", str(served.log), admin[-1]["request_id"], "--record", "admin"]) == 0
    assert run_audit(["show", str(served.log), "--records", "--tenant", "acme"]) == 0
    url = f"{served.admin}/log/"
    token = ["--token", TOKENS["auditor"]]
    assert run_audit(["verify", url, "--key", served.vkey, *token, "--origin", ORIGIN]) == 0
    assert run_audit(["verify", url, "--key", served.vkey]) == 2  # no token: 401


def test_the_log_is_served_as_tlog_tiles(served: Served) -> None:
    for _ in range(3):
        served.chat()
    served.wait_for_size(2)
    note = served.get("/log/checkpoint", "auditor")
    assert note.headers["content-type"] == "text/plain; charset=utf-8"
    assert note.headers["cache-control"] == "no-cache"
    size = int(note.text.split("\n")[1])
    assert note.content == (served.log / "checkpoint").read_bytes() or size <= served.size()
    width = size % 256
    bundle = served.get(f"/log/tile/entries/000.p/{width}", "auditor")
    if bundle.status_code == 200:  # the log may have grown past it: the full one then
        assert bundle.headers["content-type"] == "application/octet-stream"
        assert bundle.headers["cache-control"] == "no-cache"
    tile = served.get(f"/log/tile/0/000.p/{width}", "auditor")
    if tile.status_code == 200:
        assert len(tile.content) == 32 * width


@pytest.mark.parametrize(
    "path",
    [
        "/log/tile/../checkpoint",
        "/log/tile/%2e%2e/%2e%2e/gateway.yaml",
        "/log/tile/0/..%2f..%2fgateway.yaml",
        "/log/tile/0/000.p/256",
        "/log/tile/0/000.p/0",
        "/log/tile/0/000.p/07",
        "/log/tile/0/x000/000",
        "/log/tile/64/000",
        "/log/tile/entries/abc",
        "/log/tile/0/999",
        "/log/tile/0/0000",
        "/log/tile/",
        "/log/checkpoints/00000000000000000001",
        "/log/wal",
    ],
)
def test_bad_and_absent_tile_paths_are_404(served: Served, path: str) -> None:
    """Sent byte for byte (an HTTP client would resolve the dot segments itself)."""
    port = int(served.admin.rsplit(":", 1)[1])
    head = f"GET {path} HTTP/1.1\r\nhost: a\r\nconnection: close\r\n"
    head += f"authorization: Bearer {TOKENS['auditor']}\r\n\r\n"
    (answer,) = exchange(port, head.encode(), half_close=False).final
    assert answer.status == 404, (path, answer.describe())
    assert json.loads(answer.body)["error"]["code"] == "not_found"


@pytest.mark.parametrize(
    ("role", "length", "status"),
    [
        (None, "0" * 5000 + "2", 401),  # no token: refused before any byte of the body
        ("auditor", "0" * 5000 + "2", 400),  # `{}` read and answered: no receipt in it
        ("auditor", "0" * 5000, 400),  # no body at all
        ("auditor", "0" * 5000 + "2000000", 413),  # past the bound (1 MiB), unread
    ],
)
def test_a_content_length_of_thousands_of_digits_is_no_server_error(
    served: Served, role: str | None, length: str, status: int
) -> None:
    """HTTP lets a Content-Length carry any number of leading zeros; the body bound's
    int() of more than 4300 digits raised, so anyone reaching the admin listener got a 500
    and a traceback in the gateway's log per request, without a token."""
    port = int(served.admin.rsplit(":", 1)[1])
    head = "POST /admin/v1/receipts/verify HTTP/1.1\r\nhost: a\r\nconnection: close\r\n"
    head += "content-type: application/json\r\n"
    if role is not None:
        head += f"authorization: Bearer {TOKENS[role]}\r\n"
    body = b"{}" if length.endswith("2") else b""
    request = f"{head}content-length: {length}\r\n\r\n".encode() + body
    (answer,) = exchange(port, request, half_close=False).final
    assert answer.status == status, answer.describe()
    assert "error" in json.loads(answer.body)
    assert "Exceeds the limit" not in served.process.output()


@pytest.mark.parametrize(
    ("path", "role"), [("/openapi.json", None), ("/log/checkpoint", "auditor")]
)
def test_head_is_the_gets_head_alone_on_the_wire(
    served: Served, path: str, role: str | None
) -> None:
    """A HEAD was a 405 on every route though auth.py let the loopback reader use GET and
    HEAD: now it is the GET's status and headers, Content-Length the GET body's, and not
    one body byte follows the head (read to the server's close)."""
    served.chat()  # the log has a checkpoint to serve
    until(lambda: served.get(path, role).status_code == 200, f"{path} served", timeout=20)
    got = served.get(path, role)
    port = int(served.admin.rsplit(":", 1)[1])
    head = f"HEAD {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n"
    if role is not None:
        head += f"authorization: Bearer {TOKENS[role]}\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(f"{head}\r\n".encode())
        raw = b""
        while len(raw) < 1 << 20 and (chunk := sock.recv(65536)):
            raw += chunk
    status_line, _, rest = raw.partition(b"\r\n")
    fields, _, body = rest.partition(b"\r\n\r\n")
    assert status_line.split()[1] == b"200", raw[:300]
    headers = dict(line.lower().split(b": ", 1) for line in fields.split(b"\r\n"))
    assert headers[b"content-length"] == str(len(got.content)).encode()
    assert body == b""


def test_the_openapi_schema_is_served_and_published(served: Served) -> None:
    schema = served.get("/openapi.json").json()
    for path in ("/admin/v1/status", "/admin/v1/reload", "/admin/v1/keys", "/log/checkpoint"):
        assert path in schema["paths"]
    assert "/docs" not in schema["paths"]  # the console's API page (test_console_assets.py)
    published = json.loads((REPO_ROOT / "docs" / "admin-openapi.json").read_text())
    assert published == schema == openapi_schema()
    # an invalid request is answered 400 with an OpenAI error object, and said so
    validate = schema["paths"]["/admin/v1/config/validate"]["post"]["responses"]
    assert "422" not in validate and "HTTPValidationError" not in json.dumps(schema)
    error = validate["400"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
    answer = served.post("/admin/v1/config/validate", "operator", {"yaml": 1})
    assert answer.status_code == 400
    assert set(answer.json()) == set(schema["components"]["schemas"][error]["required"])


def test_the_admin_port_is_never_the_public_port() -> None:
    with pytest.raises(ValueError, match="port of its own"):
        gateway_config(
            [backend("b", "http://127.0.0.1:1", "m")],
            listen={"port": 9999},
            admin={"listen": {"port": 9999}},
        )
    backends = [backend("b", "http://127.0.0.1:1", "m")]
    assert gateway_config(backends).admin.listen is None  # the tests' gateways open none
    assert GatewaySettings.model_fields["admin"].default.listen.port == 9090


def test_the_public_path_does_not_load_fastapi() -> None:
    """The hot path stays raw ASGI: building and serving the public app imports no
    framework; only the admin API (gateway/admin/) does."""
    code = (
        "import sys, gateway.app, gateway.cli.serve, gateway.api.app; "
        "assert not {'fastapi', 'starlette'} & set(sys.modules), sorted(sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()[-2000:]


def test_a_request_s_records_come_with_inclusion_proofs(served: Served) -> None:
    answer = served.chat()
    request_id = answer.headers["x-request-id"]
    forbidden = served.get(f"/admin/v1/log/requests/{request_id}", "operator")
    assert forbidden.status_code == 403
    found = served.get(f"/admin/v1/log/requests/{request_id}", "auditor")

    def both_proved() -> bool:
        nonlocal found
        found = served.get(f"/admin/v1/log/requests/{request_id}", "auditor")
        return found.status_code == 200 and len(found.json()["records"]) == 2

    until(both_proved, "a checkpoint covering both records", timeout=20, detail=lambda: found.text)
    verifier = load_verifiers([served.vkey])
    for proved in found.json()["records"]:
        proof = TlogProof.parse(proved["proof"])
        assert proof.extra is not None and orjson.loads(proof.extra) == proved["record"]
        verify_tlog_proof(proof, proof.extra, verifier, origin=ORIGIN)
    assert [r["type"] for r in found.json()["records"]] == ["dispatch", "completion"]
    absent = served.get("/admin/v1/log/requests/req_absent", "auditor")
    assert absent.status_code == 404 and _error_code(absent) == "not_found"


def test_a_failed_reload_is_400_and_keeps_the_running_config(served: Served) -> None:
    path = served.process.path
    good = path.read_text()
    path.write_text(good.replace("checkpoint_interval_ms: 20", "checkpoint_interval_ms: -1"))
    try:
        failed = served.post("/admin/v1/reload", "operator")
        assert failed.status_code == 400 and _error_code(failed) == "invalid_request"
        message = failed.json()["error"]["message"]
        assert "the running config stays" in message
        # the failed attempt is an admin record too: its change digest is the error's
        error = message.split("the running config stays: ", 1)[1]
        digest = hashlib.sha256(orjson.dumps({"error": error})).hexdigest()

        def recorded() -> bool:
            admin = [r for r in records(served.log) if r["type"] == "admin"]
            return bool(admin) and admin[-1]["change_digest"] == digest

        until(recorded, "the failed reload's admin record in the log", timeout=20)
        # the signed record says it failed: not a reload taken, in the same shape as one
        failed_record = [r for r in records(served.log) if r["type"] == "admin"][-1]
        assert failed_record["outcome"] == "failed"
        assert served.get("/admin/v1/config", "operator").json()["last_reload_error"]
    finally:
        path.write_text(good)
    assert served.post("/admin/v1/reload", "operator").status_code == 200
    assert served.chat().status_code == 200


def test_a_tenant_key_never_becomes_an_admin_token(served: Served) -> None:
    """A config giving an admin token the digest of a tenant's key (a pasted digest) is
    refused: the tenant's key would open the admin API. The running config stays."""
    path = served.process.path
    good = path.read_text()
    config = yaml.safe_load(good)
    config["admin"]["tokens"].append({"hash": hash_api_key(KEY), "role": "security"})
    path.write_text(yaml.safe_dump(config))
    try:
        failed = served.post("/admin/v1/reload", "operator")
        assert failed.status_code == 400 and "admin token" in failed.json()["error"]["message"]
        tenant_key = httpx.get(
            f"{served.admin}/admin/v1/keys", headers={"authorization": f"Bearer {KEY}"}, timeout=10
        )
        assert tenant_key.status_code == 401 and _error_code(tenant_key) == "invalid_api_key"
        checked = subprocess.run(
            owngate_argv("config", "validate", str(path)),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert checked.returncode == 1 and "admin token" in checked.stdout + checked.stderr
    finally:
        path.write_text(good)
    assert served.post("/admin/v1/reload", "operator").status_code == 200


def test_an_admin_token_listed_under_two_roles_is_refused(served: Served) -> None:
    """A config listing the auditor's token digest again as security's (a pasted digest)
    is refused at reload and by `config validate`, naming both entries and never the
    digest: the lookup took the first silently, so the token's role hung on the order.
    The running config stays: the auditor's token still cannot reach security's API."""
    path = served.process.path
    good = path.read_text()
    config = yaml.safe_load(good)
    digest = hash_api_key(TOKENS["auditor"])
    config["admin"]["tokens"].insert(0, {"hash": digest, "role": "security"})
    path.write_text(yaml.safe_dump(config))
    try:
        failed = served.post("/admin/v1/reload", "operator")
        message = failed.json()["error"]["message"]
        assert failed.status_code == 400 and "admin.tokens[0] (security)" in message
        assert "admin.tokens[3] (auditor)" in message and digest[7:] not in message
        assert served.get("/admin/v1/keys", "auditor").status_code == 403
        checked = subprocess.run(
            owngate_argv("config", "validate", str(path)),
            capture_output=True,
            text=True,
            timeout=60,
        )
        printed = checked.stdout + checked.stderr
        assert checked.returncode == 1 and "admin.tokens[3] (auditor)" in printed
        assert digest[7:] not in printed
    finally:
        path.write_text(good)
    assert served.post("/admin/v1/reload", "operator").status_code == 200


def test_a_key_the_config_cannot_take_is_not_created(served: Served) -> None:
    """With a broken gateway.yaml beside the keys file the reload fails: no key is shown
    (it would be refused), the keys file is as before, and the attempt is recorded."""
    path = served.process.path
    keys = path.parent / "keys.yaml"
    good, stored = path.read_text(), _stored_hashes(keys)
    path.write_text(good.replace("checkpoint_interval_ms: 20", "checkpoint_interval_ms: -1"))
    try:
        refused = served.post("/admin/v1/keys", "security", {"tenant": "acme"})
        assert refused.status_code == 400 and _error_code(refused) == "invalid_request"
        message = refused.json()["error"]["message"]
        assert "no key was created" in message and "key" not in refused.json()
        assert _stored_hashes(keys) == stored  # taken back
        error = message.split("the running config stays: ", 1)[1]
        digest = hashlib.sha256(orjson.dumps({"error": error})).hexdigest()

        def recorded() -> bool:
            admin = [r for r in records(served.log) if r["type"] == "admin"]
            return (
                bool(admin)
                and admin[-1]["action"] == "key_create"
                and (admin[-1]["change_digest"] == digest)
            )

        until(recorded, "the refused key's admin record in the log", timeout=20)
        # the signed record says no key was created, not `key_create` as if one had been
        failed_record = [r for r in records(served.log) if r["type"] == "admin"][-1]
        assert failed_record["outcome"] == "failed"
        assert run_audit(["verify", str(served.log), "--key", served.vkey]) == 0
    finally:
        path.write_text(good)
    assert served.post("/admin/v1/reload", "operator").status_code == 200


def _stored_hashes(keys: Path) -> set[str]:
    held = read_keys_file(keys) if keys.exists() else {}
    return {digest for digests in held.values() for digest in digests}


def test_a_candidate_config_is_validated_without_changing_anything(served: Served) -> None:
    good = served.process.path.read_text()
    checked = served.post("/admin/v1/config/validate", "security", {"yaml": good})
    assert checked.json() == {"valid": True, "problems": []}
    bad = good.replace("checkpoint_interval_ms: 20", "checkpoint_interval_ms: -1")
    bad = bad.replace("id: acme", "id: acme\n  models: [no-such-model]")
    refused = served.post("/admin/v1/config/validate", "operator", {"yaml": bad}).json()
    assert refused["valid"] is False and len(refused["problems"]) >= 1
    assert any("checkpoint_interval_ms" in problem for problem in refused["problems"])
    # PyYAML's scanner is quadratic in flow nesting up to its recursion error: about a
    # second of CPU here, many on a loaded machine
    deep = served.post(
        "/admin/v1/config/validate", "operator", {"yaml": "[" * 5000 + "]" * 5000}, timeout=120
    )
    assert deep.status_code == 200 and "nests too deep" in deep.json()["problems"][0]  # not a 500
    assert served.post("/admin/v1/config/validate", "auditor", {"yaml": good}).status_code == 403
    assert served.get("/admin/v1/config", "operator").json()["last_reload_error"] is None


def test_drain_takes_the_gateway_out_of_rotation(served: Served) -> None:
    """Last: after it the gateway takes no more requests."""
    drained = served.post("/admin/v1/drain", "operator")
    assert drained.status_code == 200 and drained.json()["action"] == "drain"
    assert drained.json()["changed"] is True
    again = served.post("/admin/v1/drain", "operator")  # already draining: nothing changes
    assert again.status_code == 200 and again.json()["changed"] is False
    assert httpx.get(f"{served.process.url}/readyz", timeout=10).status_code == 503
    assert served.get("/admin/v1/status", "operator").json()["draining"] is True


def test_policies_name_each_policy_with_its_tenants_and_rules(served: Served) -> None:
    """What the console's tenants -> policies -> rules view reads."""
    found = served.get("/admin/v1/policies", "security").json()
    (policy,) = [p for p in found["policies"] if "acme" in p["tenants"]]
    assert policy["rules"] and set(policy["rules"]) <= set(found["rules"])
    assert {f"{found['id']}/default-deny", f"{found['id']}/unknown-model"} <= set(found["rules"])
