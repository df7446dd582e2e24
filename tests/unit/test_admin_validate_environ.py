"""The admin API validates a candidate config against the environment the running
gateway was assembled with (the demo assembles its own, adding a hosted key), never
the process environment alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.admin.control import AdminControl
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


def test_validate_never_answers_a_line_of_a_file_the_candidate_names(tmp_path: Path) -> None:
    # A candidate may name any file the gateway can read as its keys_file; PyYAML's
    # error quotes the line it stopped at, which would answer an admin token that line.
    secret = "AKIA-SECRET-VALUE-0123"
    credentials = tmp_path / "credentials"
    credentials.write_text(f"[default]\naws_secret_access_key = {secret}: x\n")
    data = {
        "backends": [backend("gpu", "http://127.0.0.1:9", "m")],
        "tenants": [{"id": "acme", "models": ["*"]}],
    }
    control: AdminControl = admin_app(
        create_app(GatewaySettings.model_validate(data), config_dir=tmp_path)
    ).state.control  # a file under the config's directory (others: candidate_files.py)
    problems = control.validate(json.dumps({**data, "keys_file": str(credentials)}))
    assert problems == [
        f"{credentials}:line 2: <root>: not valid YAML: expected '<document start>', "
        "but found '<block mapping start>'"
    ]
    assert not any("AKIA" in problem for problem in problems)


# A secret with a quote and a backslash: a problem quoting it by `repr` writes it
# escaped (`\\'`, `\\\\`), which a search for the value as it is never found.
ESCAPED_SECRET = "Sec'ret\\Pw\"9x"
QUOTING = {  # where a problem quotes the value it read
    "a region's glob": ("backends[0].region", "${S}*"),
    "a base_url's port": ("backends[0].base_url", "http://127.0.0.1:${S}"),
    "a provider_model's prefix": ("backends[1].models[0].provider_model", "${S}"),
}


def _candidate(where: str, value: str) -> dict[str, object]:
    data: dict[str, object] = {
        "backends": [
            backend("gpu", "http://127.0.0.1:9", "m"),
            hosted_backend("openai", "http://127.0.0.1:9/v1", "gpt"),
        ],
        "tenants": [{"id": "acme", "models": ["*"]}],
    }
    node: object = data
    *parents, last = where.replace("]", "").replace("[", ".").split(".")
    for part in parents:
        node = node[int(part)] if part.isdigit() else node[part]  # type: ignore[index]
    node[last] = value  # type: ignore[index]
    return data


@pytest.mark.parametrize("where", QUOTING)
def test_no_problem_quotes_an_environment_value_even_escaped(where: str) -> None:
    """`_unquoted` replaced the value as it is: `repr` escapes a quote and a backslash,
    so a region, a base_url or a provider_model of `${VAR}` answered the admin client
    the secret (escaped, and as good as plain)."""
    environ = {"S": ESCAPED_SECRET, "HOSTED_KEY": "k"}
    data = _candidate("backends[0].region", "eu-west-1")
    app = create_app(GatewaySettings.model_validate(data), environ=environ)
    control: AdminControl = admin_app(app).state.control
    problems = control.validate(json.dumps(_candidate(*QUOTING[where])))
    assert problems and any("${S}" in problem for problem in problems), problems
    assert not any("Pw" in problem for problem in problems), problems
