"""The admin API's published schema (`/openapi.json`) against what a real `owngate serve`
answers, as an outside checker holding only the schema would test it: every operation
is sent without a token, with a wrong one, with each role's token and with a body that
does not validate; every status it answers must be one the schema declares for that
operation (or its `default`), and every error answer is the OpenAI error object the
schema names. A protected operation declares the bearer token it needs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.helpers.admin import Served, bearer, serve_admin

# Sample values for path parameters: well-formed, naming nothing that exists.
_PATH_VALUES = {"digest": "0" * 64, "request_id": "req_absent", "path": "0/x999/999"}
# Operations a role may use that change the gateway: sent by the roles refused only, so
# the module's gateway keeps running (the allowed role acts in test_admin_api.py).
_ACTIONS = {("post", "/admin/v1/reload"), ("post", "/admin/v1/drain"), ("post", "/admin/v1/keys")}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serve_admin(tmp_path_factory.mktemp("admin-openapi")) as gateway:
        gateway.chat()  # something in the log: /log/checkpoint exists
        gateway.wait_for_size(1)
        yield gateway


def _operations(schema: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method, path, operation)
        for path, operations in schema["paths"].items()
        for method, operation in operations.items()
    ]


def _url(path: str) -> str:
    for name, value in _PATH_VALUES.items():
        path = path.replace("{" + name + "}", value)
    return path


def _callers(method: str, path: str) -> list[tuple[str, dict[str, str], Any]]:
    callers: list[tuple[str, dict[str, str], Any]] = [
        ("no token", {}, None),
        ("wrong token", {"authorization": "Bearer og-admin-not-a-token"}, None),
        ("tenant-shaped token", {"authorization": "Bearer og-not-an-admin-token"}, None),
    ]
    for role in ("operator", "security", "auditor"):
        callers.append((role, bearer(role), None))
        if method in ("post", "delete"):
            callers.append((role + " with a bad body", bearer(role), {"bogus": [1]}))
    if (method, path) in _ACTIONS:  # only the refusals: nothing may change here
        callers = [c for c in callers if c[0].split()[0] not in _allowed(method, path)]
    return callers


def _allowed(method: str, path: str) -> set[str]:
    return {"operator"} if path in ("/admin/v1/reload", "/admin/v1/drain") else {"security"}


def _is_error_object(body: Any, schema: dict[str, Any]) -> None:
    """`body` is the schema's `ErrorResponse`: {"error": {message, type, param, code}}."""
    fields = schema["properties"]["error"]["required"]
    assert set(body) == {"error"} and set(body["error"]) == set(fields), body
    error = body["error"]
    assert all(isinstance(error[f], str) for f in ("message", "type", "code")), body
    assert error["param"] is None or isinstance(error["param"], str), body


def test_every_answer_is_one_the_schema_declares(served: Served) -> None:
    schema = httpx.get(f"{served.admin}/openapi.json", timeout=10).json()
    error_schema = schema["components"]["schemas"]["ErrorResponse"]
    undeclared: list[str] = []
    for method, path, operation in _operations(schema):
        declared = operation["responses"]
        for who, headers, body in _callers(method, path):
            answer = httpx.request(
                method, f"{served.admin}{_url(path)}", headers=headers, json=body, timeout=30
            )
            status = str(answer.status_code)
            if status not in declared and "default" not in declared:
                undeclared.append(f"{method.upper()} {path} ({who}): {status} not declared")
                continue
            if answer.status_code < 400:
                continue
            described = declared.get(status) or declared["default"]
            if "application/json" not in described.get("content", {}):
                undeclared.append(f"{method.upper()} {path} ({who}): {status} has no body")
            assert answer.headers["content-type"].startswith("application/json"), answer.text
            _is_error_object(answer.json(), error_schema)
    assert not undeclared, "\n".join(undeclared)


def test_a_protected_operation_declares_its_bearer_token(served: Served) -> None:
    schema = httpx.get(f"{served.admin}/openapi.json", timeout=10).json()
    schemes = schema["components"].get("securitySchemes", {})
    bearers = {name for name, s in schemes.items() if s.get("scheme") == "bearer"}
    assert bearers, schemes
    for method, path, operation in _operations(schema):
        needs = {name for entry in operation.get("security", []) for name in entry}
        answer = httpx.request(method, f"{served.admin}{_url(path)}", timeout=30)
        if answer.status_code == 401:  # no token: refused, so the schema must say it needs one
            assert needs & bearers, (method, path)
            assert "401" in operation["responses"], (method, path)
        else:
            assert not needs, (method, path, answer.status_code)
