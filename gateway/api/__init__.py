"""The gateway's HTTP surface: the ASGI app, its handlers and the request path
(`gateway.app.create_app` builds the app)."""

from gateway.api.app import GatewayApp

__all__ = ["GatewayApp"]
