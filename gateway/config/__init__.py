"""Typed, strict loading of `gateway.yaml`."""

from gateway.config.issues import ConfigError, ConfigIssue
from gateway.config.loader import load_config, parse_config
from gateway.config.schema import (
    BackendKind,
    BackendSettings,
    GatewaySettings,
    LimitSettings,
    ListenSettings,
    LoggingSettings,
    ModelSettings,
    RetentionSettings,
    StateSettings,
    TenantSettings,
)

__all__ = [
    "BackendKind",
    "BackendSettings",
    "ConfigError",
    "ConfigIssue",
    "GatewaySettings",
    "LimitSettings",
    "ListenSettings",
    "LoggingSettings",
    "ModelSettings",
    "RetentionSettings",
    "StateSettings",
    "TenantSettings",
    "load_config",
    "parse_config",
]
