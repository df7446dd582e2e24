"""What `serve --workers N` says at start (`gateway.workers.start_warnings`) and what
`owngate status` says of the worker that answered: with `state: memory` the workers split
each tenant limit (each admits its part), and no worker opens the admin API a single
`serve` would. A plain `serve`, or shared state on Redis, says nothing."""

from __future__ import annotations

import ast
from typing import Any

from gateway.cli.status import format_table
from gateway.workers import start_warnings
from tests.helpers.gateways import ADMIN, backend, gateway_config
from tests.helpers.paths import REPO_ROOT

PER_WORKER = "tenant limits are split over the workers with state: memory"
NO_ADMIN = "admin.listen is not opened under serve --workers"


def _said(count: int, **extra: Any) -> list[tuple[str, str, dict[str, object]]]:
    config = gateway_config([backend("gpu", "http://127.0.0.1:9", "m")], **extra)
    return start_warnings(config, count)


def _tenants(*limits: dict[str, int]) -> list[dict[str, Any]]:
    return [{"id": f"t{i}", "models": ["*"], "limits": lim} for i, lim in enumerate(limits)]


def test_memory_limits_with_workers_are_a_warning_naming_the_tenants() -> None:
    tenants = _tenants({"requests_per_minute": 5}, {}, {"concurrent_requests": 1})
    [(level, event, fields)] = _said(3, tenants=tenants)
    assert (level, event.startswith(PER_WORKER)) == ("warning", True)
    assert fields == {"workers": 3, "tenants_with_limits": ["t0", "t2"], "more": 0}


def test_many_tenants_are_named_up_to_twenty() -> None:
    tenants = _tenants(*[{"tokens_per_minute": 100}] * 25)
    [(_, _, fields)] = _said(2, tenants=tenants)
    assert len(fields["tenants_with_limits"]) == 20  # type: ignore[arg-type]
    assert fields["more"] == 5


def test_without_limits_it_is_a_note_and_redis_or_one_process_says_nothing() -> None:
    [(level, event, _)] = _said(2, tenants=_tenants({}))
    assert (level, event.startswith(PER_WORKER)) == ("info", True)
    limited = _tenants({"requests_per_minute": 5})
    redis = {"backend": "redis", "url": "redis://127.0.0.1:9/0"}
    assert _said(2, tenants=limited, state=redis) == []
    assert _said(1, tenants=limited) == []


def test_an_admin_api_serve_would_open_is_said_not_to_be() -> None:
    redis = {"backend": "redis", "url": "redis://127.0.0.1:9/0"}
    opened = {**ADMIN, "listen": {"host": "127.0.0.1", "port": 0}}
    [(level, event, _)] = _said(2, state=redis, admin=opened)
    assert (level, event.startswith(NO_ADMIN)) == ("warning", True)
    keyless = {"listen": {"host": "127.0.0.1", "port": 0}}  # serve would not open it either
    assert _said(2, state=redis, admin=keyless) == []
    assert _said(1, state=redis, admin=opened) == []


def test_status_names_the_worker_that_answered() -> None:
    report: dict[str, Any] = {"backends": [], "readiness": {"status": "ready", "worker": 2}}
    assert "answered by worker 2 of `serve --workers`" in format_table(report)
    report["readiness"]["worker"] = None  # one process: nothing to say
    assert "worker" not in format_table(report)


def test_the_new_log_origin_variable_is_defined_once() -> None:
    """The supervisor drops `serve --new-log-origin`'s variable from a restarted worker's
    environment; gateway/workers.py spelled it again, apart from the one the recorder
    reads (gateway/api/recorder_log.py): a rename of one would leave the other behind."""
    defined = []
    for path in sorted((REPO_ROOT / "gateway").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            if isinstance(value, ast.Constant) and value.value == "OWNGATE_NEW_LOG_ORIGIN":
                defined.append(path.relative_to(REPO_ROOT).as_posix())
    assert defined == ["gateway/api/recorder_log.py"]
