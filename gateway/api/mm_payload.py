"""vLLM's `mm_payload` (multimodal input given beside the messages, as its render endpoint
writes it): the strings in it, each of which vLLM may load as a media item.

Read the same way by the media check (gateway/api/private_media.py judges each string as a
media reference, a URL where its key is `url` or ends in `_url`) and by the token bound and
reservation (gateway/api/usage_bound.py counts each string as a media item, as it counts an
`image_url` part: before, an image in `mm_payload` counted for nothing, so a request of
many images there was reserved and bounded as text and escaped `MEDIA_MOST`). Numbers in
it (precomputed embeddings) are not items: the body's bytes already justify their tokens.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

__all__ = ["MM_PAYLOAD", "payload_media", "payload_strings"]

MM_PAYLOAD: Final = "mm_payload"
_URL_KEYS: Final = frozenset({"url", "image_url", "video_url", "audio_url"})


def payload_strings(payload: Any) -> Iterator[tuple[str, bool]]:
    """Each string of `payload` (at any depth: the body's depth is bounded) and whether a
    URL stands there (its key is `url` or ends in `_url`)."""
    stack: list[tuple[Any, bool]] = [(payload, False)]
    while stack:
        value, url_place = stack.pop()
        if isinstance(value, str):
            yield value, url_place
        elif isinstance(value, dict):
            stack.extend(
                (v, k.casefold() in _URL_KEYS or k.endswith("_url")) for k, v in value.items()
            )
        elif isinstance(value, list):
            stack.extend((v, url_place) for v in value)


def payload_media(doc: Any, most: int) -> int:
    """The media items of `doc`'s `mm_payload` (each string in it), counted up to one past
    `most`: the walk stops there (the caller refuses such a count)."""
    if not isinstance(doc, dict) or MM_PAYLOAD not in doc:
        return 0
    found = 0
    for _ in payload_strings(doc[MM_PAYLOAD]):
        found += 1
        if found > most:
            break
    return found
