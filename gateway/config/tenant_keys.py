"""The tenants' API keys as a loaded config holds them: the digests its keys file
(`owngate keys new`) stores, merged into their tenants (`merge_keys_file`), and none of
them an admin token's digest (`no_key_is_an_admin_token`)."""

from __future__ import annotations

from pathlib import Path

import yaml

from gateway.config.issues import ConfigError, ConfigIssue
from gateway.config.schema import GatewaySettings
from gateway.logs import get_logger

__all__ = ["merge_keys_file", "no_key_is_an_admin_token"]


def no_key_is_an_admin_token(config: GatewaySettings, source: str) -> None:
    """Refuse a digest that is both a tenant's API key and an admin token (in gateway.yaml
    or its keys file): whoever holds that tenant key would hold the admin API too."""
    admin = {t.hash for t in config.admin.tokens} | set(config.admin.token_hashes)
    for tenant in config.tenants:
        shared = admin.intersection(tenant.api_key_hashes)
        if shared:
            problem = (
                f"tenant {tenant.id!r} has an API key whose digest is also an admin token's "
                f"({min(shared)[:19]}...): a tenant key must never open the admin API"
            )
            raise ConfigError(source, [ConfigIssue("admin", None, problem)])


def merge_keys_file(config: GatewaySettings, keys_path: Path, source: str) -> GatewaySettings:
    """Add the hashes stored by `owngate keys new` to the tenants they belong to."""
    from gateway.tenants import read_keys_file

    try:
        stored = read_keys_file(keys_path)
    except OSError as exc:  # a ConfigError, so a reload keeps the running config (and its
        # watcher) instead of dying on an unreadable file
        issue = ConfigIssue("", None, f"cannot read: {exc.strerror}")
        raise ConfigError(str(keys_path), [issue], unreadable=True) from exc
    except RecursionError as exc:  # PyYAML composes recursively
        issue = ConfigIssue("", None, "not valid YAML: it nests too deep")
        raise ConfigError(str(keys_path), [issue]) from exc
    except yaml.YAMLError as exc:
        # Where and what, never PyYAML's text: it quotes the line it stopped at, and a
        # candidate config (the admin API's config/validate) may name any readable file.
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or type(exc).__name__
        issue = ConfigIssue("", line, f"not valid YAML: {problem}")
        raise ConfigError(str(keys_path), [issue]) from exc
    except ValueError as exc:
        raise ConfigError(str(keys_path), [ConfigIssue("", None, str(exc))]) from exc
    known = {t.id for t in config.tenants}
    unknown = sorted(set(stored) - known)
    if unknown:
        # A tenant taken out of gateway.yaml whose digests are still in the keys file: its
        # keys authenticate no one. Refused as an error (before), the reload that took it
        # out failed and kept the running config, so its keys stayed valid (and the next
        # start failed); `owngate keys new` and the admin API name only known tenants.
        get_logger("owngate.config").warning(
            "keys file lists tenants not in the config: their keys authenticate no one",
            keys_file=str(keys_path),
            tenants=unknown,
        )
    tenants = tuple(
        t.model_copy(update={"api_key_hashes": t.api_key_hashes + tuple(stored.get(t.id, ()))})
        for t in config.tenants
    )
    return config.model_copy(update={"tenants": tenants})
