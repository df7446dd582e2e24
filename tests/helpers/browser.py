"""Driving the web console in Debian's headless chromium (selenium 4), and keeping its
screenshots as test artifacts.

The browser is the system's (`prerequisites.browser()`: the `browser` marker), driven by
the system's chromedriver; `SE_OFFLINE=true` keeps selenium-manager from downloading
anything. Every wait is a bounded WebDriverWait on a condition, never a sleep.
Screenshots go to `$OWNGATE_TEST_ARTIFACTS` when set, else `test-artifacts/console/` at
the repository root (tests/README.md).
"""

from __future__ import annotations

import gc
import os
import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

from tests.helpers.paths import REPO_ROOT
from tests.helpers.prerequisites import browser

__all__ = ["Console", "artifacts_dir", "chromium", "quit_browser"]

WAIT_S = 15.0
_TOKEN_KEY = "owngate.console.token"  # where gateway/admin/console/api.js keeps the token


def artifacts_dir() -> Path:
    """Where the console's screenshots go (made if absent)."""
    configured = os.environ.get("OWNGATE_TEST_ARTIFACTS")
    directory = Path(configured) if configured else REPO_ROOT / "test-artifacts" / "console"
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def chromium(downloads: Path, *arguments: str) -> webdriver.Chrome:
    """Headless chromium (the system's), with its console log kept for `Console.errors`
    and its downloads saved in `downloads`; `arguments`: more command-line switches."""
    binary, driver = browser()
    os.environ["SE_OFFLINE"] = "true"  # selenium-manager: never download a browser or driver
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--window-size=1400,1800",
        "--disable-gpu",
        *arguments,
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    options.add_experimental_option(
        "prefs",
        {"download.default_directory": str(downloads), "download.prompt_for_download": False},
    )
    return webdriver.Chrome(service=Service(driver), options=options)


def quit_browser(driver: webdriver.Chrome) -> None:
    """End the browser and its chromedriver. Selenium stops chromedriver with an
    `urlopen(.../shutdown)` whose answer it never closes: its socket is reclaimed later,
    in whatever test the garbage collector then runs in, as an unclosed-socket
    ResourceWarning (an error under this suite's filterwarnings). It is collected here,
    with that one warning ignored, so it cannot fail an unrelated test."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "unclosed <socket", ResourceWarning)
        driver.quit()
        gc.collect()


class Console:
    """The console at `url` (…/console/) in `driver`, which saves downloads in
    `downloads`."""

    def __init__(self, driver: webdriver.Chrome, url: str, downloads: Path) -> None:
        self.driver = driver
        self.url = url
        self.downloads = downloads

    def wait(self, condition: Callable[[Any], Any], what: str) -> Any:
        try:
            # An element replaced between finding it and reading it (a page re-rendering
            # what it shows) is stale: the condition is simply asked again.
            waiting = WebDriverWait(
                self.driver, WAIT_S, ignored_exceptions=(StaleElementReferenceException,)
            )
            return waiting.until(condition)
        except TimeoutException:
            self.screenshot("timeout-" + re.sub(r"[^A-Za-z0-9]+", "-", what)[:40])
            raise AssertionError(
                f"waited {WAIT_S}s for {what}; the page shows:\n{self.text()[:2000]}"
            ) from None

    def find(self, css: str) -> WebElement:
        found: WebElement = self.wait(lambda d: d.find_element(By.CSS_SELECTOR, css), css)
        return found

    def text(self, css: str = "body") -> str:
        return str(self.driver.find_element(By.CSS_SELECTOR, css).text)

    def wait_text(self, css: str, predicate: Callable[[str], bool], what: str) -> str:
        """The text of `css` once `predicate` holds for it."""

        def ready(driver: Any) -> str | None:
            found = driver.find_elements(By.CSS_SELECTOR, css)
            texts = [element.text for element in found]
            return next((text for text in texts if predicate(text)), None)

        return str(self.wait(ready, what))

    def login(self, token: str, page: str) -> None:
        """`page` freshly loaded with `token`: when another token is in use, log out (the
        button forgets it) and log in with `token`. Logging out under the same token
        is skipped: the page's polls still in flight would end in a 401 in the log."""
        self.driver.get(self.url + "#" + page)
        if (
            self.driver.execute_script("return sessionStorage.getItem(arguments[0])", _TOKEN_KEY)
            == token
        ):
            self.find(f'#page[data-page="{page}"]')
            return
        logout = self.driver.find_element(By.ID, "logout")
        if logout.is_displayed():
            logout.click()
        field = self.find("#token")
        self.wait(lambda d: field.is_displayed(), "the login form")
        field.send_keys(token)
        self.find("#login-submit").click()
        self.find(f'#page[data-page="{page}"]')

    def go(self, page: str) -> None:
        self.driver.get(self.url + "#" + page)
        self.find(f'#page[data-page="{page}"]')

    def screenshot(self, name: str) -> Path:
        path = artifacts_dir() / f"{name}.png"
        self.driver.save_screenshot(str(path))
        return path

    def errors(self) -> list[dict[str, Any]]:
        """SEVERE entries in the browser's console log since the last call: a script
        error, a module or asset that failed to load or that the CSP refused, an API call
        that failed (the pages know a role's 403 from whoami and do not make the call)."""
        entries: list[dict[str, Any]] = self.driver.get_log("browser")  # type: ignore[no-untyped-call]  # selenium leaves it unannotated
        return [entry for entry in entries if entry["level"] == "SEVERE"]
