"""`Registry.moved`: whether the newest config reaches one of an older config's backends
somewhere else, under other TLS trust or with another sidecar key
(gateway/routing/registry.py). A request planned before a reload skips such a backend
(tests/integration/test_reload_backend_reach.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.provenance import write_signing_key
from gateway.routing.registry import Registry
from tests.helpers.gateways import backend, gateway_config
from tests.helpers.tls import Pki

OLD = "https://127.0.0.1:8443"


def build(tmp_path: Path, gpu: dict[str, Any], **extra: Any) -> Registry:
    config = gateway_config([gpu, backend("other", "http://127.0.0.1:9000", "m")], **extra)
    return Registry.build(config, config_dir=tmp_path)


def gpu(url: str = OLD, **extra: Any) -> dict[str, Any]:
    return backend("gpu", url, "m", kind="openai", **extra)


@pytest.fixture
def pins(tmp_path: Path) -> tuple[str, str]:
    pki = Pki.create(tmp_path)  # writes ca.pem there
    return pki.server().pin, pki.server().pin


Config = Callable[[str, str], dict[str, Any]]  # of the pins A and B
CHANGES: dict[str, tuple[Config, Config]] = {
    "base_url host": (lambda a, b: gpu(), lambda a, b: gpu("https://127.0.0.2:8443")),
    "base_url port": (lambda a, b: gpu(), lambda a, b: gpu("https://127.0.0.1:8444")),
    "base_url path": (lambda a, b: gpu(), lambda a, b: gpu(f"{OLD}/v2")),
    "scheme": (lambda a, b: gpu(), lambda a, b: gpu("http://127.0.0.1:8443")),
    "pin rotated": (
        lambda a, b: gpu(tls={"ca_file": "ca.pem", "pin_spki_sha256": [a]}),
        lambda a, b: gpu(tls={"ca_file": "ca.pem", "pin_spki_sha256": [b]}),
    ),
    "pin added": (
        lambda a, b: gpu(tls={"ca_file": "ca.pem"}),
        lambda a, b: gpu(tls={"ca_file": "ca.pem", "pin_spki_sha256": [a]}),
    ),
    "own CA": (lambda a, b: gpu(), lambda a, b: gpu(tls={"ca_file": "ca.pem"})),
    "server_name": (
        lambda a, b: gpu(tls={"ca_file": "ca.pem"}),
        lambda a, b: gpu(tls={"ca_file": "ca.pem", "server_name": "gpu.internal"}),
    ),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_backend_reached_elsewhere_or_otherwise_is_moved(
    tmp_path: Path, pins: tuple[str, str], change: str
) -> None:
    before, after = CHANGES[change]
    old, new = build(tmp_path, before(*pins)), build(tmp_path, after(*pins))
    assert old.moved("gpu") is None  # no reload yet
    old.successor = new
    assert old.moved("gpu") == "gpu: its address or TLS settings changed by a config reload"
    assert old.moved("other") is None  # rebuilt, reached the same way
    assert new.moved("gpu") is None  # the newest config's own


def test_a_replaced_ca_file_moves_the_backend(tmp_path: Path) -> None:
    Pki.create(tmp_path)
    old = build(tmp_path, gpu(tls={"ca_file": "ca.pem"}))
    Pki.create(tmp_path, "another CA")  # the same file name, other contents
    old.successor = build(tmp_path, gpu(tls={"ca_file": "ca.pem"}))
    assert old.moved("gpu") is not None


def test_a_backend_rebuilt_the_same_or_kept_is_not_moved(tmp_path: Path) -> None:
    old = build(tmp_path, gpu())
    # other limits rebuild every backend; its address and trust are the same
    new = build(tmp_path, gpu(), limits={"connect_timeout_s": 5})
    old.successor = new
    assert old.moved("gpu") is None
    new.backends["gpu"] = old.backends["gpu"]  # kept by the reload (`assemble`)
    assert old.moved("gpu") is None
    assert old.moved("unknown") is None  # not one of its backends


def test_the_newest_config_decides_after_several_reloads(tmp_path: Path) -> None:
    first = build(tmp_path, gpu())
    second = first.successor = build(tmp_path, gpu("http://127.0.0.1:7000"))
    assert first.moved("gpu") is not None
    second.successor = build(tmp_path, gpu())  # moved back where `first` reaches it
    assert first.moved("gpu") is None
    assert second.moved("gpu") is not None
    removed = build(tmp_path, gpu())
    removed.backends.pop("gpu")
    second.successor.successor = removed
    assert first.moved("gpu") == "gpu: removed by a config reload"


def test_a_backend_whose_attest_key_changed_is_moved(tmp_path: Path) -> None:
    """Its sidecar's key rotated (the old one may have leaked): a request planned before
    the reload would accept countersignatures by the old key from it."""
    old_key = write_signing_key(tmp_path / "old.key", "gpu")
    new_key = write_signing_key(tmp_path / "new.key", "gpu")
    old = build(tmp_path, gpu(attest={"key": old_key}))
    old.successor = build(tmp_path, gpu(attest={"key": new_key}))
    assert old.moved("gpu") == "gpu: its attest key changed by a config reload"
    assert old.moved("other") is None
    old.successor = build(tmp_path, gpu(attest={"key": old_key}))  # the same key again
    assert old.moved("gpu") is None
