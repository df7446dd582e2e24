"""The tlog-tiles paths the admin app serves (`gateway/admin/tiles.py`): parsed strictly
before any file is touched, so a path that is not exactly a tile's (traversal, a needless
`x000/` group, a width out of range, an index no log can reach) is a 404 error object,
never a file outside the tile tree nor a fault of the admin API."""

from __future__ import annotations

import asyncio
import hashlib

import httpx
import pytest

from gateway.admin.tiles import parse_tile_path
from gateway.app import admin_app, create_app
from gateway.config import GatewaySettings
from tests.helpers.gateways import backend

TOKEN = "og-admin-tile-paths-token"
# An index past any uint64 tree: more decimal digits than int() converts by default.
HUGE = "x000/" * 1500 + "000"


@pytest.mark.parametrize(
    ("path", "parsed"),
    [
        ("tile/0/000", ("tile/0/000", True)),
        ("tile/63/x001/234", ("tile/63/x001/234", True)),
        ("tile/entries/000.p/7", ("tile/entries/000.p/7", False)),
        (
            "tile/0/x018/x446/x744/x073/x709/x551/615",
            ("tile/0/x018/x446/x744/x073/x709/x551/615", True),
        ),
        ("tile/0/x001/x018/x446/x744/x073/x709/x551/615", None),  # past any uint64 index
        ("tile/0/x000/001", None),  # not canonical
        ("tile/0/000.p/0", None),
        ("tile/0/000.p/256", None),
        ("tile/0/000.p/07", None),
        ("tile/64/000", None),
        ("tile/0/../../checkpoint", None),
        ("tile/0/%2e%2e/000", None),
        ("tile/0\\..\\000", None),
        ("tile//etc/passwd", None),
        ("tile/0/-01", None),
        (f"tile/0/{HUGE}", None),
        (f"tile/entries/{HUGE}.p/1", None),
    ],
)
def test_tile_paths(path: str, parsed: tuple[str, bool] | None) -> None:
    assert parse_tile_path(path) == parsed


def test_a_tile_index_no_log_reaches_is_not_found() -> None:
    config = {
        "backends": [backend("gpu", "http://127.0.0.1:9", "m")],
        "admin": {"token_hashes": ["sha256:" + hashlib.sha256(TOKEN.encode()).hexdigest()]},
    }
    app = admin_app(create_app(GatewaySettings.model_validate(config)))

    async def run() -> httpx.Response:
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url="http://admin") as http:
            return await http.get(
                f"/log/tile/0/{HUGE}", headers={"authorization": f"Bearer {TOKEN}"}
            )

    answer = asyncio.run(run())
    assert answer.status_code == 404, answer.text
    assert answer.json()["error"]["message"] == "not a tlog-tiles tile path"
