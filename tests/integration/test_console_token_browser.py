"""The web console (gateway/admin/console/) in a real browser with a token the admin API
refuses: a wrong one at login, and one revoked while its page is open (taken out of
`admin.tokens` and the config reloaded). Either way the console shows the login form
with the API's reason, forgets the token (sessionStorage) and shows none of the data
the token no longer may read. Also: a revoked key the config still lists shows as
revoked in the key list. Debian's headless chromium against a real `owngate serve`
(tests/helpers/admin.py `serve_admin`); screenshots as test_console_browser.py keeps."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import yaml
from selenium.webdriver.common.by import By

from gateway.tenants import hash_api_key
from tests.helpers.admin import TOKENS, Served, bearer, serve_admin
from tests.helpers.browser import Console, chromium, quit_browser
from tests.helpers.processes import KEY

pytestmark = pytest.mark.browser

_TOKEN_KEY = "owngate.console.token"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serve_admin(tmp_path_factory.mktemp("console-token")) as gateway:
        yield gateway


@pytest.fixture(scope="module")
def console(served: Served, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    downloads = tmp_path_factory.mktemp("downloads")
    driver = chromium(downloads)
    try:
        yield Console(driver, f"{served.admin}/console/", downloads)
    finally:
        quit_browser(driver)


def _stored_token(console: Console) -> object:
    return console.driver.execute_script("return sessionStorage.getItem(arguments[0])", _TOKEN_KEY)


def _logged_out(console: Console, reason: str) -> None:
    """The login form shows `reason`; no page, no nav, no token kept."""
    console.wait(lambda d: d.find_element(By.ID, "login").is_displayed(), "the login form")
    console.wait_text("#login-error", lambda t: reason in t, "the API's reason at the login")
    assert not console.find("#nav").is_displayed()
    assert console.text("#page") == ""
    assert _stored_token(console) is None


def test_a_wrong_token_is_refused_at_the_login(console: Console) -> None:
    console.driver.get(console.url + "#operator")
    field = console.find("#token")
    console.wait(lambda d: field.is_displayed(), "the login form")
    field.send_keys("og-admin-not-a-token")
    console.find("#login-submit").click()
    _logged_out(console, "Incorrect admin token")
    console.screenshot("console-wrong-token")


def test_a_token_revoked_while_its_page_is_open_logs_out(console: Console, served: Served) -> None:
    console.login(TOKENS["operator"], "operator")
    console.find('[data-backend="gpu"]')  # the operator's live data
    config = yaml.safe_load(served.process.path.read_text())
    config["admin"]["tokens"] = [t for t in config["admin"]["tokens"] if t["role"] != "operator"]
    served.process.path.write_text(yaml.safe_dump(config))
    reloaded = httpx.post(f"{served.admin}/admin/v1/reload", headers=bearer("admin"), timeout=30)
    assert reloaded.status_code == 200, reloaded.text
    assert served.get("/admin/v1/status", "operator").status_code == 401
    _logged_out(console, "Incorrect admin token")  # the page's next poll got the 401
    assert console.driver.find_elements(By.CSS_SELECTOR, '[data-backend="gpu"]') == []
    console.screenshot("console-revoked-token")


def test_a_revoked_key_the_config_still_lists_shows_as_revoked(
    console: Console, served: Served
) -> None:
    """A key inline in gateway.yaml stays there when revoked (the keys file alone is
    edited): the list must not show it as a working key."""
    digest = hash_api_key(KEY)
    prefix = digest[7:19]
    assert served.get("/admin/v1/keys", "security").json()["keys"] == [
        {"tenant": "acme", "hash_prefix": prefix, "revoked": False}
    ]
    revoked = httpx.delete(
        f"{served.admin}/admin/v1/keys/{digest}", headers=bearer("security"), timeout=30
    )
    assert revoked.status_code == 200, revoked.text
    assert served.chat().status_code == 401
    assert served.get("/admin/v1/keys", "security").json()["keys"] == [
        {"tenant": "acme", "hash_prefix": prefix, "revoked": True}
    ]
    console.login(TOKENS["security"], "security")
    state = f'[data-key-state="{prefix}"]'
    console.wait_text(state, lambda t: t.startswith("revoked"), "the key shown as revoked")
    console.screenshot("console-revoked-inline-key")
