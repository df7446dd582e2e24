"""How the gateway trusts a private backend (`backends[].tls`, `backends[].attest` in
gateway.yaml): TLS with its own CA, mutual TLS and key pins, and the `owngate attest`
sidecar's countersignatures (gateway/config/backends.py `BackendSettings` holds them)."""

from __future__ import annotations

import base64
import re

from pydantic import Field, field_validator, model_validator

from gateway.config.base import _Strict
from gateway.provenance.errors import KeyFormatError
from gateway.provenance.formats.note import Verifier

__all__ = ["AttestSettings", "BackendTLSSettings"]

_PIN = re.compile(r"^sha256//[A-Za-z0-9+/]{43}=$")


class BackendTLSSettings(_Strict):
    """How the gateway authenticates a private backend over TLS (and itself to it).

    Paths are relative to gateway.yaml's directory; `gateway.upstream.tls` reads them when
    the gateway is assembled (so `config validate` names a missing or unreadable file).
    A pin is `sha256//` + the standard base64 of SHA-256 over the DER SubjectPublicKeyInfo
    of the backend's certificate, as `curl --pinnedpubkey` writes it."""

    ca_file: str | None = Field(default=None, min_length=1, description="the only trusted roots")
    client_cert_file: str | None = Field(default=None, min_length=1, description="mutual TLS")
    client_key_file: str | None = Field(default=None, min_length=1, description="mutual TLS")
    server_name: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$",
        description="SNI and the name checked; default: base_url's host",
    )
    pin_spki_sha256: tuple[str, ...] = ()

    @field_validator("pin_spki_sha256")
    @classmethod
    def _pin_shape(cls, pins: tuple[str, ...]) -> tuple[str, ...]:
        if not pins:
            # Written and empty (a template whose list came out empty, say): "no pin"
            # would accept any key the CA certified, silently. An empty key set denies
            # elsewhere; here it is refused, and leaving the key out says "no pin".
            raise ValueError(
                "pin_spki_sha256 is empty: list the keys the backend may present, or leave "
                "the key out to accept any key its CA certified"
            )
        for pin in pins:
            if (
                not _PIN.match(pin)
                or base64.b64encode(base64.b64decode(pin[8:])).decode() != pin[8:]
            ):
                raise ValueError(
                    f"pin {pin!r} is not sha256// followed by the base64 of 32 bytes "
                    "(owngate backend cert prints it; see docs/backend-tls.md)"
                )
        return pins

    @model_validator(mode="after")
    def _key_pair(self) -> BackendTLSSettings:
        if (self.client_cert_file is None) != (self.client_key_file is None):
            raise ValueError("client_cert_file and client_key_file go together (mutual TLS)")
        return self


class AttestSettings(_Strict):
    """A backend behind `owngate attest`: every answer must carry that sidecar's
    countersignature (docs/provenance.md, layer 3)."""

    key: str = Field(
        min_length=1, description="the sidecar's verifier key (name+hexid+base64, signed-note)"
    )

    @field_validator("key")
    @classmethod
    def _verifier_key(cls, value: str) -> str:
        try:
            Verifier(value)
        except KeyFormatError as exc:
            raise ValueError(f"attest.key is not a verifier key: {exc}") from exc
        return value.strip()
