"""The operators' page counts each backend's requests by its id: a backend whose id is
the name of a property every JavaScript object inherits (`constructor`, `toString`,
`valueOf`: valid backend ids) shows its own count, never the inherited function's text
(`function Object() { [native code] }2` was its "requests (window)" cell).

Debian's headless chromium against the admin app in this process (its timeline given one
sample of known request counts, as the sampler records them); screenshots as
test_console_browser.py keeps."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.admin.timeline import BACKEND_FIELDS
from gateway.app import admin_app, create_app
from gateway.config import GatewaySettings
from gateway.serving import ServerThread
from gateway.tenants import hash_api_key
from tests.helpers.admin import TOKENS
from tests.helpers.browser import Console, chromium, quit_browser
from tests.helpers.gateways import backend

pytestmark = pytest.mark.browser

# Inherited by every object; `hasOwnProperty` too, and an ordinary id beside them.
REQUESTS = {"constructor": 2, "toString": 3, "valueOf": 4, "hasOwnProperty": 5, "gpu": 6}


def _row(requests: int) -> tuple[Any, ...]:
    values: dict[str, Any] = dict.fromkeys(BACKEND_FIELDS)
    values.update(inflight=0, breaker="closed", requests=requests, errors=0)
    return tuple(values[name] for name in BACKEND_FIELDS)


@pytest.fixture(scope="module")
def admin() -> Iterator[ServerThread]:
    config = {
        "backends": [backend(name, "http://127.0.0.1:9", "m") for name in REQUESTS],
        "tenants": [{"id": "acme", "models": ["*"]}],
        # the sampler's own samples (no request served: zero each) add nothing to the
        # counts of the one given below
        "admin": {"tokens": [{"hash": hash_api_key(TOKENS["operator"]), "role": "operator"}]},
    }
    app = admin_app(create_app(GatewaySettings.model_validate(config)))
    sample = {name: _row(count) for name, count in REQUESTS.items()}
    app.state.timeline._backends.append((time.time(), sample))
    with ServerThread(app) as server:
        yield server


@pytest.fixture(scope="module")
def console(admin: ServerThread, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    driver = chromium(tmp_path_factory.mktemp("downloads"))
    try:
        yield Console(driver, f"{admin.url}/console/", tmp_path_factory.mktemp("unused"))
    finally:
        quit_browser(driver)


def test_a_backend_named_like_an_inherited_property_shows_its_own_count(
    console: Console,
) -> None:
    console.login(TOKENS["operator"], "operator")
    for name, count in REQUESTS.items():
        shown = console.wait_text(
            f'[data-requests="{name}"]', lambda t: t != "-", f"the request count of {name}"
        )
        assert shown == str(count), (name, shown)
    assert console.errors() == []
