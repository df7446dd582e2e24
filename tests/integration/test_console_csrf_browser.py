"""A web page of another origin, in a real browser on the operator's host, cannot use a
demo gateway's admin API (`admin.allow_loopback`: loopback clients need no token).

Headless chromium resolves `evil.test` to 127.0.0.1 (`--host-resolver-rules`), which
stands for both attacks: a page of `http://evil.test:PORT` posting cross-site to
`http://127.0.0.1:PORT/admin/v1/drain` (a `no-cors` fetch, as a form post: no token, no
preflight), and a DNS name rebound to 127.0.0.1 (the page at `http://evil.test:PORT`,
the admin listener's port, is then same-origin with it and may read what it calls).
The cross-site page is a blank one from another port (no Content-Security-Policy: the
console's would stop its cross-origin fetch before it is sent); the rebound page is the
console's own static `index.html`, which the listener serves without a token. Either
way the script the test runs in it is the attacker's. Whether the gateway drained is
read by a local tool (httpx), as `owngate status` would."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.app import admin_app, create_app
from gateway.config import GatewaySettings
from gateway.serving import ServerThread
from tests.helpers.browser import chromium, quit_browser
from tests.helpers.gateways import backend

pytestmark = pytest.mark.browser

# Runs in the page: `fetch(url, init)`, then the callback gets its status (0: opaque).
FETCH = """
const [url, init, done] = arguments;
fetch(url, init).then((r) => done(r.status), (e) => done(String(e)));
"""


async def _blank(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The attacker's site: an empty HTML page at every path."""
    if scope["type"] != "http":
        return
    headers = [(b"content-type", b"text/html"), (b"content-length", b"0")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b""})


@pytest.fixture(scope="module")
def admin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, str, str]]:
    config = {
        "backends": [backend("gpu", "http://127.0.0.1:9", "m")],
        "admin": {"allow_loopback": True},
    }
    app = admin_app(create_app(GatewaySettings.model_validate(config)))
    downloads = tmp_path_factory.mktemp("downloads")
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(ServerThread(app))
        site = stack.enter_context(ServerThread(_blank))
        driver = chromium(downloads, "--host-resolver-rules=MAP evil.test 127.0.0.1")
        stack.callback(quit_browser, driver)
        driver.set_script_timeout(30)
        yield driver, server.url, f"http://evil.test:{site.port}/"


def _draining(url: str) -> bool:
    """What a local tool reads: whether the gateway drains."""
    status = httpx.get(f"{url}/admin/v1/status", timeout=30)
    assert status.status_code == 200, status.text
    return bool(status.json()["draining"])


def _in_page(driver: Any, page: str, url: str, init: dict[str, Any]) -> Any:
    driver.get(page)
    return driver.execute_async_script(FETCH, url, init)


def test_a_cross_site_post_does_not_drain(admin: tuple[Any, str, str]) -> None:
    driver, url, site = admin
    sent = _in_page(
        driver,
        site,
        f"{url}/admin/v1/drain",
        {"method": "POST", "mode": "no-cors", "body": "x=1"},
    )
    assert sent == 0  # the opaque answer of a no-cors request: it went out
    assert not _draining(url)


def test_a_rebound_name_gets_no_access(admin: tuple[Any, str, str]) -> None:
    driver, url, _ = admin
    port = url.rsplit(":", 1)[1]
    rebound = f"http://evil.test:{port}"
    assert _in_page(driver, f"{rebound}/console/", f"{rebound}/admin/v1/whoami", {}) == 401
    drained = driver.execute_async_script(FETCH, f"{rebound}/admin/v1/drain", {"method": "POST"})
    assert drained == 401
    assert not _draining(url)


def test_the_listeners_own_page_is_still_a_loopback_client(
    admin: tuple[Any, str, str],
) -> None:
    driver, url, _ = admin
    assert _in_page(driver, f"{url}/console/", f"{url}/admin/v1/whoami", {}) == 200
