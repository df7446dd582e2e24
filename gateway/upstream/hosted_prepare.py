"""A hosted request checked for its provider before anything is sent (`prepare_request`),
and what it becomes: `Prepared`, the LiteLLM arguments `HostedClient.send_prepared`
(gateway/upstream/hosted.py) sends.

The checks, in order: what the provider would do beyond answering (hosted_fields.py), the
request's OpenAI fields and shapes, and the fields it would not be sent
(openai_request.py), routes that cannot serve it (no streams, boto3's), URLs an adapter
would fetch from here and stored objects it would read (media_urls.py). A refused
request raises `HostedError` ("status", 400, "not sent"); then LiteLLM is loaded (else
`HostedUnavailable`), and a chat field its adapter would drop unsaid is refused the same
way (hosted_support.py).
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any, Final, NamedTuple

from gateway.upstream.hosted_errors import HostedUnavailable
from gateway.upstream.hosted_fields import RefusedField, refuse_provider_actions
from gateway.upstream.hosted_libraries import BOTO3_ROUTES
from gateway.upstream.hosted_support import SupportTable, not_valid
from gateway.upstream.invalid_field import InvalidField
from gateway.upstream.litellm_runtime import aload_litellm
from gateway.upstream.media_urls import Resolver, check_embedding_input, check_media_urls
from gateway.upstream.openai_request import request_params
from gateway.upstream.openai_wire import Endpoint

__all__ = ["Prepared", "prepare_request"]

# Routes LiteLLM 1.108.7 serves only synchronously (in a worker thread): it cannot stream
# them (its async wrapper iterates their sync generator as an async one and fails after
# the request went out), and the failed stream's provider connection was never closed, so
# each streamed request held one open (a tenant repeating them ran the process out of
# descriptors). A stream to them is refused unsent. `amazon_nova` is one: its handler is
# maritalk's (`openai_like_chat_completion.completion`, never told `acompletion`); so is
# `custom` (a POST on LiteLLM's module-level sync client), whose stream was sent and
# then failed, each failure charging the backend's breaker: one tenant's streams made
# the backend "failed moments ago" for every tenant.
_SYNC_ONLY_ROUTES: Final = frozenset(
    {"maritalk", "amazon_nova", "custom", "oobabooga", "nlp_cloud", "petals"}
)


class Prepared(NamedTuple):
    """A request `HostedClient.prepare` checked for one provider, ready to send."""

    endpoint: Endpoint
    doc: dict[str, Any]
    params: dict[str, Any]
    provider_model: str
    litellm: ModuleType  # loaded: sending cannot fail to load it
    # each media host the check looked up: the addresses a download is sent to
    addresses: dict[str, list[str]] = {}  # noqa: RUF012 - a NamedTuple's default, never changed
    tenant: str = ""  # whose request: its part of a download's lookups (hosted_names.py)


async def prepare_request(
    endpoint: Endpoint,
    doc: dict[str, Any],
    provider_model: str,
    *,
    provider: str,
    resolve: Callable[[], Resolver],
    support: SupportTable,
) -> Prepared:
    """`doc` as `provider_model` gets it, checked without sending anything (see the
    module's notes); `provider` names the backend's provider in the operator's message,
    `resolve()` the tenant's host lookups for URLs in content parts."""
    try:
        if endpoint == "chat":  # what the provider would do beyond answering
            refuse_provider_actions(doc)
        params = request_params(endpoint, doc)
        route = provider_model.partition("/")[0]
        if params.get("stream") and route in _SYNC_ONLY_ROUTES:
            raise InvalidField("stream", "false for this provider's route (no streams)")
        if (endpoint, route) in BOTO3_ROUTES:
            raise InvalidField("model", BOTO3_ROUTES[endpoint, route])
        addresses: dict[str, list[str]] = {}
        if endpoint == "chat":  # URLs an adapter would fetch from here
            named = provider_model.split("/", 1)[0] if "/" in provider_model else ""
            # its lookups hold its part of the threads
            addresses = await check_media_urls(params, named or provider, resolve())
        elif endpoint == "embeddings":  # objects an adapter would read from the account
            check_embedding_input(params)
    except (InvalidField, RefusedField) as exc:
        raise not_valid(provider, exc) from None
    try:
        litellm = await aload_litellm()
    except Exception as exc:  # whatever the import raised: the gateway's own failure
        raise HostedUnavailable(type(exc).__name__[:80]) from exc
    support.check(litellm, endpoint, params, provider_model)  # HostedError, 400
    return Prepared(endpoint, doc, params, provider_model, litellm, addresses)
