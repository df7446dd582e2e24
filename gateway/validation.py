"""Every problem `owngate serve` would refuse a loaded config for at start (`validate`, run
by `owngate config validate` and the admin API's `config/validate`): the composition
root's own `assemble`, plus what only a start checks (each worker's part of a limit, the
provenance log's files), without opening a connection, a listening socket or the log."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path

from gateway.app import AssemblyError, assemble, checked_parts
from gateway.config.schema import GatewaySettings
from gateway.provenance.writer.preflight import preflight
from gateway.state import unsplittable
from gateway.tenants import tenant_limits
from gateway.upstream.tenant_share import config_share_unsplittable

__all__ = ["validate"]


def validate(
    config: GatewaySettings,
    *,
    environ: Mapping[str, str],
    config_dir: Path,
    secrets: bool = True,
    workers: int = 1,
) -> list[str]:
    """Every problem `owngate serve` would refuse this loaded config for at start, found
    with the same `assemble` and without opening a connection, a listening socket or the
    provenance log. With `workers` > 1 (`serve --workers N`), each worker's own log
    directory and high-water file are checked (`ProvenanceSettings.for_worker`), and with
    `state: memory` that each tenant limit splits over the workers (`unsplittable`), and
    that a tenant's share of a backend does (`share_unsplittable`).

    `secrets=False` checks a config meant for another machine (a pod whose secrets are
    mounted there): a backend key variable unset here counts as set, and the provenance
    key files, the backends' TLS files and the log directory are not looked at."""
    if not secrets:
        environ = _keys_assumed_set(config, environ)
        config = _without_tls_files(config)
    problems: list[str] = []
    try:
        assemble(config, environ, config_dir=config_dir)
    except AssemblyError as exc:
        problems += exc.problems
    except ValueError as exc:  # a setting checked before the rest (shared state, OTEL_*)
        problems.append(str(exc))
        try:
            checked_parts(config, environ, config_dir, time.monotonic)
        except AssemblyError as more:
            problems += more.problems
    if config.state.backend == "memory":  # each of `serve --workers N` takes its part
        split = unsplittable(((t.id, tenant_limits(t)) for t in config.tenants), workers)
        problems += [problem for problem in split if problem not in problems]
    problems += [p for p in config_share_unsplittable(config, workers) if p not in problems]
    log = config.provenance
    if log is not None:
        files = (log.signing_key_file, *log.previous_signing_key_files) if secrets else ()
        workers = max(workers, 1)
        problems += preflight(
            log.origin,
            [config_dir / f for f in files],
            [w.vkey for w in log.witnesses],
            directory=config_dir / log.dir if secrets and workers == 1 else None,
            high_water=log.high_water_path(config_dir),
            retired_keys=log.retired_verifier_keys,
        )
        for index in range(1, workers + 1) if workers > 1 else ():
            own = log.for_worker(index, config_dir)  # as each worker opens its own log
            problems += preflight(
                own.origin,
                [],
                directory=config_dir / own.dir if secrets else None,
                high_water=own.high_water_path(config_dir),
            )
    return list(dict.fromkeys(problems))  # a setting every worker shares is named once


def _without_tls_files(config: GatewaySettings) -> GatewaySettings:
    """`config` with no backend naming a TLS file (CA, client certificate and key)."""
    unread = {"ca_file": None, "client_cert_file": None, "client_key_file": None}
    backends = tuple(
        b if b.tls is None else b.model_copy(update={"tls": b.tls.model_copy(update=unread)})
        for b in config.backends
    )
    return config.model_copy(update={"backends": backends})


def _keys_assumed_set(config: GatewaySettings, environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` with every backend key variable that is unset or empty here set to a
    placeholder (a value set here is still checked)."""
    named = {b.api_key_env for b in config.backends if b.api_key_env is not None}
    return {**environ, **{name: "unset-here" for name in named if not environ.get(name)}}
