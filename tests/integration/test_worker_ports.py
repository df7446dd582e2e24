"""Tests hand out ports outside the kernel's ephemeral range, and under pytest-xdist each
worker ports of its own (tests/helpers/net.py): a port `free_port` picked and released
could be taken by a bind(0) or connect() (another worker's, or a server of the same run)
before the test's server bound it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.net import free_port, free_ports

WORKER_PORTS_LOW = 10000


def ephemeral_low() -> int:
    return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])


@pytest.mark.parametrize("worker", range(4))
def test_each_worker_hands_out_its_own_ports_below_the_kernels_range(
    monkeypatch: pytest.MonkeyPatch, worker: int
) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{worker}")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "4")
    width = (ephemeral_low() - WORKER_PORTS_LOW) // 4
    own = range(WORKER_PORTS_LOW + worker * width, WORKER_PORTS_LOW + (worker + 1) * width)
    ports = [free_port() for _ in range(40)] + free_ports(20)
    assert [port for port in ports if port not in own] == []
    assert len(set(ports)) == len(ports)  # in turn: none again soon


def test_outside_xdist_ports_are_below_the_kernels_range_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # One process's servers take ports from the kernel's range as well (a raw backend's
    # bind(0)): a port picked there could be one by the time a slow subprocess binds it.
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    ports = [free_port() for _ in range(40)] + free_ports(20)
    assert all(WORKER_PORTS_LOW <= port < ephemeral_low() for port in ports)
    assert len(set(ports)) == len(ports)  # in turn: none again soon
