"""`owngate_backend_inflight` is read from the router's count at scrape time: a request
sets no gauge on its way in and out, and /metrics still shows what is in flight."""

from __future__ import annotations

from pathlib import Path

from gateway.app import assemble
from tests.helpers.gateways import backend, gateway_config


def _inflight_lines(text: str) -> list[str]:
    return sorted(
        line for line in text.splitlines() if line.startswith("owngate_backend_inflight{")
    )


def test_the_inflight_gauge_is_the_routers_count_when_scraped(tmp_path: Path) -> None:
    config = gateway_config(
        [backend("gpu", "http://127.0.0.1:9", "m"), backend("cpu", "http://127.0.0.1:9", "m")]
    )
    parts = assemble(config, {}, config_dir=tmp_path)
    parts.metrics.watch_backends(parts.registry, parts.scraper)
    gpu = parts.registry.backends["gpu"]
    gpu.inflight = 3  # as the router's plans keep it (`Router._enter`, `_leave`)
    assert _inflight_lines(parts.metrics.render().decode()) == [
        'owngate_backend_inflight{backend="cpu"} 0.0',
        'owngate_backend_inflight{backend="gpu"} 3.0',
    ]
    gpu.inflight = 1
    assert 'owngate_backend_inflight{backend="gpu"} 1.0' in parts.metrics.render().decode()
