"""The affinity scorer: send a shared prompt prefix back where its prefix cache is.

    affinity = 1 if the backend most recently served this prompt prefix, else 0

and it counts only while that backend is lightly loaded (demand per slot within
`LOAD_SLACK` of the least loaded candidate's, gateway/routing/load.py) and below
saturation (demand < slots): bounded-load affinity never builds a queue.

The prefix (`prefix_span`): a digest of the prompt's leading part (every message but
the newest turn, or a completion's prompt), its first `routing.affinity_prefix_bytes`
bytes (default 4096); prompts under 64 bytes have none. The digest is keyed by the
request's tenant (`scope`): one tenant's prompts never steer another's requests. Without
it, a tenant sending a guess of another tenant's conversation was sent where that
tenant's request had gone (the receipt names the backend) when the guess was right, and
elsewhere when not: a way to test what others' prompts hold, and to move where another
tenant's prefix is served. Which backend served a prefix last is remembered by the
picker (at most 65,536 prefixes, least recent dropped), fed by the plan's `report` when
an attempt served. Config: the weight `routing.*.weights.affinity` (default 0.5),
`routing.affinity_prefix_bytes`.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

__all__ = ["affinity_score", "prefix_key", "prefix_span"]


def affinity_score(preferred: bool, lightly_loaded: bool, demand: float, slots: float) -> float:
    """`preferred`: the backend served the request's prefix last."""
    return 1.0 if preferred and lightly_loaded and demand < slots else 0.0


def prefix_key(doc: dict[str, Any], chars: int, scope: str = "") -> bytes | None:
    """A digest of the prompt's leading part (system prompt, earlier turns), keyed by
    `scope` (the tenant id): requests of one scope that share it can reuse a backend's
    prefix cache. None when there is nothing to share."""
    found = prefix_span(doc, chars, scope)
    return None if found is None else found[0]


def prefix_span(doc: dict[str, Any], chars: int, scope: str = "") -> tuple[bytes, int] | None:
    """`prefix_key` and how many bytes of the request it covers."""
    messages = doc.get("messages")
    if isinstance(messages, list) and messages:
        # Everything but the newest turn is what a follow-up shares with its predecessor.
        head = messages[:-1] if len(messages) > 1 else messages
        try:
            text = orjson.dumps(head)
        except TypeError:
            return None
    else:
        prompt = doc.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            return None
        text = prompt.encode()
    if len(text) < 64:
        return None  # too short to matter for a prefix cache
    shared = text[:chars]
    # A tenant id is at most 63 characters, within BLAKE2b's 64-byte key.
    digest = hashlib.blake2b(shared, digest_size=16, key=scope.encode()).digest()
    return digest, len(shared)
