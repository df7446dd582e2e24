"""Identifiers a client chooses, made its tenant's own before they leave the gateway.

Every tenant shares the gateway's account at a hosted provider, and a private server's
prefix cache. A few request fields name something at that shared place, and a client
could name another tenant's:

- `prompt_cache_key` routes an OpenAI request to the machines holding that key's prompt
  cache: with another tenant's key, a tenant's answers report that tenant's cache hits
  (`usage.prompt_tokens_details.cached_tokens`), a test of what its prompts begin with.
- `user` and `safety_identifier` name the end user for the provider's abuse monitoring:
  with another tenant's value, a tenant's abuse is charged to that tenant's user (and
  gets it blocked).
- vLLM's and SGLang's `cache_salt` partitions the server's prefix cache: the gateway sets
  it, for a backend that declares it honours it (`isolate_prefix_cache`), so that no
  tenant's request reuses (or times) another's cached prefix.

The same fields reach private backends (`scoped_body`): a `kind: openai` backend may be a
router shared by every tenant (a LiteLLM proxy on one provider account), where they name
the same things; so does `metadata.user_id`, which a LiteLLM proxy reads as the end user
(its spend, budget and rate limits) when there is no `user` (the hosted path never sends
`metadata`). They are sent as the tenant's own there too, except to an attested
backend, which countersigns the body the client sent (vLLM, SGLang and llama.cpp keep no
state by them).

The gateway sends a keyed digest in their place, keyed by the tenant id (at most 63
characters, within BLAKE2b's 64-byte key): the same value from the same tenant is the
same value sent (a cache key still finds its cache, a user stays one user), and two
tenants' values never meet, whatever each writes, as a collision would take one of 128
bits (256 for a salt). Identifiers are `og-<tenant tag>-<digest>` (44 characters, under
OpenAI's 64 for `user` and `safety_identifier`): the tag (the first 8 hex digits of the
tenant id's BLAKE2b digest) lets an operator find the tenant of an identifier a provider
reports; the digest is the same for a value sent as `user` or as `safety_identifier`.
The key is no secret: who knows a tenant id and guesses a client's value can compute
what was sent (a client should send hashed ids, as OpenAI asks, not names or emails).
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping
from typing import Any, Final

import orjson

from gateway.json_loads import loads

__all__ = [
    "CACHE_SALT",
    "IDENTIFIER_FIELDS",
    "cache_salt",
    "salted_body",
    "scoped_body",
    "scoped_identifier",
    "scoped_params",
]

# The hosted request fields sent as the tenant's own (gateway/upstream/openai_request.py
# forwards them; a value reaches here as a string, its type checked there).
IDENTIFIER_FIELDS: Final = ("user", "safety_identifier", "prompt_cache_key")
# Their lengths: a body's other top-level names are not case-folded (`scoped_body`).
_LENGTHS: Final = frozenset(map(len, IDENTIFIER_FIELDS))
# A LiteLLM proxy's end user when there is no `user`: `metadata.user_id`.
_METADATA, _METADATA_USER = "metadata", "user_id"
# The private servers' field for a prefix cache's partition (vLLM, SGLang).
CACHE_SALT: Final = "cache_salt"
_IDENTIFIER: Final = b"og-identifier"  # BLAKE2b personalization: one domain each
_SALT: Final = b"og-cache-salt"


def _tag(tenant: str) -> str:
    return hashlib.blake2b(tenant.encode(), digest_size=4).hexdigest()


def scoped_identifier(tenant: str, value: str) -> str:
    """`og-<tag>-<32 hex>`: `value` as tenant `tenant`'s own (see the module docstring)."""
    digest = hashlib.blake2b(
        value.encode("utf-8", "surrogatepass"),
        digest_size=16,
        key=tenant.encode(),
        person=_IDENTIFIER,
    )
    return f"og-{_tag(tenant)}-{digest.hexdigest()}"


def scoped_params(params: Mapping[str, Any], tenant: str) -> dict[str, Any]:
    """A copy of `params` with each string identifier (`IDENTIFIER_FIELDS`) the tenant's
    own; other values as they are."""
    scoped = dict(params)
    for name in IDENTIFIER_FIELDS:
        value = scoped.get(name)
        if isinstance(value, str):
            scoped[name] = scoped_identifier(tenant, value)
    return scoped


def cache_salt(tenant: str, given: object = None) -> str:
    """The `cache_salt` a request of `tenant` is sent with: 43 base64url characters (256
    bits, the length vLLM asks for). A client's own salt (`given`, any JSON value but
    null) partitions further within its tenant, never into another's."""
    material = b"" if given is None else b"\x01" + orjson.dumps(given)
    digest = hashlib.blake2b(material, digest_size=32, key=tenant.encode(), person=_SALT)
    return base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()


def salted_body(body: bytes, doc: Mapping[str, Any], tenant: str) -> bytes:
    """`body` (the JSON object `doc`, but for a renamed `model` or the like) with
    `cache_salt` set to the tenant's (`cache_salt`, the client's own salt mixed in).

    Without the client's salt, the field is spliced in after the opening brace and no
    other byte changes. Otherwise the body is re-encoded without every top-level key that
    folds to `cache_salt` (`"Cache_Salt"`: a server in Go matches names without regard
    to case, reading the last), and with the tenant's salt."""
    given = [name for name in doc if name.casefold() == CACHE_SALT]
    salt = orjson.dumps(cache_salt(tenant, doc.get(CACHE_SALT)))
    if not given and doc:
        start = body.index(b"{") + 1  # the object's first byte (JSON allows whitespace)
        return body[:start] + b'"' + CACHE_SALT.encode() + b'":' + salt + b"," + body[start:]
    current = loads(body)
    kept = {k: v for k, v in current.items() if k.casefold() != CACHE_SALT}
    return orjson.dumps({CACHE_SALT: orjson.Fragment(salt), **kept})


def scoped_body(body: bytes, doc: Mapping[str, Any], tenant: str) -> bytes:
    """`body` (the JSON object `doc`, but for a renamed `model` or the like) with each
    identifier (`IDENTIFIER_FIELDS`, and `metadata.user_id`) the tenant's own, for a
    private backend; `body` itself when `doc` has none (most requests: no byte changes).

    A name in any case counts (`"User"`: a router in Go matches names without regard to
    case), and so does a value that is not a string but null (its JSON text is digested:
    a lax router reads `12345` as the string `"12345"`). The body is re-encoded from
    `body` parsed again, so a repeated name's other copies are gone with it."""
    if not any(_names_identifier(k, doc[k]) for k in doc):
        return body
    current = loads(body)
    for name, value in current.items():
        if value is None or not _names_identifier(name, value):
            continue
        if name.casefold() == _METADATA:
            current[name] = {
                k: v if v is None or k.casefold() != _METADATA_USER else _scoped(tenant, v)
                for k, v in value.items()
            }
        else:
            current[name] = _scoped(tenant, value)
    return orjson.dumps(current)


def _names_identifier(name: str, value: Any) -> bool:
    """Whether the top-level `name` (with `value`) is an identifier, or a `metadata`
    object holding `user_id`, in any case."""
    if len(name) in _LENGTHS and name.casefold() in IDENTIFIER_FIELDS:
        return True
    return (
        len(name) == len(_METADATA)
        and isinstance(value, dict)
        and name.casefold() == _METADATA
        and any(len(k) == len(_METADATA_USER) and k.casefold() == _METADATA_USER for k in value)
    )


def _scoped(tenant: str, value: Any) -> str:
    written = value if isinstance(value, str) else orjson.dumps(value).decode()
    return scoped_identifier(tenant, written)
