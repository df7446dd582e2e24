"""`gateway.yaml`'s `backends:` entries: a backend's kind, URL, models, declared facts
(region, owner, retention), capacity hints, and how the gateway trusts it: TLS (CA, mutual
TLS, key pins), certificate identity and `owngate attest` countersignatures (the `tls` and
`attest` sections' own settings are gateway/config/backend_trust.py)."""

from __future__ import annotations

import ipaddress
import re
from typing import Literal
from urllib.parse import unquote, urlsplit

from pydantic import Field, ValidationInfo, field_validator, model_validator

from gateway.config.backend_trust import AttestSettings, BackendTLSSettings
from gateway.config.base import Identifier, _Strict
from gateway.config.bedrock_profiles import check_bedrock_profiles, check_bedrock_regions
from gateway.config.media import MediaUrlSettings
from gateway.config.openai_regions import check_openai_region
from gateway.config.provider_routes import check_private, check_route, is_azure
from gateway.config.routing import BreakerSettings
from gateway.config.vertex_regions import check_vertex_regions
from gateway.plain_names import plain_name_problem
from gateway.plain_yaml import key_in_text, key_pattern

__all__ = [
    "FACT_NAME",
    "MAX_FACT_DAYS",
    "PRIVATE_KINDS",
    "BackendKind",
    "BackendSettings",
    "CapacitySettings",
    "ModelSettings",
    "RetentionSettings",
]

BackendKind = Literal["vllm", "llamacpp", "sglang", "openai", "hosted"]
PRIVATE_KINDS: frozenset[str] = frozenset({"vllm", "llamacpp", "sglang", "openai"})


_FACT_KEYS = key_pattern(
    ("days", "training", "zero_data_retention", "retention", "region", "owner", "provider")
)


def _ipv6_literal(host: str) -> bool:
    """Whether `host` is `[an IPv6 address]`, without a zone."""
    inner = host[1:-1] if host.startswith("[") and host.endswith("]") else ""
    if not inner or "%" in inner:
        return False
    try:
        ipaddress.IPv6Address(inner)
    except ValueError:
        return False
    return True


class RetentionSettings(_Strict):
    """What the operator declares about how a backend keeps request data."""

    # At most I-JSON's largest integer: the facts digest encodes it (a larger one failed
    # the policy compile with a traceback instead of an error naming the line).
    days: int = Field(default=0, ge=0, le=2**53 - 1)
    training: bool = False
    zero_data_retention: bool = False
    evidence: str = ""

    @field_validator("evidence")
    @classmethod
    def _text_only(cls, value: str) -> str:
        # Text written as a block scalar (`evidence: >`) runs on over the lines indented
        # below it: `days: 365` two spaces deeper reads as the declared retention in a
        # review and is text, the backend declaring the default `days: 0` instead.
        found = key_in_text(value, _FACT_KEYS)
        if found is not None:
            raise ValueError(
                f"evidence holds {found + ':'!r}, which reads as a declared fact but is "
                "text here (a line indented under `evidence:` is part of it); write the "
                "fact as a key of its own, or reword the evidence"
            )
        return value


class CapacitySettings(_Strict):
    """Hints for routing; measured load corrects them."""

    max_concurrency: int | None = Field(default=None, gt=0)
    context_tokens: int | None = Field(default=None, gt=0)


class ModelSettings(_Strict):
    name: str = Field(min_length=1, description="The model name the backend itself serves")
    aliases: tuple[str, ...] = ()
    provider_model: str | None = Field(
        default=None, description="LiteLLM model string for hosted backends, e.g. openai/gpt-4o"
    )

    @field_validator("name", "aliases", "provider_model")
    @classmethod
    def _plain_names(
        cls, value: str | tuple[str, ...] | None, info: ValidationInfo
    ) -> str | tuple[str, ...] | None:
        # Policies match these names (`models.deny`) as written, a provider model decoded
        names = () if value is None else (value,) if isinstance(value, str) else value
        if info.field_name == "provider_model":
            names = tuple(dict.fromkeys((*names, *(unquote(name) for name in names))))
        for name in names:
            problem = plain_name_problem(name)
            if problem is not None:
                raise ValueError(f"{problem}; policies match this name as written")
        return value


