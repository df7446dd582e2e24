"""Under `serve --workers N` the header data-class labels are read from is pinned for the
server's life (gateway/label_header.py): a worker whose files name another (one the
supervisor restarted after a refused header change) serves nothing until they name the
pinned one again, by the policy watcher's reload or by a gateway.yaml reload.
(With two real workers: tests/integration/test_workers_label_header.py.)"""

from __future__ import annotations

import asyncio
from pathlib import Path

import yaml

from gateway.app import create_app
from gateway.config import load_config
from gateway.label_header import PIN_FILE, HeaderPin
from gateway.policy_set import TrustPolicies
from gateway.state.memory import WORKERS_ENV
from gateway.worker_identity import INDEX_ENV, RUNTIME_ENV
from tests.helpers.gateways import backend, gateway_config
from tests.helpers.reload_files import LABEL_SET, PHI_DENIED, POLICY_SECTION, write


def _files(tmp_path: Path, header: str) -> Path:
    policies = tmp_path / "policies"
    policies.mkdir(exist_ok=True)
    write(policies / "set.yaml", LABEL_SET.replace("HEADER", header), 1_000_000_000)
    write(policies / "p.yaml", PHI_DENIED, 1_000_000_000)
    return policies


def _settle(trust: TrustPolicies) -> None:
    for _ in range(3):
        trust.poll()


def test_the_first_worker_pins_the_header_and_a_later_one_naming_another_serves_nothing(
    tmp_path: Path,
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    policies = _files(tmp_path, "x-sensitivity")
    config = gateway_config(
        [backend("gpu", "http://127.0.0.1:9", "m")], policy={"paths": ["policies"]}
    )
    first = TrustPolicies(config, tmp_path, pin=HeaderPin(run))
    assert not first.stale and (run / PIN_FILE).read_text() == "x-sensitivity"
    write(policies / "set.yaml", LABEL_SET.replace("HEADER", "x-data-class"), 2_000_000_000)
    _settle(first)
    assert first.current.data_class_header == "x-sensitivity"  # refused, as in one process

    restarted = TrustPolicies(config, tmp_path, pin=HeaderPin(run))
    assert restarted.stale, "a restarted worker read labels from another header"
    assert restarted.off_pin and restarted.last_error is not None
    assert "'x-sensitivity'" in restarted.last_error
    assert restarted.status()["last_reload_error"] == restarted.last_error
    assert (run / PIN_FILE).read_text() == "x-sensitivity"  # never moved by a later worker
    write(policies / "p.yaml", PHI_DENIED.replace('"1"', '"2"'), 3_000_000_000)
    _settle(restarted)  # another edit, still the other header: still refused
    assert restarted.stale and restarted.current.compiled("p").version == "1"

    write(policies / "set.yaml", LABEL_SET.replace("HEADER", "x-sensitivity"), 4_000_000_000)
    _settle(restarted)
    assert not restarted.stale and restarted.last_error is None
    assert restarted.current.data_class_header == "x-sensitivity"
    assert restarted.current.compiled("p").version == "2"
    assert restarted.current.decide("acme", "m", "phi").private == ()


def test_a_gateway_yaml_reload_back_to_the_pinned_header_serves_again(tmp_path: Path) -> None:
    """The worker serving nothing (its set names another header) is not held to that
    header by a gateway.yaml reload: before, it compared the reload's set with its own
    (never served) and refused the pinned header, so only the policy watcher could
    bring it back."""
    run = tmp_path / "run"
    run.mkdir()
    (run / PIN_FILE).write_text("x-sensitivity")  # its siblings', pinned before it started
    policies = _files(tmp_path, "x-data-class")
    path = tmp_path / "gateway.yaml"
    data = gateway_config([backend("gpu", "http://127.0.0.1:9", "m")]).model_dump(
        mode="json", exclude_none=True
    )
    write(path, yaml.safe_dump(data) + POLICY_SECTION, 1_000_000_000)
    environ = {INDEX_ENV: "2", RUNTIME_ENV: str(run), WORKERS_ENV: "2"}
    app = create_app(load_config(path), environ=environ, config_dir=tmp_path, config_file=path)
    assert app.policies.stale and app.policies.current.data_class_header == "x-data-class"
    reloader = app.reloader
    assert reloader is not None
    # gateway.yaml reloaded on a set still naming the other header: refused, still stale
    data["tenants"][0]["limits"] = {"concurrent_requests": 8}
    write(path, yaml.safe_dump(data) + POLICY_SECTION, 2_000_000_000)
    assert not asyncio.run(reloader.reload())
    assert app.policies.stale
    write(policies / "set.yaml", LABEL_SET.replace("HEADER", "x-sensitivity"), 3_000_000_000)
    assert asyncio.run(reloader.reload()), reloader.last_error
    assert not app.policies.stale
    assert app.policies.latest().data_class_header == "x-sensitivity"
