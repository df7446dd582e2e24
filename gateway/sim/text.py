"""Deterministic fake model output: generated tokens, prompt token counts, embeddings.

Generated text depends only on (seed, prompt, choice): the same prompt gives the same
tokens whether streamed or not, and a shorter `max_tokens` gives a prefix of a longer one.
Choice 0 (the only one when `n` is 1) has the text of the prompt alone; choices 1.. of an
`n` > 1 request each vary deterministically from it.
Consecutive tokens always differ (LiteLLM aborts a stream after 100 identical chunks).
The vocabulary includes non-ASCII, quotes, a backslash and a newline so byte-exact
relaying and JSON escaping get exercised.

Prompt tokens are estimated as ceil(utf-8 bytes of all prompt text / 4).
"""

from __future__ import annotations

import hashlib
import math
import struct
from typing import Final

import orjson

__all__ = [
    "VOCABULARY",
    "TextGenerator",
    "WireError",
    "chat_prompt_tokens",
    "completion_prompt_tokens",
    "message_bytes",
    "prompt_list",
    "text_tokens",
]

VOCABULARY: Final[tuple[str, ...]] = (
    " the",
    " a",
    " model",
    " token",
    " stream",
    " gateway",
    " route",
    " policy",
    " private",
    " backend",
    " queue",
    " slot",
    " batch",
    " cache",
    " decode",
    " prefill",
    " owned",
    " GPU",
    " trust",
    " log",
    " signed",
    " receipt",
    " tenant",
    " request",
    " of",
    " and",
    " to",
    " in",
    " is",
    " for",
    " with",
    " on",
    " quick",
    " brown",
    " fox",
    " jumps",
    " over",
    " lazy",
    " dog",
    " again",
    ",",
    ".",
    ";",
    ":",
    "!",
    "?",
    " (",
    ")",
    " naïve",
    " café",
    " Zürich",
    " 東京",
    " данные",
    " 🙂",
    ' "quoted"',
    " back\\slash",
    "\n",
    " 42",
    " 3.14",
    " -",
    " yes",
    " no",
    " maybe",
    " done",
)

_LCG_MUL: Final = 6364136223846793005
_LCG_ADD: Final = 1442695040888963407
_MASK64: Final = (1 << 64) - 1


class WireError(ValueError):
    """The request body does not have the shape the endpoint needs (a 400 answer)."""


class TextGenerator:
    """Token ids, text and embeddings derived from (seed, prompt)."""

    __slots__ = ("_key", "json_tokens")

    def __init__(self, seed: int) -> None:
        self._key = hashlib.blake2b(str(seed).encode(), digest_size=32).digest()
        # Each token as a JSON string literal, quotes included: stream chunks splice these.
        self.json_tokens: tuple[bytes, ...] = tuple(orjson.dumps(t) for t in VOCABULARY)

    def token_ids(self, prompt: object, count: int, choice: int = 0) -> list[int]:
        """`count` vocabulary indices for `prompt` (any JSON value) and its `choice`
        (0 to n-1), no two in a row equal. The choice salts the digest: choice 0's salt of
        zeros is blake2b's default, so its tokens are those of an `n` = 1 request."""
        digest = hashlib.blake2b(
            orjson.dumps(prompt), digest_size=8, key=self._key, salt=choice.to_bytes(16, "little")
        ).digest()
        state = int.from_bytes(digest, "little")
        ids: list[int] = []
        previous = -1
        for _ in range(count):
            state = (state * _LCG_MUL + _LCG_ADD) & _MASK64
            index = state >> 58  # 64 words: the top 6 bits, the LCG's best ones
            if index == previous:
                index = (index + 1) & 63
            ids.append(index)
            previous = index
        return ids

    @staticmethod
    def text(ids: list[int]) -> str:
        return "".join([VOCABULARY[i] for i in ids])

    def embedding(self, item: object, dims: int) -> list[float]:
        """A unit vector of `dims` floats for one input (string or token list)."""
        seed = orjson.dumps(item)
        values: list[float] = []
        block = 0
        while len(values) < dims:
            digest = hashlib.blake2b(
                seed, digest_size=64, key=self._key, salt=block.to_bytes(16, "little")
            ).digest()
            values.extend(u / 2147483648.0 - 1.0 for u in struct.unpack("<16I", digest))
            block += 1
        del values[dims:]
        norm = math.sqrt(sum(v * v for v in values)) or 1.0
        return [v / norm for v in values]


def _utf8_len(value: str) -> int:
    return len(value.encode("utf-8", "surrogatepass"))


def message_bytes(message: object) -> int:
    """UTF-8 bytes of one chat message's text; raises `WireError` on a wrong shape."""
    if not isinstance(message, dict):
        raise WireError("each message must be an object")
    content = message.get("content")
    if isinstance(content, str):
        return _utf8_len(content)
    if isinstance(content, list):
        return sum(
            _utf8_len(part["text"])
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    if content is not None:
        raise WireError("message 'content' must be a string or an array of parts")
    return 0


def text_tokens(n_bytes: int) -> int:
    """Tokens of `n_bytes` of prompt text: ceil(bytes / 4)."""
    return (n_bytes + 3) // 4


def chat_prompt_tokens(messages: object) -> int:
    """Prompt tokens of a chat `messages` list; raises `WireError` on a wrong shape."""
    if not isinstance(messages, list) or not messages:
        raise WireError("'messages' must be a non-empty array")
    return text_tokens(sum(message_bytes(message) for message in messages))


def completion_prompt_tokens(prompt: object) -> int:
    """Prompt tokens of a completions `prompt` or embeddings `input`.

    Accepts a string, a list of strings, a list of token ids or a list of token-id lists,
    as the OpenAI API does; token ids count one each.
    """
    if isinstance(prompt, str):
        return text_tokens(_utf8_len(prompt))
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return text_tokens(sum(_utf8_len(p) for p in prompt))
        if all(isinstance(p, int) for p in prompt):
            return len(prompt)
        if all(isinstance(p, list) and all(isinstance(t, int) for t in p) for p in prompt):
            return sum(len(p) for p in prompt)
    raise WireError("prompt must be a string, an array of strings or an array of token ids")


def prompt_list(prompt: object) -> tuple[tuple[object, ...], tuple[int, ...]]:
    """A legacy `prompt` of several prompts (a list of two or more strings or token-id
    lists, already validated by `completion_prompt_tokens`): each prompt and its token
    count. One prompt (a string, token ids, or a list of one) gives two empty tuples."""
    if not isinstance(prompt, list) or len(prompt) < 2 or isinstance(prompt[0], int):
        return (), ()
    counts = [text_tokens(_utf8_len(p)) if isinstance(p, str) else len(p) for p in prompt]
    return tuple(prompt), tuple(counts)
