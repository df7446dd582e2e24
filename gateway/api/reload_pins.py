"""What a config reload may not change in a running gateway, and what it did change.

`listen`, `provenance`, `state` and `logging` are built once, at start; so are the admin
listener (bound by gateway/cli/serve.py) and its sampler (`admin.sample_interval_s`,
`admin.history_s`). A reload that changes one keeps its running value and logs "needs
restart", naming the fields of a section that changed (`state`'s `revocations_file`,
say), which `restart_pending` lists for the reloader's status (`needs_restart`). Before,
a reload that moved `admin.listen` (`127.0.0.1` for `0.0.0.0`, or null to close it)
installed the new value without a word while the listener stayed where it
was bound. The admin tokens and `allow_loopback` are read per request: they do reload,
but the listener is bound only if some were configured at start: a reload that adds the
first logs "needs restart" too, and its running `admin.listen` is null (nothing listens).
`tls_paths`: the TLS files a config names, whose change retries a refused config.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gateway.config.schema import GatewaySettings

__all__ = [
    "ADMIN_RESTART_ONLY",
    "RESTART_ONLY",
    "changes",
    "pin_restart_only",
    "restart_pending",
    "tls_paths",
]

RESTART_ONLY = ("listen", "provenance", "state", "logging")
ADMIN_RESTART_ONLY = ("listen", "sample_interval_s", "history_s")
_NEEDS_RESTART = "config setting changed; needs restart, the running value is kept"
_NOT_LISTENING = "admin access configured; needs restart: the admin API is not listening"


def pin_restart_only(running: GatewaySettings, fresh: GatewaySettings, log: Any) -> GatewaySettings:
    """`fresh` with the running values of the settings only a restart changes (each
    change logged on `log` as needing a restart)."""
    kept: dict[str, Any] = {}
    for name in RESTART_ONLY:
        if getattr(fresh, name) != getattr(running, name):
            kept[name] = getattr(running, name)
            fields = _changed_fields(getattr(running, name), getattr(fresh, name))
            log.warning(_NEEDS_RESTART, setting=name, fields=fields)
    admin: dict[str, Any] = {}
    for name in ADMIN_RESTART_ONLY:
        if getattr(fresh.admin, name) != getattr(running.admin, name):
            admin[name] = getattr(running.admin, name)
            log.warning(_NEEDS_RESTART, setting=f"admin.{name}")
    if _admin_opened(fresh) and not _admin_opened(running) and running.admin.listen:
        # Bound at start only where some access was configured (gateway/cli/serve.py):
        # access a reload adds opens nothing, and the running config says so (null, a
        # later reload's `admin.listen` a change that needs restart). Before, the reload
        # said nothing, and the config claimed an admin API at admin.listen.
        admin["listen"] = None
        log.warning(_NOT_LISTENING, setting="admin.tokens")
    if admin:
        kept["admin"] = fresh.admin.model_copy(update=admin)
    return fresh.model_copy(update=kept) if kept else fresh


def restart_pending(running: GatewaySettings, fresh: GatewaySettings) -> list[str]:
    """The settings `fresh` (a reloaded file, before `pin_restart_only`) changes that only
    a restart applies: `state.revocations_file`, `listen`, `admin.listen`, ..."""
    pending: list[str] = []
    for name in RESTART_ONLY:
        old, new = getattr(running, name), getattr(fresh, name)
        if old != new:
            fields = _changed_fields(old, new)
            pending += [f"{name}.{field}" for field in fields] if fields else [name]
    pending += [
        f"admin.{name}"
        for name in ADMIN_RESTART_ONLY
        if getattr(fresh.admin, name) != getattr(running.admin, name)
    ]
    return pending


def _changed_fields(old: Any, new: Any) -> list[str]:
    """The fields of a settings section (a pydantic model) that differ; none otherwise
    (a section added or removed: `provenance: null`)."""
    if old is None or new is None or type(old) is not type(new):
        return []
    return [name for name in type(old).model_fields if getattr(old, name) != getattr(new, name)]


def _admin_opened(config: GatewaySettings) -> bool:
    """Whether `owngate serve` binds the admin listener for `config` (`_admin_server`)."""
    admin = config.admin
    return admin.listen is not None and bool(
        admin.tokens or admin.token_hashes or admin.allow_loopback
    )


def changes(old: GatewaySettings, new: GatewaySettings) -> dict[str, Any]:
    """What a reload changed, by id (never a key hash)."""
    old_b = {b.id: b for b in old.backends}
    new_b = {b.id: b for b in new.backends}
    old_t = {t.id: t for t in old.tenants}
    new_t = {t.id: t for t in new.tenants}
    return {
        "backends_added": sorted(new_b.keys() - old_b.keys()),
        "backends_removed": sorted(old_b.keys() - new_b.keys()),
        "backends_changed": sorted(i for i in new_b.keys() & old_b.keys() if old_b[i] != new_b[i]),
        "tenants_added": sorted(new_t.keys() - old_t.keys()),
        "tenants_removed": sorted(old_t.keys() - new_t.keys()),
        "tenants_changed": sorted(i for i in new_t.keys() & old_t.keys() if old_t[i] != new_t[i]),
        "routing_changed": old.routing != new.routing,
        "limits_changed": old.limits != new.limits,
    }


def tls_paths(config: GatewaySettings, directory: Path) -> tuple[Path, ...]:
    """The CA, client certificate and key files `config`'s backends name."""
    names = (
        name
        for b in config.backends
        if b.tls is not None
        for name in (b.tls.ca_file, b.tls.client_cert_file, b.tls.client_key_file)
        if name is not None
    )
    return tuple(directory / name for name in names)
