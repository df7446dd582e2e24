"""A reload never changes the header requests' data-class labels are read from.

A PolicySet naming `data_class_header: x-sensitivity`, removed or edited (or a gateway.yaml
that drops its `policy:` section), reloaded as the default `x-data-class`: every request
labelled `x-sensitivity: phi` became unlabelled, and `phi`'s `fallback: never` no longer
applied to it. Such a reload is refused (the running set stays, the failure is logged,
counted and shown) until a restart; a process whose start read was not served (stale) is
not held to the header of what it read cut short."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.app import create_app
from gateway.config import load_config
from gateway.policy_set import TrustPolicies
from tests.helpers.gateways import backend, gateway_config
from tests.helpers.reload_files import LABEL_SET, POLICY_SECTION, write

POLICY = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: p, version: "VERSION"}
spec:
  tenants: [acme]
  residency: {allow: ["*"]}
  retention: {max_days: any, training: true}
  fallback: {mode: when_private_unavailable, to: []}
  data_classes:
    phi:
      description: patient data
      fallback: {mode: never}
"""


def _files(tmp_path: Path) -> Path:
    policies = tmp_path / "policies"
    policies.mkdir()
    write(policies / "set.yaml", LABEL_SET.replace("HEADER", "x-sensitivity"), 1_000_000_000)
    write(policies / "p.yaml", POLICY.replace("VERSION", "1"), 1_000_000_000)
    return policies


def _trust(tmp_path: Path) -> tuple[TrustPolicies, Path]:
    policies = _files(tmp_path)
    config = gateway_config(
        [backend("gpu", "http://127.0.0.1:9", "m")], policy={"paths": ["policies"]}
    )
    trust = TrustPolicies(config, tmp_path)
    assert trust.current.data_class_header == "x-sensitivity"
    return trust, policies


def _settle(trust: TrustPolicies) -> None:
    for _ in range(3):
        trust.poll()


def test_removing_the_policy_set_never_changes_the_label_header(tmp_path: Path) -> None:
    trust, policies = _trust(tmp_path)
    failures = trust.reload_failures
    (policies / "set.yaml").unlink()
    _settle(trust)
    assert trust.current.data_class_header == "x-sensitivity", (
        "a reload read labels from another header: requests labelled phi lost their class"
    )
    assert trust.reload_failures == failures + 1
    assert trust.last_error is not None and "data_class_header" in trust.last_error
    assert trust.status()["last_reload_error"] == trust.last_error
    assert trust.current.decide("acme", "m", "phi").fallback == "never"


def test_editing_the_label_header_is_refused_until_a_restart(tmp_path: Path) -> None:
    trust, policies = _trust(tmp_path)
    write(policies / "set.yaml", LABEL_SET.replace("HEADER", "x-data-class"), 2_000_000_000)
    write(policies / "p.yaml", POLICY.replace("VERSION", "2"), 2_000_000_000)
    _settle(trust)
    assert trust.current.data_class_header == "x-sensitivity"
    assert trust.current.compiled("p").version == "1"  # the whole reload refused
    # The same header again: the next change loads
    write(policies / "set.yaml", LABEL_SET.replace("HEADER", "x-sensitivity"), 3_000_000_000)
    _settle(trust)
    assert trust.current.compiled("p").version == "2"
    assert trust.last_error is None


def _app_config(tmp_path: Path, *, with_policy: bool = True) -> tuple[Path, str]:
    path = tmp_path / "gateway.yaml"
    data = gateway_config([backend("gpu", "http://127.0.0.1:9", "m")]).model_dump(
        mode="json", exclude_none=True
    )
    text = yaml.safe_dump(data) + POLICY_SECTION
    write(path, text if with_policy else yaml.safe_dump(data), 1_000_000_000)
    return path, text


def test_a_config_reload_dropping_the_policy_files_keeps_the_label_header(
    tmp_path: Path,
) -> None:
    _files(tmp_path)
    path, text = _app_config(tmp_path)
    app = create_app(load_config(path), environ={}, config_dir=tmp_path, config_file=path)
    assert app.policies.latest().data_class_header == "x-sensitivity"
    reloader = app.reloader
    assert reloader is not None
    write(path, text.removesuffix(POLICY_SECTION), 2_000_000_000)  # the built-in policy
    assert not asyncio.run(reloader.reload())
    assert app.policies.latest().data_class_header == "x-sensitivity"
    assert app.parts.config.policy is not None
    assert reloader.last_error is not None
    assert "data_class_header" in reloader.last_error


