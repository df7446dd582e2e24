"""The OpenAI-compatible HTTP surface of the gateway."""

from gateway.api.app import GatewayApp, create_app

__all__ = ["GatewayApp", "create_app"]
