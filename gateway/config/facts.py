"""`BackendFacts` from gateway.yaml: what the operator declared, the policy's trust root.

This lives with the config, not the policy core: `gateway.policy` takes `BackendFacts`
and never needs gateway.yaml's types (an auditor installs it without the server).

owngate does not discover where a backend runs or how a provider keeps data; it takes
the operator's declaration (`region`, `owner`, `provider`, `retention`) as given,
enforces policies against it and records it (see `PolicySet.facts_digest`).
"""

from __future__ import annotations

from gateway.config.provider_table import provider_names
from gateway.config.schema import BackendSettings, GatewaySettings
from gateway.policy.types import BackendFacts

__all__ = ["backend_facts", "facts_of"]


def facts_of(backend: BackendSettings) -> BackendFacts:
    private = backend.is_private
    declared = backend.provider or backend.owner
    return BackendFacts(
        id=backend.id,
        tier="private" if private else "hosted",
        kind=backend.kind,
        provider=backend.owner if private else declared,
        # A policy's provider globs match every name of a hosted backend's provider; a
        # private backend is judged by its owner as written (the operator's own server).
        provider_names=() if private else provider_names(declared),
        region=backend.region,
        owner=backend.owner,
        retention_days=backend.retention.days,
        zero_data_retention=backend.retention.zero_data_retention,
        training=backend.retention.training,
        models=frozenset(name for m in backend.models for name in (m.name, *m.aliases)),
        model_groups=tuple(frozenset((m.name, *m.aliases)) for m in backend.models),
        provider_models=tuple(
            sorted(
                (name, m.provider_model)
                for m in backend.models
                if m.provider_model and not private
                for name in (m.name, *m.aliases)
            )
        ),
        attested=backend.identity == "certificate",
    )


def backend_facts(config: GatewaySettings) -> tuple[BackendFacts, ...]:
    """The facts of every configured backend, in gateway.yaml order."""
    return tuple(facts_of(backend) for backend in config.backends)
