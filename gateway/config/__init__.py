"""Typed, strict loading of `gateway.yaml`."""

from gateway.config.loader import ConfigError, ConfigIssue, load_config, parse_config
from gateway.config.schema import (
    Backend,
    BackendKind,
    GatewayConfig,
    Limits,
    Listen,
    Logging,
    ModelEntry,
    Retention,
    State,
    Tenant,
)

__all__ = [
    "Backend",
    "BackendKind",
    "ConfigError",
    "ConfigIssue",
    "GatewayConfig",
    "Limits",
    "Listen",
    "Logging",
    "ModelEntry",
    "Retention",
    "State",
    "Tenant",
    "load_config",
    "parse_config",
]
