"""The admin API's listener holds at most `ADMIN_MAX_CONNECTIONS` connections: it runs in
the gateway's process, and with the public listener's cap (derived from the same
open-file limit) it held as many connections again, taking the descriptors that cap
leaves for backend connections, log files and Redis."""

from __future__ import annotations

import pytest

from gateway.app import admin_server, create_app
from gateway.config import GatewaySettings
from gateway.listener import LimitedHttpProtocol
from gateway.listener_limits import ADMIN_MAX_CONNECTIONS
from gateway.serving import uvicorn_config
from tests.helpers.gateways import backend


def _caps(listen: dict[str, object]) -> tuple[int, int]:
    """The connection caps of the public listener and of the admin API's."""
    config = GatewaySettings.model_validate(
        {
            "backends": [backend("gpu", "http://127.0.0.1:9", "m")],
            "admin": {"allow_loopback": True},
            "listen": listen,
        }
    )
    app = create_app(config)
    public = uvicorn_config(app, config.listen).http
    admin = admin_server(app).config.http
    assert isinstance(public, type) and issubclass(public, LimitedHttpProtocol)
    assert isinstance(admin, type) and issubclass(admin, LimitedHttpProtocol)
    # connections past either cap make room (gateway/listener_room.py), each listener
    # among its own connections
    assert admin.room is not public.room
    return public.limits.max_connections, admin.limits.max_connections


@pytest.mark.parametrize(
    ("listen", "public_cap", "admin_cap"),
    [
        pytest.param({}, None, ADMIN_MAX_CONNECTIONS, id="derived"),
        pytest.param({"max_connections": 2000}, 2000, ADMIN_MAX_CONNECTIONS, id="set-higher"),
        pytest.param({"max_connections": 8}, 8, 8, id="set-lower"),
    ],
)
def test_the_admin_listener_holds_a_few_connections_beside_the_public_one(
    listen: dict[str, object], public_cap: int | None, admin_cap: int
) -> None:
    public, admin = _caps(listen)
    if public_cap is not None:
        assert public == public_cap
    assert admin == admin_cap
    assert admin <= public
