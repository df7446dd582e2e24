"""Every module declares its public surface in `__all__`, and every name there exists."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import gateway

MODULES = sorted(
    info.name
    for info in pkgutil.walk_packages(gateway.__path__, "gateway.")
    if info.name != "gateway.__main__"
)


@pytest.mark.parametrize("name", MODULES)
def test_module_declares_all(name: str) -> None:
    module = importlib.import_module(name)
    declared = getattr(module, "__all__", None)
    assert declared is not None, f"{name} has no __all__"
    missing = [item for item in declared if not hasattr(module, item)]
    assert not missing, f"{name}.__all__ names missing objects: {missing}"


def test_top_level_packages_export_their_entry_points() -> None:
    from gateway import app, config, sim

    assert {"assemble", "create_app"} <= set(app.__all__)
    assert {"load_config", "parse_config", "ConfigError"} <= set(config.__all__)
    assert {"create_sim_app", "SimSettings", "Faults"} <= set(sim.__all__)
