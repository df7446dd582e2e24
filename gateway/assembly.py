"""Building a gateway from a loaded config, and every reason it cannot be built, at once.

A config that loads can still be refused when the gateway is built from it: a backend's
key variable is missing from the environment, one key hash is listed for two tenants,
the trust policies do not compile against the configured backends. `build_routing`
builds those parts for `GatewayApp.assemble` (at start and on every config reload) and
raises one `AssemblyError` naming every problem, so a config is fixed in one round.

`validate` is `owngate config validate`: the app built exactly as `owngate serve` builds
it before it listens (nothing connects there: connections, Redis and the provenance log
open in the ASGI lifespan), and the provenance settings checked without opening the log
for writing (`gateway.provenance.writer.preflight`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from gateway.config.schema import GatewayConfig
from gateway.policy import PolicyError
from gateway.policy_set import TrustPolicies
from gateway.provenance.writer.preflight import preflight
from gateway.routing.registry import Registry
from gateway.upstream.hosted import hosted_api_key

__all__ = ["AssemblyError", "build_routing", "validate"]


class AssemblyError(ValueError):
    """The gateway cannot be built from this config; `problems` lists every reason."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = tuple(problems)
        super().__init__("\n".join(self.problems))


def build_routing(
    config: GatewayConfig,
    *,
    environ: Mapping[str, str],
    config_dir: Path,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[Registry, TrustPolicies]:
    """The backend registry and the trust policies of `config`, or `AssemblyError` with
    every problem: backend key variables (private and hosted), tenant key hashes, and
    every policy error (policies are compiled against the configured backends)."""
    problems: list[str] = []
    registry: Registry | None = None
    try:
        registry = Registry.build(config, environ=dict(environ), clock=clock)
    except ValueError as exc:
        problems += str(exc).splitlines()  # Registry.build: one problem per line
    for backend in config.backends:
        if backend.kind == "hosted":
            try:
                hosted_api_key(backend, environ)  # what HostedClient reads when it is built
            except ValueError as exc:
                problems.append(str(exc))
    trust: TrustPolicies | None = None
    try:
        trust = TrustPolicies(config, config_dir)
    except PolicyError as exc:
        problems += [f"invalid trust policy: {issue}" for issue in exc.issues]
    if registry is None or trust is None or problems:
        raise AssemblyError(problems)
    return registry, trust


def validate(
    config: GatewayConfig,
    *,
    environ: Mapping[str, str],
    config_dir: Path,
    secrets: bool = True,
) -> list[str]:
    """Every problem `owngate serve` would refuse this loaded config for at start, found
    without opening a connection, a listening socket or the provenance log.

    `secrets=False` checks a config meant for another machine (a pod whose secrets are
    mounted there): a backend key variable unset here counts as set, and the provenance
    key files and log directory are not looked at."""
    from gateway.api.app import create_app  # the app imports this module

    if not secrets:
        environ = _keys_assumed_set(config, environ)
    problems: list[str] = []
    try:
        create_app(config, environ=dict(environ), config_dir=config_dir)
    except AssemblyError as exc:
        problems += exc.problems
    except ValueError as exc:  # a setting checked before the assembly (shared state)
        problems.append(str(exc))
        try:
            build_routing(config, environ=environ, config_dir=config_dir)
        except AssemblyError as more:
            problems += more.problems
    log = config.provenance
    if log is not None:
        files = (log.signing_key_file, *log.previous_signing_key_files) if secrets else ()
        problems += preflight(
            log.origin,
            [config_dir / f for f in files],
            [w.vkey for w in log.witnesses],
            directory=config_dir / log.dir if secrets else None,
        )
    return problems


def _keys_assumed_set(config: GatewayConfig, environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` with every backend key variable that is unset or empty here set to a
    placeholder (a value set here is still checked)."""
    named = {b.api_key_env for b in config.backends if b.api_key_env is not None}
    return {**environ, **{name: "unset-here" for name in named if not environ.get(name)}}
