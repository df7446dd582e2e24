"""A reload refused when the gateway is assembled from the new config (past the loader: a
policy file, a signing key, a key variable it names) kept the problem as it was found: the
value a `${VAR}` filled in (a path holding a secret, a token in a file name) went into
`last_reload_error` (the admin API's /admin/status and reload answer) and the log line.
Each is written as `${VAR}`, as the loader's own problems already were."""

from __future__ import annotations

import asyncio
from pathlib import Path

import yaml
from structlog.testing import capture_logs

from gateway.app import create_app
from gateway.config import load_config
from tests.helpers.gateways import backend, gateway_config

SECRET = "Sec'ret\\Pw9x"  # a quote and a backslash: `repr` escapes them


def test_a_reload_refused_at_assembly_never_quotes_a_variable(tmp_path: Path) -> None:
    data = gateway_config([backend("gpu", "http://127.0.0.1:9", "m")]).model_dump(
        mode="json", exclude_none=True
    )
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(data))
    environ = {"POLICY_DIR": SECRET}
    app = create_app(
        load_config(path, env=environ),
        environ={},
        config_dir=tmp_path,
        config_file=path,
        config_env=environ,
    )
    reloader = app.reloader
    assert reloader is not None
    data["policy"] = {"paths": ["/nonexistent/${POLICY_DIR}/policy.yaml"]}
    path.write_text(yaml.safe_dump(data))
    with capture_logs() as logs:
        assert asyncio.run(reloader.reload()) is False
    error = reloader.last_error or ""
    assert "${POLICY_DIR}" in error and "Pw9x" not in error, error
    assert "Pw9x" not in reloader.status()["last_reload_error"]
    failed = [entry for entry in logs if entry["event"].startswith("config reload failed")]
    assert failed and "${POLICY_DIR}" in str(failed[0]["problems"])
    assert "Pw9x" not in str(logs)
