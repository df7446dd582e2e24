"""Fixtures the backend TLS tests share: a simulator (`sim`), a test CA made with
`gateway.pki` (`pki`), and `start_front`, which starts a TLS-terminating relay
(`TLSFront`) before the simulator and stops every one it started. A test module imports
them by name (`from tests.helpers.tls_fixtures import pki, sim, start_front`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.gateways import Sim
from tests.helpers.tls import Pki, TLSFront


@pytest.fixture
def sim(start_sim: Callable[..., Sim]) -> Sim:
    return start_sim("vllm", models=("m",), zero_latency=True)


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki.create(tmp_path / "pki")


@pytest.fixture
def start_front(sim: Sim) -> Iterator[Callable[[Any], TLSFront]]:
    started: list[TLSFront] = []

    def start(context: Any) -> TLSFront:
        front = TLSFront((sim.server.host, sim.server.port), context).start()
        started.append(front)
        return front

    yield start
    for front in started:
        front.stop()
