"""`owngate serve` settles its heap before the first request (gateway/serving.py
`settle_heap`): what startup built is frozen out of the cyclic collector's walks; the
collector's thresholds stay CPython's, which bound the memory that reference cycles
left by requests hold."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest

from gateway.cli import serve
from gateway.cli._common import load_or_report


def test_settle_heap_freezes_startup_and_keeps_the_thresholds(collector: None) -> None:
    from gateway import serving

    gc.unfreeze()
    gc.set_threshold(700, 10, 10)
    serving.settle_heap()
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == (700, 10, 10)


def test_a_cycle_holding_a_body_is_freed_within_the_young_threshold(collector: None) -> None:
    """What a refused request may leave: a reference cycle holding its body. After
    `settle_heap` it is still freed by the first young collection, as often as before
    (a raised young threshold would let hundreds of such bodies pile up unseen)."""
    import weakref

    from gateway import serving

    gc.unfreeze()
    gc.set_threshold(700, 10, 10)
    serving.settle_heap()

    class Holder:
        pass

    holder = Holder()
    holder.body = b"x" * 100_000  # type: ignore[attr-defined]
    holder.me = holder  # type: ignore[attr-defined]
    gone = weakref.ref(holder)
    del holder
    made: list[list[Any]] = []
    # tracked allocations kept alive (the count grows), twice CPython's young threshold
    for _ in range(2 * 700):
        made.append([])
        if gone() is None:
            break
    assert gone() is None, "a young collection did not run within the threshold"


def test_serve_settles_the_heap_before_it_serves(
    collector: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gateway import serving

    gc.unfreeze()
    gc.set_threshold(700, 10, 10)
    config_file = tmp_path / "gateway.yaml"
    config_file.write_text(
        "listen: {host: 127.0.0.1, port: 0}\n"
        "backends:\n"
        "  - {id: sim, kind: vllm, base_url: 'http://127.0.0.1:9', models: [{name: m}],\n"
        "     region: local, owner: me}\n"
        "tenants:\n"
        "  - {id: t, api_key_hashes: ['sha256:" + "0" * 64 + "'], models: ['*']}\n"
    )
    config = load_or_report(str(config_file))
    assert config is not None
    seen: dict[str, Any] = {}

    def run_beside(server: Any, sockets: Any, *rest: Any) -> None:
        seen["frozen"] = gc.get_freeze_count()
        seen["threshold"] = gc.get_threshold()

    monkeypatch.setattr(serving, "run_beside", run_beside)
    serve._serve(str(config_file), config, "127.0.0.1", 0, None)
    assert seen["frozen"] > 0
    assert seen["threshold"] == (700, 10, 10)
