"""The web console's assets over the admin listener (gateway/admin/console_routes.py):
served without a token (they hold no data) with a strict Content-Security-Policy and the
other security headers, only the fixed set of names (no path reaches another file), no
inline script or style and nothing from another origin in the page, and no way for data
to reach the DOM as markup (no innerHTML and friends in the scripts). The pages
themselves run in a real browser in test_console_browser.py."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import httpx
import pytest

from gateway.admin.console_routes import ASSET_DIR, ASSETS
from gateway.app import admin_app, create_app
from gateway.serving import ServerThread
from tests.helpers.gateways import backend, gateway_config
from tests.helpers.raw_http import exchange


@pytest.fixture(scope="module")
def admin() -> Iterator[ServerThread]:
    config = gateway_config([backend("gpu", "http://127.0.0.1:9", "m")])
    with ServerThread(admin_app(create_app(config))) as server:
        yield server


def test_every_asset_is_served_with_its_type_and_the_security_headers(
    admin: ServerThread,
) -> None:
    assert sorted(path.name for path in ASSET_DIR.iterdir()) == sorted(ASSETS)
    for name, media_type in {**ASSETS, "": ASSETS["index.html"]}.items():
        answer = httpx.get(f"{admin.url}/console/{name}", timeout=10)
        assert answer.status_code == 200, name
        assert answer.headers["content-type"] == media_type
        assert answer.content == (ASSET_DIR / (name or "index.html")).read_bytes()
        csp = answer.headers["content-security-policy"]
        assert csp.startswith("default-src 'self';")
        assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
        assert "frame-ancestors 'none'" in csp
        assert answer.headers["x-content-type-options"] == "nosniff"
        assert answer.headers["x-frame-options"] == "DENY"
        assert answer.headers["referrer-policy"] == "no-referrer"
        assert answer.headers["cache-control"] == "no-store"


def test_console_without_a_slash_redirects_to_the_page(admin: ServerThread) -> None:
    answer = httpx.get(f"{admin.url}/console", timeout=10)
    assert answer.status_code == 308
    assert answer.headers["location"] == "/console/"


def test_docs_redirects_to_the_consoles_api_page_on_this_origin(admin: ServerThread) -> None:
    """FastAPI's `/docs` (Swagger UI from a CDN) is replaced by the console's API page."""
    answer = httpx.get(f"{admin.url}/docs", timeout=10)
    assert answer.status_code == 308
    assert answer.headers["location"] == "/console/#api"  # a path: this origin, no CDN
    assert answer.headers["content-security-policy"].startswith("default-src 'self';")
    page = httpx.get(f"{admin.url}/docs", timeout=10, follow_redirects=True)
    assert page.status_code == 200 and str(page.url) == f"{admin.url}/console/#api"
    assert page.content == (ASSET_DIR / "index.html").read_bytes()
    assert httpx.get(f"{admin.url}/redoc", timeout=10).status_code == 404


@pytest.mark.parametrize(
    "path",
    [
        "/console/../openapi.json",
        "/console/%2e%2e/openapi.json",
        "/console/%2e%2e%2fopenapi.json",
        "/console/..%2f..%2fpyproject.toml",
        "/console//etc/passwd",
        "/console/%2fetc%2fpasswd",
        "/console/console_routes.py",
        "/console/../console_routes.py",
        "/console/%2e%2e%2fconsole_routes.py",
        "/console/app.js/",
        "/console/APP.JS",
        "/console/index.html%00",
        "/console/.",
    ],
)
def test_only_the_fixed_asset_names_are_served(admin: ServerThread, path: str) -> None:
    """Sent byte for byte (an HTTP client would resolve the dot segments itself)."""
    head = f"GET {path} HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n"
    (answer,) = exchange(admin.port, head.encode(), half_close=False).final
    assert answer.status != 200, (path, answer.describe())
    if answer.status == 404:
        assert json.loads(answer.body)["error"]["code"] == "not_found"
    assert b"import" not in answer.body and b"root:" not in answer.body


def test_the_page_has_no_inline_script_or_style_and_nothing_from_elsewhere() -> None:
    page = (ASSET_DIR / "index.html").read_text()
    assert re.findall(r"<script[^>]*>", page) == ['<script type="module" src="app.js">']
    assert "<style" not in page and " style=" not in page
    assert not re.findall(r"\son[a-z]+\s*=", page, re.IGNORECASE)  # no inline handler
    every = "\n".join((ASSET_DIR / name).read_text() for name in ASSETS)
    assert not re.findall(
        r"(?:https?:)?//[a-z0-9.-]+\.[a-z]{2,}/", every.replace("http://www.w3.org/2000/svg", "")
    )
    # the scripts build the DOM from data as text: no markup sink anywhere
    scripts = "\n".join((ASSET_DIR / n).read_text() for n in ASSETS if n.endswith(".js"))
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in scripts, sink
    assert "localStorage." not in scripts  # the token stays in this tab (sessionStorage)


def test_the_console_is_not_in_the_api_schema(admin: ServerThread) -> None:
    schema = httpx.get(f"{admin.url}/openapi.json", timeout=10).json()
    assert not [path for path in schema["paths"] if path.startswith(("/console", "/docs"))]
