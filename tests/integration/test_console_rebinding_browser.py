"""The console sends no admin token from a page a DNS name could have been rebound under.

An attacker's name (`evil.test`) that resolves to the admin listener while the operator
opens `http://evil.test:PORT/console/` serves the real console; once the operator pastes
a token, the name is pointed at the attacker's server and the console's next call carries
the token there. The console now refuses to keep or send a token on a plain-HTTP page
under a DNS name (an IP address, `localhost` and HTTPS are not rebindable) and says why.

Headless chromium resolves `evil.test` to 127.0.0.1 (`--host-resolver-rules`); the admin
app is wrapped so the test sees every `Authorization` header that reached the listener.
Before the fix the login succeeded under the rebound name and whoami carried the token."""

from __future__ import annotations

import contextlib
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

_TOKEN_KEY = "owngate.console.token"


class _Seen:
    """The admin app, noting the path of each request that carried `Authorization`."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.authorized: list[tuple[str, str]] = []  # (Host, path)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            if b"authorization" in headers:
                host = headers.get(b"host", b"").decode("latin-1")
                self.authorized.append((host, scope["path"]))
        await self.app(scope, receive, send)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Console, _Seen, int]]:
    config = {
        "backends": [backend("gpu", "http://127.0.0.1:9", "m")],
        "admin": {"tokens": [{"hash": hash_api_key(TOKENS["operator"]), "role": "operator"}]},
    }
    seen = _Seen(admin_app(create_app(GatewaySettings.model_validate(config))))
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(ServerThread(seen))
        driver = chromium(
            tmp_path_factory.mktemp("downloads"), "--host-resolver-rules=MAP evil.test 127.0.0.1"
        )
        stack.callback(quit_browser, driver)
        console = Console(driver, f"{server.url}/console/", tmp_path_factory.mktemp("unused"))
        yield console, seen, server.port


# `evil.test`: the rebound name; `evil.localhost`: loopback in chromium, a DNS name elsewhere.
@pytest.mark.parametrize("name", ["evil.test", "evil.localhost"])
def test_a_rebound_name_gets_no_token(served: tuple[Console, _Seen, int], name: str) -> None:
    console, seen, port = served
    driver = console.driver
    driver.get(f"http://{name}:{port}/console/#operator")
    field = console.find("#token")
    console.wait(lambda d: field.is_displayed(), "the login form")
    field.send_keys(TOKENS["operator"])
    console.find("#login-submit").click()
    said = console.wait_text("#login-error", lambda t: "DNS rebinding" in t, "the refusal")
    assert name in said
    assert driver.execute_script("return sessionStorage.getItem(arguments[0])", _TOKEN_KEY) is None
    assert console.find("#token").is_displayed()  # still the login form, no page
    # The listener saw the page load but no call with a token from the rebound name.
    assert [path for host, path in seen.authorized if host.startswith(name)] == []
    # The refusal is no script error and no failed call. Chromium ignores (and logs) the
    # Cross-Origin-Opener-Policy header on an origin it does not deem trustworthy.
    errors = [e for e in console.errors() if "Cross-Origin-Opener-Policy" not in e["message"]]
    assert errors == []


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_the_console_still_logs_in_at_loopback(
    served: tuple[Console, _Seen, int], host: str
) -> None:
    console, seen, port = served
    console.url = f"http://{host}:{port}/console/"
    console.login(TOKENS["operator"], "operator")
    assert any(h.startswith(host) and p == "/admin/v1/whoami" for h, p in seen.authorized)
    assert console.errors() == []