# What a certificate can state as `owngate:region:` or `owngate:owner:` (docs/backend-tls.md;
# gateway/upstream/tls.py reads them with it), and the most days `owngate:retention:` can.
_GLOB = re.compile(r"[*?\[\]]")  # what a policy glob reads as a pattern
FACT_NAME = re.compile(r"[A-Za-z0-9._-]{1,63}\Z")  # \Z: `$` would also end before a newline
# A proxy's host by name (or IPv4 address): dot-separated labels of up to 63 characters.
_DNS_NAME = re.compile(r"[A-Za-z0-9_-]{1,63}(?:\.[A-Za-z0-9_-]{1,63})*\.?\Z")
MAX_FACT_DAYS = 999999


class BackendSettings(_Strict):
    id: Identifier
    kind: BackendKind
    base_url: str | None = None
    models: tuple[ModelSettings, ...] = Field(min_length=1)
    region: str = Field(min_length=1)
    owner: str = Field(min_length=1)
    retention: RetentionSettings = RetentionSettings()
    capacity: CapacitySettings = CapacitySettings()
    api_key: str | None = Field(default=None, repr=False)
    api_key_env: str | None = None
    provider: str | None = None
    breaker: BreakerSettings | None = Field(
        default=None, description="this backend's circuit breaker; default routing.breaker"
    )
    first_byte_timeout_s: float | None = Field(
        default=None, gt=0, description="before failover; default limits.first_byte_timeout_s"
    )
    tls: BackendTLSSettings | None = Field(
        default=None, description="CA, mutual TLS, server name and key pins of an https backend"
    )
    identity: Literal["declared", "certificate"] = Field(
        default="declared",
        description="certificate: region, owner and retention must match the certificate's",
    )
    attest: AttestSettings | None = Field(
        default=None, description="private backends behind `owngate attest`: its key"
    )
    unsafe_unchecked_azure_host: bool = Field(
        default=False,
        description="a hosted Azure backend's base_url may be https at any host (an API "
        "Management gateway, a custom domain): where it forwards is the operator's word",
    )
    proxy: str | None = Field(
        default=None,
        description="hosted backends: the HTTP proxy (http://host:port) their calls go "
        "through; default none, straight to the provider (HTTP_PROXY and the like in the "
        "environment are never used)",
    )
    isolate_prefix_cache: bool = Field(
        default=False,
        description="the server partitions its prefix cache by `cache_salt` (vLLM, SGLang): "
        "the gateway sets it per tenant",
    )
    media_urls: MediaUrlSettings = Field(
        default=MediaUrlSettings(),
        description="private backends: the http(s) media URLs it may be sent to fetch "
        "(gateway/config/media.py)",
    )

    @field_validator("provider", mode="before")
    @classmethod
    def _written_provider(cls, value: object) -> object:
        # Run only for a key written: `provider:` with no value judged the owner unseen.
        if value is None:
            raise ValueError(
                "provider is written with no value: write the provider, or leave the key "
                "out (policies then judge a hosted backend by its owner)"
            )
        return value

    @field_validator("region", "owner", "provider")
    @classmethod
    def _plain_fact(cls, value: str | None) -> str | None:
        # Policies match these facts by name: `region: "us-east-1 "` (or with a zero-width
        # space, a look-alike letter) escaped `residency.deny: [us]` (plain_names.py).
        problem = None if value is None else plain_name_problem(value)
        if problem is not None:
            raise ValueError(f"{problem}; policies match this name as written")
        # A fact is one name, which policies match with their globs: a fact written as a
        # glob itself (`region: us-*`, "somewhere in the US") is the literal name `us-*`,
        # which no region in the jurisdiction table is, so `residency.deny: [us]` let it
        # through. A backend that may be anywhere in a country is declared by its code.
        if value is not None and _GLOB.search(value):
            raise ValueError(
                f"{value!r} holds a glob character (* ? [ ]): a declared fact is one name, "
                "and policies would match it as that literal name (`region: us-*` escapes "
                "`residency.deny: [us]`); declare the name, or the jurisdiction code "
                "(`region: us`) for a backend that may be anywhere in it"
            )
        return value

    @field_validator("base_url")
    @classmethod
    def _url_shape(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value.isascii() or not value.isprintable() or " " in value:
            raise ValueError("base_url must be plain ASCII without spaces or control characters")
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("base_url must be an absolute http(s) URL")
        if "@" in parts.netloc:  # `https://api.openai.com@evil.example`; never quoted
            raise ValueError(
                f"base_url must not carry userinfo (user@, user:password@) before its host "
                f"{parts.hostname!r}: the host is what follows the @, whatever the text before "
                "it reads as, and a password would be shown (api_key_env holds a key)"
            )
        try:
            parts.port  # noqa: B018 - raises on a port out of range
        except ValueError as exc:
            raise ValueError(f"base_url has an invalid port: {exc}") from exc
        if parts.query or parts.fragment:
            raise ValueError("base_url must not carry a query or fragment")
        return value.rstrip("/")

    @field_validator("proxy")
    @classmethod
    def _proxy_shape(cls, value: str | None) -> str | None:
        # Shown in /admin/status and logs: a password in it would be too, so none is taken.
        if value is None:
            return None
        parts = urlsplit(value)
        if not value.isascii() or not value.isprintable() or " " in value:
            raise ValueError("proxy must be plain ASCII without spaces or control characters")
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError("proxy must be an http:// URL (http://host:port)")
        try:
            port = parts.port
        except ValueError as exc:
            raise ValueError(f"proxy has an invalid port: {exc}") from exc
        if port is None:
            raise ValueError("proxy must name its port (http://host:port)")
        if port == 0:
            raise ValueError("proxy has an invalid port: 0")
        if "@" in parts.netloc:
            raise ValueError("proxy must not carry credentials (they would be shown)")
        if parts.path.strip("/") or parts.query or parts.fragment:
            raise ValueError("proxy must be http://host:port, without a path or query")
        # urlsplit reads past what a host may be (`[fd00::9]x` is host fd00::9): each call
        # would then fail to connect, so the host is checked whole, as written.
        host = parts.netloc.rpartition(":")[0]
        if not (_DNS_NAME.match(host) or _ipv6_literal(host)):
            raise ValueError(
                "proxy's host must be a DNS name, an IPv4 address or a bracketed IPv6 "
                f"address: {host!r}"
            )
        return f"http://{host.lower()}:{port}"

    @model_validator(mode="before")
    @classmethod
    def _attested_facts_declared(cls, data: object) -> object:
        # The certificate proves the facts; it does not supply them: policies are decided
        # on the declared ones before any connection is made, and each new connection must
        # then show the same. Without this, a backend written as the issue reads ("facts
        # read from the certificate") was refused with a bare "Field required".
        if isinstance(data, dict) and data.get("identity") == "certificate":
            missing = [fact for fact in ("region", "owner") if fact not in data]
            if missing:
                raise ValueError(
                    f"identity: certificate, but {' and '.join(missing)} not declared: "
                    "declare the facts the certificate states (owngate:region:, "
                    "owngate:owner:, owngate:retention: URI SANs) here too; policies are "
                    "decided on them before a connection, and a backend whose certificate "
                    "states others gets no request"
                )
        return data

    @model_validator(mode="after")
    def _kind_rules(self) -> BackendSettings:
        if self.kind in PRIVATE_KINDS:  # names no provider (provider_routes.py)
            if self.base_url is None:
                raise ValueError(f"a {self.kind} backend needs base_url (the server root)")
            written = [m.provider_model for m in self.models]
            check_private(self.kind, self.base_url, self.provider, written, self.tls)
        if self.tls is not None or self.identity == "certificate":
            if self.kind not in PRIVATE_KINDS:
                raise ValueError("tls and identity apply to private backends only")
            if urlsplit(self.base_url or "").scheme != "https":
                raise ValueError(
                    "a backend with tls or identity: certificate needs an https base_url"
                )
        if self.identity == "certificate" and (self.tls is None or self.tls.ca_file is None):
            raise ValueError(
                "identity: certificate needs tls.ca_file: facts count only from a certificate "
                "issued by the organisation's own CA"
            )
        if self.identity == "certificate":
            self._statable()
        if self.kind == "hosted":
            if self.api_key is not None:
                raise ValueError(
                    "hosted backends take credentials from the environment (api_key_env), "
                    "never from the config file"
                )
            missing = [m.name for m in self.models if not m.provider_model]
            if missing:
                raise ValueError(f"hosted models need provider_model: {', '.join(missing)}")
            # The provider policies judge must be the one LiteLLM sends to.
            models = [m.provider_model for m in self.models if m.provider_model]
            declared = self.provider or self.owner
            unchecked = self.unsafe_unchecked_azure_host
            check_route(declared, models, self.base_url, unchecked_azure_host=unchecked)
            # ... and the region policies judge must be where it processes the request.
            check_bedrock_profiles(self.region, models)
            check_bedrock_regions(self.region, models, self.base_url)
            check_vertex_regions(self.region, models, self.base_url)
            check_openai_region(self.region, self.base_url)
            if unchecked and (self.base_url is None or not is_azure(declared, models)):
                raise ValueError(
                    "unsafe_unchecked_azure_host applies to a hosted Azure backend with "
                    "base_url (the host it lets through); leave it out here"
                )
        elif self.unsafe_unchecked_azure_host:
            raise ValueError("unsafe_unchecked_azure_host applies to hosted backends only")
        if self.proxy is not None and self.kind != "hosted":
            raise ValueError("proxy applies to hosted backends only (private ones are dialed)")
        # A name the backend serves twice would route to two of its models, and a policy's
        # `models` rule judges the name by one of them: `deny: [x]` escaped by asking `y`
        # when `y` is both a model of its own and an alias of `x`.
        names = [name for m in self.models for name in (m.name, *m.aliases)]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(
                f"backend serves {', '.join(map(repr, twice))} more than once (as a model's "
                "name or alias): each name it serves must name one model"
            )
        if self.isolate_prefix_cache:
            self._salted()
        # Its default is what a dumped configuration carries back (a reload, a test's
        # round trip): only another setting is a mistake on a hosted backend.
        if self.kind == "hosted" and self.media_urls != MediaUrlSettings():
            raise ValueError(
                "media_urls applies to private backends: a hosted provider's URLs are checked "
                "by the gateway's hosted rule (public hosts, resolved)"
            )
        if self.attest is not None:
            if self.kind not in PRIVATE_KINDS:
                raise ValueError("attest is for private backends (hosted ones cannot countersign)")
            # The countersigned request must be the client's bytes: no model renaming.
            if any(m.aliases for m in self.models):
                raise ValueError(
                    "an attested backend serves its models under their own names (no "
                    "aliases): the body it countersigns must be the one the client sent"
                )
            # The sidecar relays only the paths a gateway sends, from its root.
            if urlsplit(self.base_url or "").path.strip("/"):
                raise ValueError(
                    "an attested backend's base_url is the sidecar's root (no path): it "
                    "relays only the paths a gateway sends, /v1/chat/completions and the like"
                )
        return self

    def _salted(self) -> None:
        """`isolate_prefix_cache` only where a server reads `cache_salt` from a body the
        gateway may change: declared on another, it would be isolation in name only."""
        if self.kind in ("hosted", "llamacpp"):
            raise ValueError(
                f"isolate_prefix_cache is for servers that read cache_salt (vllm, sglang, "
                f"or such a server as kind openai): a {self.kind} backend reads none"
            )
        if self.attest is not None:
            raise ValueError(
                "isolate_prefix_cache sets cache_salt in the body, and an attested backend "
                "countersigns the body the client sent: choose one"
            )

    def _statable(self) -> None:
        """With `identity: certificate`, the declared facts must be ones a certificate can
        state: a typo such as `owner: Acme Corp` would otherwise be found only at the first
        connection, as a backend that never serves."""
        for fact in ("region", "owner"):
            value = getattr(self, fact)
            if not FACT_NAME.match(value):
                raise ValueError(
                    f"identity: certificate, but no certificate can state {fact} {value!r} "
                    f"(owngate:{fact}: takes 1-63 of A-Z a-z 0-9 . _ -)"
                )
        if self.retention.days > MAX_FACT_DAYS:
            raise ValueError(
                f"identity: certificate, but no certificate can state retention.days "
                f"{self.retention.days} (owngate:retention: takes at most {MAX_FACT_DAYS}d)"
            )

    @property
    def is_private(self) -> bool:
        return self.kind in PRIVATE_KINDS