def test_a_config_read_cut_short_at_start_takes_the_header_read_whole(tmp_path: Path) -> None:
    """Read at start cut before `policy:` (the built-in set, `x-data-class`), it served
    nothing (stale): the settled look installs the files' header, never wedged."""
    _files(tmp_path)
    path, text = _app_config(tmp_path, with_policy=False)
    read_at = time.time()
    torn = load_config(path)
    write(path, text, int(read_at * 1e9) + 1)
    app = create_app(
        torn, environ={}, config_dir=tmp_path, config_file=path, config_read_at=read_at
    )
    reloader = app.reloader
    assert reloader is not None and reloader.stale

    async def looks() -> list[bool]:
        return [await reloader.poll() for _ in range(2)]

    assert asyncio.run(looks()) == [False, True]
    assert not reloader.stale
    assert app.policies.latest().data_class_header == "x-sensitivity"


def test_a_set_read_cut_short_at_start_takes_the_header_read_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The PolicySet written after the read began (its file cut short, or not there yet):
    the set read served nothing (stale), so the header read whole is installed."""
    import gateway.policy.loader
    import gateway.policy_set

    policies = tmp_path / "policies"
    policies.mkdir()
    write(policies / "p.yaml", POLICY.replace("VERSION", "1"), 1_000_000_000)
    config = gateway_config(
        [backend("gpu", "http://127.0.0.1:9", "m")], policy={"paths": ["policies"]}
    )
    real = gateway.policy.loader.load_policies

    def read_then_written(*args: Any, **kwargs: Any) -> Any:
        read = real(*args, **kwargs)
        write(policies / "set.yaml", LABEL_SET.replace("HEADER", "x-sensitivity"), 2_000_000_000)
        return read

    monkeypatch.setattr(gateway.policy_set, "load_policies", read_then_written)
    trust = TrustPolicies(config, tmp_path)
    monkeypatch.setattr(gateway.policy_set, "load_policies", real)
    assert trust.stale and trust.current.data_class_header == "x-data-class"
    _settle(trust)
    assert not trust.stale, "a stale start was wedged on the header of what it read cut short"
    assert trust.current.data_class_header == "x-sensitivity"


def test_a_stale_single_process_says_what_it_is_in_the_openai_error_format(
    tmp_path: Path,
) -> None:
    """One process, its start read caught being written: 503 in the OpenAI error format,
    saying what happened; before, it claimed to be a worker older than its siblings."""
    import httpx

    from tests.helpers.gateways import TENANT_KEY

    _files(tmp_path)
    path, text = _app_config(tmp_path, with_policy=False)
    read_at = time.time()
    torn = load_config(path)
    write(path, text, int(read_at * 1e9) + 1)
    app = create_app(
        torn, environ={}, config_dir=tmp_path, config_file=path, config_read_at=read_at
    )

    app.ready = True  # started (its lifespan's watchers are not needed here)

    async def ask() -> httpx.Response:
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as http:
            return await http.post(
                "/v1/chat/completions",
                headers={"authorization": f"Bearer {TENANT_KEY}"},
                json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
            )

    answer = asyncio.run(ask())
    assert answer.status_code == 503
    error = answer.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"}
    assert "worker" not in error["message"], error["message"]
    assert "changing while read" in error["message"]


def test_a_config_file_dated_in_the_future_never_wedges_the_gateway_stale(
    tmp_path: Path,
) -> None:
    """Clock skew, `touch -d tomorrow`, a mount with odd mtimes: a file whose mtime is
    past the start reads as written since, so stale at start; the first settled look
    reads it whole and the gateway serves (its mtime still in the future)."""
    _files(tmp_path)
    path, _ = _app_config(tmp_path)
    tomorrow = int((time.time() + 86_400) * 1e9)
    os.utime(path, ns=(tomorrow, tomorrow))
    read_at = time.time()
    app = create_app(
        load_config(path), environ={}, config_dir=tmp_path, config_file=path, config_read_at=read_at
    )
    reloader = app.reloader
    assert reloader is not None and reloader.stale

    async def looks() -> None:
        for _ in range(3):
            await reloader.poll()

    asyncio.run(looks())
    assert not reloader.stale, "a file dated in the future left the gateway stale for good"
    assert not app.policies.stale
