"""The rule sections as compiled filters: each says why a backend is excluded, or nothing.

A `Scope` is one policy's rules, or one data class's: checked in a fixed order (models,
backends, providers, residency, retention, fallback), the first failing section names
the exclusion. Everything that depends only on the declared backends is evaluated once,
when the policy set is compiled; a decision then only looks the verdicts up.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from fnmatch import translate
from typing import Protocol
from urllib.parse import unquote

from gateway.policy import jurisdictions
from gateway.policy.schema import Fallback, Lists, Residency, Retention, Target
from gateway.policy.types import FALLBACK_MODES, BackendFacts, FallbackMode, TraceEntry

__all__ = [
    "SECTIONS",
    "EffectiveFallback",
    "Exclusion",
    "Globs",
    "Scope",
    "Sections",
    "combine_fallback",
    "compile_scope",
    "target_matches",
]

# The order in which sections are checked; the first to fail names the exclusion.
SECTIONS = ("models", "backends", "providers", "residency", "retention", "require", "fallback")


@dataclass(frozen=True, slots=True)
class Exclusion:
    rule: str
    reason: str
    rank: int = 0  # evaluation order: a data class's sections come after the policy's


@dataclass(frozen=True, slots=True)
class EffectiveFallback:
    mode: FallbackMode
    threshold: float | None
    rule: str


class Sections(Protocol):
    """What a policy spec and a data class have in common: the rule sections."""

    @property
    def models(self) -> Lists | None: ...
    @property
    def backends(self) -> Lists | None: ...
    @property
    def providers(self) -> Lists | None: ...
    @property
    def residency(self) -> Residency | None: ...
    @property
    def retention(self) -> Retention | None: ...
    @property
    def require(self) -> tuple[str, ...] | None: ...
    @property
    def fallback(self) -> Fallback | None: ...


class Globs:
    """Case-insensitive shell-style patterns (`*`, `?`, `[...]`), compiled once."""

    __slots__ = ("_compiled", "patterns")

    def __init__(self, patterns: Iterable[str]) -> None:
        self.patterns = tuple(p.lower() for p in patterns)
        self._compiled = tuple(re.compile(translate(p)) for p in self.patterns)

    def first_match(self, value: str) -> str | None:
        value = value.lower()
        for pattern, compiled in zip(self.patterns, self._compiled, strict=True):
            if compiled.match(value):
                return pattern
        return None


@dataclass(frozen=True, slots=True)
class Scope:
    """The compiled rules of a policy, or of one of its data classes."""

    prefix: str  # "eu-health" or "eu-health/data_classes.phi"
    rules: frozenset[str]
    model_verdicts: Mapping[str, Exclusion | None]  # served model name → verdict
    static: Mapping[str, Exclusion | None]  # backend id → first failing section, if any
    fallback_rank: Mapping[str, int]  # hosted backend id → position of its fallback.to entry
    fallback: EffectiveFallback | None  # this scope's own fallback section
    # The same verdicts as ready-made trace entries, so a decision builds none of them:
    static_entries: Mapping[str, TraceEntry | None]  # backend id → exclusion entry
    model_entries: Mapping[str, Mapping[str, TraceEntry]]  # excluded model → backend → entry
    rule_ranks: Mapping[str, int]  # rule id → evaluation order (for naming a refusal)


def _quote(items: Sequence[str]) -> str:
    return "[" + ", ".join(items) + "]" if items else "[] (allows nothing)"


def _list_check(
    rule: str, section: str, what: str, lists: Lists, names: Sequence[str]
) -> Exclusion | None:
    """`lists` judged on every name of a value, `names[0]` as declared (a provider's, by
    `BackendFacts.providers`): a deny entry matching any excludes, an allow one admits."""
    value = names[0]
    for name in names:
        denied = Globs(lists.deny).first_match(name)
        if denied is not None:
            via = "" if name.lower() == value.lower() else f" ({name})"
            return Exclusion(rule, f"{what} {value!r}{via} matches {section}.deny entry {denied!r}")
    if lists.allow is not None and all(Globs(lists.allow).first_match(n) is None for n in names):
        also = f" (also {', '.join(names[1:])})" if names[1:] else ""
        allowed = _quote(lists.allow)
        return Exclusion(rule, f"{what} {value!r}{also} is not in {section}.allow {allowed}")
    return None


def _models_check(
    rule: str,
    lists: Lists,
    model: str,
    names: frozenset[str],
    everywhere: frozenset[str],
    provider: frozenset[str],
) -> Exclusion | None:
    """A model is judged by every name it is served under: denied when any name it has on
    any backend (`everywhere`, `_same_model`) matches a deny entry, allowed when any name
    it has on the backend judged (`names`: its name and aliases there, and the provider
    model a hosted backend sends) matches the allow list. So `deny: [llama-3.1-8b]` also
    holds for a client asking by the alias `llama3`, on every backend that serves `llama3`,
    whatever that backend calls the model; an allow entry admits only the backends that
    serve it by that name. A provider model (the names in `provider`) is judged as written
    and by each part after a `/` (`openai/gpt-4o` also as `gpt-4o`), so `deny: ["gpt-4o*"]`
    holds for a hosted backend serving it under any public name."""
    deny = Globs(lists.deny)
    for name in sorted(everywhere, key=lambda n: (n != model, n)):  # the requested name first
        for spelling in _spellings(name) if name in provider else (name,):
            denied = deny.first_match(spelling)
            if denied is None:
                continue
            if name in provider:
                also = f" (provider model {name!r})"
            else:
                also = "" if name == model else f" (the same model as {name!r})"
            return Exclusion(rule, f"model {model!r}{also} matches models.deny entry {denied!r}")
    if lists.allow is not None:
        allow = Globs(lists.allow)
        spellings = [s for n in names for s in (_spellings(n) if n in provider else (n,))]
        if all(allow.first_match(name) is None for name in spellings):
            return Exclusion(rule, f"model {model!r} is not in models.allow {_quote(lists.allow)}")
    return None


def _spellings(provider_model: str) -> tuple[str, ...]:
    """A provider model and each part of it after a `/`: `openrouter/openai/gpt-4o`,
    `openai/gpt-4o`, `gpt-4o` (a LiteLLM route prefix names the wire, not the model); as
    written and percent-decoded, as a provider taking it in a URL path reads it
    (`bedrock/anthropic%2Eclaude-3` is sent to Bedrock's `/model/anthropic%2Eclaude-3/`,
    which it reads as `anthropic.claude-3`); and each of those without its empty parts
    (`openai/gpt-4o/`, `openai//gpt-4o`: LiteLLM sends `gpt-4o/`, `/gpt-4o`, which a
    provider may well take for `gpt-4o`; judged so, `deny: [gpt-4o]` holds for them)."""
    found: dict[str, None] = {}
    decoded = unquote(provider_model)
    for written in dict.fromkeys((provider_model, decoded, *_compact(provider_model, decoded))):
        parts = written.split("/")
        found.update(
            dict.fromkeys(s for s in ("/".join(parts[i:]) for i in range(len(parts))) if s)
        )
    return tuple(found)


def _compact(*written: str) -> tuple[str, ...]:
    """Each of `written` without its empty `/`-separated parts, where it has any."""
    return tuple("/".join(p for p in w.split("/") if p) for w in written if "//" in f"/{w}/")


def _judged_names(backend: BackendFacts, model: str) -> frozenset[str]:
    """The names a `models` rule judges `model` by on `backend`: its name and aliases
    there, and the provider model a hosted backend sends for it."""
    provider_model = backend.provider_model_of(model)
    names = backend.names_of(model)
    return names if provider_model is None else names | {provider_model}


def _same_model(backends: Sequence[BackendFacts]) -> dict[str, frozenset[str]]:
    """Each public name -> every name of the model it names, on any backend: a backend's
    name for a model, its aliases and the provider model it sends are one model, and a
    public name is one model on every backend serving it (the router balances between
    them), so the relation closes over both. A deny entry matching any of them holds
    wherever the name is served."""
    parent: dict[str, str] = {}

    def root(name: str) -> str:
        while parent.setdefault(name, name) != name:
            parent[name] = parent[parent[name]]  # halve the path as it is walked
            name = parent[name]
        return name

    for backend in backends:
        for model in sorted(backend.models):
            for other in _judged_names(backend, model):
                parent[root(other)] = root(model)
    members: dict[str, set[str]] = {}
    for name in list(parent):
        members.setdefault(root(name), set()).add(name)
    return {name: frozenset(members[root(name)]) for name in parent}


def _residency_check(rule: str, residency: Residency, region: str) -> Exclusion | None:
    for entry in residency.deny:
        place = jurisdictions.overlap(region, jurisdictions.expand(entry))
        if place == region.lower():
            return Exclusion(rule, f"region {region!r} is covered by residency.deny {entry!r}")
        if place is not None:  # a backend declared by a code may be in the part denied
            return Exclusion(
                rule,
                f"region {region!r} is a jurisdiction code and residency.deny {entry!r} "
                f"covers part of it ({place!r}): the declaration does not place the backend "
                "outside it",
            )
    for entry in residency.allow:
        if jurisdictions.region_matches(region, jurisdictions.expand(entry)) is not None:
            return None
    allowed = _quote(residency.allow)
    return Exclusion(rule, f"region {region!r} is outside residency.allow {allowed}")


def _retention_check(rule: str, retention: Retention, backend: BackendFacts) -> Exclusion | None:
    days = backend.retention_days
    if retention.max_days == "zero":
        if not (backend.zero_data_retention and days == 0):
            zdr = "true" if backend.zero_data_retention else "false"
            return Exclusion(
                rule,
                "retention.max_days is zero: the backend is not declared zero-data-retention "
                f"(days {days}, zero_data_retention {zdr})",
            )
    elif isinstance(retention.max_days, int) and days > retention.max_days:
        return Exclusion(
            rule, f"retains data {days} days; retention.max_days is {retention.max_days}"
        )
    if backend.training and not retention.training:
        return Exclusion(rule, "may train on request data; retention.training is false")
    return None


def target_matches(target: Target, backend: BackendFacts) -> bool:
    if target.backend is not None:
        return Globs((target.backend,)).first_match(backend.id) is not None
    assert target.provider is not None
    return any(Globs((target.provider,)).first_match(n) is not None for n in backend.providers())


def _fallback_check(
    rule: str, fallback: Fallback, backend: BackendFacts
) -> tuple[Exclusion | None, int]:
    if fallback.mode == "never":
        return Exclusion(rule, "fallback.mode is never: hosted backends receive no traffic"), 0
    if fallback.to is None:
        return None, 0
    for position, target in enumerate(fallback.to):
        if target_matches(target, backend):
            return None, position
    return Exclusion(rule, f"hosted backend {backend.id!r} is not named in fallback.to"), 0


def _static_check(
    prefix: str, rules: Sections, backend: BackendFacts
) -> tuple[Exclusion | None, int | None]:
    """The first failing section that depends on the backend alone, and its fallback rank."""
    if rules.backends is not None:
        hit = _list_check(f"{prefix}/backends", "backends", "backend", rules.backends, [backend.id])
        if hit is not None:
            return hit, None
    if rules.providers is not None:
        hit = _list_check(
            f"{prefix}/providers", "providers", "provider", rules.providers, backend.providers()
        )
        if hit is not None:
            return hit, None
    if rules.residency is not None:
        hit = _residency_check(f"{prefix}/residency", rules.residency, backend.region)
        if hit is not None:
            return hit, None
    if rules.retention is not None:
        hit = _retention_check(f"{prefix}/retention", rules.retention, backend)
        if hit is not None:
            return hit, None
    if rules.require and "attested_facts" in rules.require and not backend.attested:
        return Exclusion(
            f"{prefix}/require",
            "require: attested_facts, but the backend's region, owner and retention are only "
            "declared in gateway.yaml (not identity: certificate)",
        ), None
    if rules.fallback is not None and backend.tier == "hosted":
        hit, rank = _fallback_check(f"{prefix}/fallback", rules.fallback, backend)
        return hit, None if hit is not None else rank
    return None, None


def compile_scope(
    prefix: str, rules: Sections, backends: Sequence[BackendFacts], *, data_class: bool = False
) -> Scope:
    """Evaluate every section that does not depend on the request, once per backend."""
    offset = len(SECTIONS) if data_class else 0

    def ranked(exclusion: Exclusion | None) -> Exclusion | None:
        if exclusion is None:
            return None
        section = exclusion.rule.rsplit("/", 1)[1]
        return replace(exclusion, rank=offset + SECTIONS.index(section))

    static: dict[str, Exclusion | None] = {}
    ranks: dict[str, int] = {}
    for backend in backends:
        exclusion, rank = _static_check(prefix, rules, backend)
        static[backend.id] = ranked(exclusion)
        if rank is not None:
            ranks[backend.id] = rank
    everywhere = _same_model(backends)
    provider = frozenset(pm for b in backends for _, pm in b.provider_models)
    by_names: dict[tuple[str, frozenset[str]], Exclusion | None] = {}
    model_verdicts: dict[str, Exclusion | None] = {}  # an exclusion on any backend wins
    model_entries: dict[str, dict[str, TraceEntry]] = {}
    for backend in backends:
        for model in sorted(backend.models):
            names = _judged_names(backend, model)
            if (model, names) not in by_names:
                by_names[model, names] = (
                    None
                    if rules.models is None
                    else ranked(
                        _models_check(
                            f"{prefix}/models",
                            rules.models,
                            model,
                            names,
                            everywhere[model],
                            provider,
                        )
                    )
                )
            verdict = by_names[model, names]
            model_verdicts[model] = model_verdicts.get(model) or verdict
            if verdict is not None:
                entry = TraceEntry(backend.id, "excluded", verdict.rule, verdict.reason)
                model_entries.setdefault(model, {})[backend.id] = entry
    static_entries = {
        backend_id: None
        if exclusion is None
        else TraceEntry(backend_id, "excluded", exclusion.rule, exclusion.reason)
        for backend_id, exclusion in static.items()
    }
    present = [s for s in SECTIONS if getattr(rules, s) is not None]
    fallback = None
    if rules.fallback is not None:
        threshold = rules.fallback.saturation_threshold
        fallback = EffectiveFallback(rules.fallback.mode, threshold, f"{prefix}/fallback")
    return Scope(
        prefix=prefix,
        rules=frozenset(f"{prefix}/{section}" for section in present),
        model_verdicts=model_verdicts,
        static=static,
        fallback_rank=ranks,
        fallback=fallback,
        static_entries=static_entries,
        model_entries=model_entries,
        rule_ranks={f"{prefix}/{section}": offset + i for i, section in enumerate(SECTIONS)},
    )


def combine_fallback(base: EffectiveFallback, extra: EffectiveFallback | None) -> EffectiveFallback:
    """The stricter of a policy's fallback and a data class's (a class only tightens).

    Strictness: never > when_private_unavailable > when_private_saturated; between two
    saturated modes the higher threshold (falling back later) is the stricter one.
    """
    if extra is None:
        return base
    base_rank, extra_rank = FALLBACK_MODES.index(base.mode), FALLBACK_MODES.index(extra.mode)
    if extra_rank < base_rank:
        return extra
    if (
        extra_rank == base_rank
        and base.threshold is not None
        and extra.threshold is not None
        and extra.threshold > base.threshold
    ):
        return extra
    return base
