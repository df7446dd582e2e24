"""A request's media URLs at one attempt's private backend while the config reloads
(gateway/api/proxy.py): judged under the backend's `media_urls` in the request's config
and in the newest one, and, once the media check passed, a reload that narrowed them since
withdrawing the attempt before it sends (gateway/api/private_media.py judges the URLs)."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from gateway.api.decided import Withdrawn
from gateway.api.private_media import MediaRefs
from gateway.errors import GatewayError
from gateway.routing.registry import Registry
from gateway.routing.router import Attempt

__all__ = ["Narrowed", "media_narrowed", "media_refusal"]


class Narrowed(Withdrawn):
    """`media_narrowed`'s reason: the request's own URL withdrew the attempt, the backend
    is up ("refused" for a fallback, as at the first check: gateway/api/proxy.py);
    `error`, the client's 400 if nothing is sent."""

    came_to: ClassVar[str] = "refused"
    error: GatewayError

    def __new__(cls, reason: str, error: GatewayError) -> Narrowed:
        narrowed = super().__new__(cls, reason)
        narrowed.error = error
        return narrowed


def media_refusal(media: MediaRefs, registry: Registry, attempt: Attempt) -> GatewayError | None:
    """The 400 for `media` at `attempt`'s private backend: under its `media_urls` in the
    request's config and, after a config reload, in the newest one too (a reload that
    narrowed it reaches every send after it, as a narrowed policy does)."""
    refused = media.refusal(attempt.backend.config.media_urls)
    newest = registry.newest(attempt.backend.id)
    if refused is None and newest is not None and newest is not attempt.backend:
        refused = media.refusal(newest.config.media_urls)
    return refused


def media_narrowed(
    withdrawn: Callable[[], Withdrawn | None],
    media: MediaRefs,
    registry: Registry,
    attempt: Attempt,
) -> Withdrawn | None:
    """`withdrawn` (`withdrawn_by_reload`), or why a config reload since the media check
    narrowed the backend's `media_urls` below the request's URLs."""
    reason = withdrawn()
    refused = None if reason is not None else media_refusal(media, registry, attempt)
    if refused is not None:
        why = f"{attempt.backend.id}: its media_urls narrowed by a config reload"
        reason = Narrowed(why, refused)
    return reason
