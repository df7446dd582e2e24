"""The admin API validates a candidate config against the environment the running
gateway was assembled with (the demo assembles its own, adding a hosted key), never
the process environment alone."""

from __future__ import annotations

import json

import pytest

from gateway.admin.app import AdminControl
from gateway.app import admin_app, create_app
from gateway.config import GatewaySettings
from tests.helpers.gateways import backend, hosted_backend


def test_validate_reads_the_environ_the_gateway_was_assembled_with(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("HOSTED_KEY", raising=False)
    data = {
        "backends": [
            backend("gpu", "http://127.0.0.1:9", "m"),
            hosted_backend("openai", "http://127.0.0.1:9/v1", "gpt"),
        ],
        "tenants": [{"id": "acme", "models": ["*"]}],
    }
    app = create_app(GatewaySettings.model_validate(data), environ={"HOSTED_KEY": "k"})
    control: AdminControl = admin_app(app).state.control
    assert control.validate(json.dumps(data)) == []
    missing = {
        **data,
        "backends": [
            *data["backends"],
            {**data["backends"][1], "id": "other", "api_key_env": "OTHER_KEY"},
        ],
    }
    assert any("OTHER_KEY" in problem for problem in control.validate(json.dumps(missing)))


def test_validate_never_answers_the_value_of_an_environment_variable() -> None:
    # A candidate may name any variable of the gateway's environment (${VAR}); where a
    # problem quotes the interpolated value, an admin token would read the secret.
    data = {
        "backends": [backend("gpu", "http://127.0.0.1:9", "m")],
        "tenants": [{"id": "acme", "models": ["*"]}],
    }
    secret = "sk-hosted-secret-value"
    app = create_app(GatewaySettings.model_validate(data), environ={"HOSTED_KEY": secret})
    control: AdminControl = admin_app(app).state.control
    candidate = {**data, "policy": {"paths": ["${HOSTED_KEY}"]}}
    problems = control.validate(json.dumps(candidate))
    assert problems and any("${HOSTED_KEY}" in problem for problem in problems)
    assert not any(secret in problem for problem in problems)
