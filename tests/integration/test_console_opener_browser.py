"""A web page of another origin that opens the console (`window.open`) keeps no handle on
it: the console's answers carry `Cross-Origin-Opener-Policy: same-origin`, so the page
the operator logs into is in a browsing context group of its own. Without it the opener
kept a live `WindowProxy` for as long as both tabs were open, and could navigate the
console tab, the token pasted and the pages in use, to a look-alike login page of its
own whenever it liked (`w.location = ...`: tab-nabbing for the admin token).

Debian's headless chromium; the console is the admin app in this process, the other
origin a page on another port of `localhost` (another site than 127.0.0.1)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gateway.app import admin_app, create_app
from gateway.config import GatewaySettings
from gateway.serving import ServerThread
from gateway.tenants import hash_api_key
from tests.helpers.admin import TOKENS
from tests.helpers.browser import Console, chromium, quit_browser
from tests.helpers.gateways import backend

pytestmark = pytest.mark.browser

_PAGE = b"<!doctype html><title>elsewhere</title><p>another site</p>"


async def _elsewhere(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Another site's page: a plain HTML document, whatever the path."""
    if scope["type"] != "http":
        return
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"text/html; charset=utf-8")],
        }
    )
    await send({"type": "http.response.body", "body": _PAGE})


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[str, str]]:
    config = {
        "backends": [backend("gpu", "http://127.0.0.1:9", "m")],
        "admin": {"tokens": [{"hash": hash_api_key(TOKENS["operator"]), "role": "operator"}]},
    }
    with (
        ServerThread(admin_app(create_app(GatewaySettings.model_validate(config)))) as admin,
        ServerThread(_elsewhere) as other,
    ):
        yield f"{admin.url}/console/", f"http://localhost:{other.port}/"


@pytest.fixture(scope="module")
def console(
    servers: tuple[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Console]:
    driver = chromium(tmp_path_factory.mktemp("downloads"))
    try:
        yield Console(driver, servers[0], tmp_path_factory.mktemp("unused"))
    finally:
        quit_browser(driver)


def test_a_page_that_opens_the_console_keeps_no_handle_on_it(
    console: Console, servers: tuple[str, str]
) -> None:
    url, elsewhere = servers
    driver = console.driver
    driver.get(elsewhere)
    opener = driver.current_window_handle
    driver.execute_script("window.opened = window.open(arguments[0], '_blank')", url)
    console.wait(lambda d: len(d.window_handles) == 2, "the console's tab")
    tab = next(handle for handle in driver.window_handles if handle != opener)
    driver.switch_to.window(tab)
    console.find("#token")  # the console loaded in it
    console.wait(lambda d: d.find_element("id", "token").is_displayed(), "the login form")
    driver.switch_to.window(opener)
    # The opener's handle on the console's tab: severed (it reads as closed), so it can
    # neither navigate that tab nor learn anything of it.
    assert driver.execute_script("return window.opened.closed") is True
    assert console.errors() == []
