"""The web console's static assets (gateway/admin/console/), served by the admin app at
`/console/`.

The assets hold no data, so they need no token: the pages fetch everything from the
admin API with the token the user pastes into the login form. Only the fixed set of
names in `ASSETS` is served, looked up in a dict before any file is opened, so no path
(`..`, an encoded one, an absolute one) can reach another file. Every answer carries a
Content-Security-Policy allowing this origin's scripts and styles only (no inline
script or style, no other origin: the console works offline and a hostile string that
reached the DOM as markup could still run nothing), and is kept out of frames, caches
and referrers, and out of reach of a page of another origin that opened it in a tab
(`Cross-Origin-Opener-Policy`). The routes are left out of the OpenAPI schema: they are not API.

`GET /docs`, where a FastAPI app keeps its interactive docs, redirects to the console's
API page (apidocs.js, drawn from `/openapi.json`): FastAPI's own Swagger UI would load
its scripts and styles from a CDN.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from fastapi import APIRouter
from fastapi.responses import RedirectResponse, Response

from gateway.errors import ErrorCode, GatewayError

__all__ = ["API_PAGE", "ASSETS", "ASSET_DIR", "SECURITY_HEADERS", "docs_router", "router"]

ASSET_DIR: Final = Path(__file__).parent / "console"

# Every file the console has, and its media type: nothing else is ever read.
ASSETS: Final = {
    "index.html": "text/html; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "api.js": "text/javascript; charset=utf-8",
    "dom.js": "text/javascript; charset=utf-8",
    "charts.js": "text/javascript; charset=utf-8",
    "operator.js": "text/javascript; charset=utf-8",
    "security.js": "text/javascript; charset=utf-8",
    "auditor.js": "text/javascript; charset=utf-8",
    "apidocs.js": "text/javascript; charset=utf-8",
    "schema.js": "text/javascript; charset=utf-8",
}
API_PAGE: Final = "/console/#api"  # the interactive docs

SECURITY_HEADERS: Final = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    # A page of another origin that opened the console (`window.open`) keeps no handle
    # on its tab, which it could otherwise navigate to a look-alike login at any time.
    "Cross-Origin-Opener-Policy": "same-origin",
}

router = APIRouter(prefix="/console", include_in_schema=False)
docs_router = APIRouter(include_in_schema=False)


@docs_router.get("/docs")
async def docs() -> RedirectResponse:
    """`/docs` → the console's API page, on this origin (never a CDN's Swagger UI)."""
    return RedirectResponse(API_PAGE, status_code=308, headers=SECURITY_HEADERS)


@router.get("")
async def console_root() -> RedirectResponse:
    """`/console` → `/console/`: the page's relative asset paths need the slash."""
    return RedirectResponse("/console/", status_code=308, headers=SECURITY_HEADERS)


@router.get("/")
async def console_page() -> Response:
    return _asset("index.html")


@router.get("/{name}")
async def console_asset(name: str) -> Response:
    return _asset(name)


def _asset(name: str) -> Response:
    media_type = ASSETS.get(name)
    if media_type is None:
        raise GatewayError(ErrorCode.not_found, "Unknown console asset.")
    body = (ASSET_DIR / name).read_bytes()
    return Response(body, media_type=media_type, headers=SECURITY_HEADERS)
