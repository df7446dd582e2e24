"""vLLM's `mm_payload` (multimodal input given beside the messages, as its render endpoint
writes it): each string in it, at any depth, is one vLLM may load as a media item.

Read once per request, by one walk (gateway/api/media_walk.py `MediaWalk.payload`, within
`limits.max_media_walk_values`): the media check (gateway/api/private_media.py) judges each
string it kept as a media reference, a URL where its key is `url` or ends in `_url`; the
token bound and reservation (gateway/api/usage_bound.py) count each string as a media item,
as they count an `image_url` part (before, an image in `mm_payload` counted for nothing, so
a request of many images there was reserved and bounded as text and escaped `MEDIA_MOST`).
Numbers in it (precomputed embeddings) are not items: the body's bytes already justify their
tokens. An array's strings are counted and judged in C, no Python step per string.
"""

from __future__ import annotations

from typing import Final

__all__ = ["MM_PAYLOAD"]

MM_PAYLOAD: Final = "mm_payload"
