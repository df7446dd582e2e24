"""The most tokens one answer may be charged: what its request and its bytes justify.

A backend's `usage` is its own word. A hostile or broken one could report 2**53 tokens
and put the tenant's tokens-per-minute budget 30 days in debt (the ledger's cap). So the
tenant is charged the reported usage only up to a bound the request itself justifies:

    bound = prompt bound + completion bound            (at most 2**53)
    prompt bound     = request body bytes + PROMPT_ALLOWANCE
                       + MEDIA_ALLOWANCE per media item (`media_parts`: a chat
                         message's non-text parts and `images`, embeddings' media,
                         each string of vLLM's `mm_payload`, counted once per
                         request; one of more than `MEDIA_MOST` (65,536) media items
                         is refused, text parts not counted)
    completion bound = answer bytes + choices * COMPLETION_ALLOWANCE
                       or, when the client set a limit every backend reads,
                       answer bytes + choices * limit when that is less
    limit            = the largest of max_tokens, max_completion_tokens, n_predict
                       and min_tokens; none unless max_tokens or
                       max_completion_tokens is set, and none when any of the first
                       three is set to anything but a whole number (llama.cpp reads
                       -1 as no limit; builds that fall back on a wrong type read a
                       string or a bool as absent)
    choices          = the largest of n, best_of and n_cmpl (1 when none is set;
                       "3", 3.0 and true count, as pydantic reads them), times the
                       prompts of a text completion's batch (`prompt` an array of
                       strings, token arrays or llama.cpp's prompt objects: one
                       answer per prompt each)

Why each term holds for an honest backend: a prompt token is at least one byte of the
text the client sent (JSON escapes only add bytes), plus what the backend adds that the
body does not carry: a chat template's role markers and default system prompt
(`PROMPT_ALLOWANCE`), and an image, audio or video part that it fetches or decodes into
many tokens from a short URL or a small file (`MEDIA_ALLOWANCE` each, as is each item of a
message's `images`, of a llama.cpp prompt object's `multimodal_data`, in a completion's
`prompt` or an embedding's `input` or `content`, each `image` and `video` of SGLang's
embedding input objects, and each string of an Infinity embedding's `input` whose
`modality` is not text).
An output token is
at least one byte of the answer relayed (a whole answer's body, or a stream's relayed
bytes), except tokens that leave no text: end-of-sequence and other special tokens, and a
hosted reasoning model's hidden reasoning (`COMPLETION_ALLOWANCE` per choice, or the
client's limit per choice when less). The limit bounds only those: the answer's bytes
count whatever the limit, since a backend may read another field over it (llama.cpp's
`n_predict` wins over `max_completion_tokens`, which wins over `max_tokens`:
`{"max_tokens": 1, "n_predict": -1}` generated without end and was charged one output
token). So the limit is the largest of the fields any backend reads as one, and there is
none when a backend may read none of them (vLLM and SGLang ignore `n_predict`) or read one
as "no limit": llama.cpp b10434 answered `{"max_tokens": 1, "n_predict": 60,
"logit_bias": {"1": 100}}` (SmolLM2's `<|im_start|>`, a control token that renders as no
text) with 60 completion tokens and an empty message, so with `n_predict` 100,000 the
bound counted one token of 100,000. Requests that have the server build more prompt than
their bytes (a client's `chat_template`, per-request media processing, sessions) are
refused before they reach a backend (gateway/api/server_fields.py).

What the bound does not know: a media part that becomes more than `MEDIA_ALLOWANCE`
tokens (a long video), or hidden reasoning or tokens without text (a `logit_bias` forcing
a control token, `ignore_eos`) past `COMPLETION_ALLOWANCE` without a limit set, on a model
whose context is longer than that, is charged the bound; the completion record then says
so (`usage_bound`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from gateway.api.media_count import count_media
from gateway.api.media_walk import MediaWalk
from gateway.api.mm_payload import MM_PAYLOAD
from gateway.canonical import MAX_SAFE_INTEGER
from gateway.config.schema import MAX_MEDIA_WALK_VALUES
from gateway.errors import ErrorCode, GatewayError

__all__ = [
    "COMPLETION_ALLOWANCE",
    "MEDIA_ALLOWANCE",
    "MEDIA_MOST",
    "PROMPT_ALLOWANCE",
    "READ_FIELDS",
    "answer_choices",
    "answer_limit",
    "completion_bound",
    "counted_media",
    "media_parts",
    "over_bound",
    "prompt_bound",
    "tokens_bound",
]

PROMPT_ALLOWANCE: Final = 4096  # chat template, default system prompt, special tokens
MEDIA_ALLOWANCE: Final = 65536  # per image, audio, video or file part
COMPLETION_ALLOWANCE: Final = 131072  # per choice: tokens that leave no bytes
# Media items a request may hold (`counted_media`): past it, the count stops (a bound on
# the walk of an SGLang batch of input objects) and the request is refused. Far above any
# backend's own limit (vLLM's `limit_mm_per_prompt`); text parts never count toward it.
MEDIA_MOST: Final = 65536


def prompt_bound(ask: Mapping[str, Any] | None, body_bytes: int, media: int | None = None) -> int:
    """The most prompt tokens a request of `body_bytes` bytes justifies; `media` its
    `counted_media` when the caller has it (else counted here)."""
    media = media_parts(ask) if media is None else media
    return body_bytes + PROMPT_ALLOWANCE + MEDIA_ALLOWANCE * media


def completion_bound(ask: Mapping[str, Any] | None, answer_bytes: int) -> int:
    """The most output tokens an answer of `answer_bytes` bytes to `ask` justifies."""
    choices = answer_choices(ask)
    limit = _limit(ask)
    no_text = COMPLETION_ALLOWANCE if limit is None else min(COMPLETION_ALLOWANCE, limit)
    return answer_bytes + choices * no_text


def answer_choices(ask: Mapping[str, Any] | None) -> int:
    """The most answers (choices) a backend may give `ask`: per prompt, the largest of
    `n`, `best_of` and `n_cmpl`, times the prompts of a batch."""
    return max(1, *(_choices(ask, name) for name in _CHOICE_FIELDS)) * _prompts(ask)


def answer_limit(ask: Mapping[str, Any] | None) -> int | None:
    """The most output tokens per choice every backend reads `ask` as allowing, or None
    when some backend may read it as no limit (see the module's docstring)."""
    return _limit(ask)


def tokens_bound(
    ask: Mapping[str, Any] | None, body_bytes: int, answer_bytes: int, media: int | None = None
) -> int:
    """The most tokens (prompt and output) one answer may be charged."""
    total = prompt_bound(ask, body_bytes, media) + completion_bound(ask, answer_bytes)
    return min(total, MAX_SAFE_INTEGER)


def over_bound(
    reported: int,
    ask: Mapping[str, Any] | None,
    body_bytes: int,
    answer_bytes: int,
    media: int | None = None,
) -> int | None:
    """`tokens_bound` when `reported` exceeds it, else None. `media`: the request's
    `counted_media`, counted at ingress; when None, the content parts are counted only
    when the reported tokens exceed the bound without them (rarely: an honest answer
    stays under it)."""
    without_media = body_bytes + PROMPT_ALLOWANCE + completion_bound(ask, answer_bytes)
    if reported <= without_media:
        return None
    bound = tokens_bound(ask, body_bytes, answer_bytes, media)
    return bound if reported > bound else None


# Fields a backend reads as the number of choices per prompt: OpenAI's `n`, vLLM's
# `best_of`, llama.cpp's `n_cmpl` (read over `n`).
_CHOICE_FIELDS: Final = ("n", "best_of", "n_cmpl")
# Fields a backend reads as the most output tokens per choice: llama.cpp reads the first
# present of `n_predict`, `max_completion_tokens`, `max_tokens`; vLLM and SGLang
# `max_completion_tokens`, else `max_tokens`, and generate at least `min_tokens`.
_LIMIT_FIELDS: Final = ("max_tokens", "max_completion_tokens", "n_predict")
READ_FIELDS: Final = (
    *_LIMIT_FIELDS,
    "min_tokens",
    *_CHOICE_FIELDS,
    "prompt",
    "messages",
    "input",  # the token reservation's (gateway/api/reservation.py): its token ids
    "modality",  # Infinity's: `input` as media URLs (`media_parts`)
    MM_PAYLOAD,  # vLLM's media beside the messages (`media_parts`)
)
"""The top-level request fields the bound and the token reservation read: a backend
must read each as the gateway does, so a body may not repeat one or hold it in another
case (gateway/api/body.py)."""


def _limit(ask: Mapping[str, Any] | None) -> int | None:
    """The most output tokens per choice any backend may read `ask` as allowing, or None
    when some backend may read it as no limit: a limit field that is not a whole number
    (llama.cpp reads -1 as none; builds that fall back on a wrong type read a string or
    a bool as absent), or neither
    `max_tokens` nor `max_completion_tokens` set (vLLM and SGLang read no other)."""
    if ask is None:
        return None
    limit = None
    for name in _LIMIT_FIELDS:
        value = ask.get(name)
        if value is None:
            continue
        if type(value) is not int or value < 0:
            return None
        limit = value if limit is None else max(limit, value)
    if ask.get("max_tokens") is None and ask.get("max_completion_tokens") is None:
        return None
    floor = ask.get("min_tokens")
    if limit is not None and type(floor) is int and floor > limit:
        limit = floor
    return limit


def _choices(ask: Mapping[str, Any] | None, name: str) -> int:
    """A request field as the most choices a backend may read it as, 0 when it is none:
    pydantic (vLLM, SGLang) reads `3.0`, `"3"` and `true` as whole numbers."""
    value = None if ask is None else ask.get(name)
    if type(value) is int:
        return max(value, 0)
    if type(value) is bool:
        return int(value)
    if type(value) is str:
        value = value.strip().lstrip("+").replace("_", "")
        if value.isascii() and value.isdigit():
            # past 2**53 choices the bound is its cap anyway; int() refuses 4,300 digits
            return int(value) if len(value) < 17 else MAX_SAFE_INTEGER
        try:
            value = float(value)
        except ValueError:
            return 0
    if type(value) is float and value.is_integer():
        return max(int(value), 0)
    return 0


def _prompts(ask: Mapping[str, Any] | None) -> int:
    """The prompts of a text completion: an array holding anything but token ids is a
    batch, each entry answered on its own (at most its length: a backend refuses the
    rest); one otherwise (a string, or one prompt's token ids)."""
    prompt = None if ask is None else ask.get("prompt")
    if not isinstance(prompt, list) or all(type(p) is int for p in prompt):
        return 1
    return len(prompt)


def media_parts(
    ask: Mapping[str, Any] | None, body: bytes | None = None, walk: MediaWalk | None = None
) -> int:
    """Content parts of chat messages that are not text, the items of a message's `images`
    (LiteLLM's and Ollama's images beside the content), media items of llama.cpp prompt
    objects (`{"prompt_string": ..., "multimodal_data": [...]}` as a completion's
    `prompt`, an embedding's `input` or `content`), the `image` and `video` of SGLang's
    embedding input objects (`[{"text": ..., "image": ...}]`); and each string of an
    embedding's `input` whose `modality` is not text (Infinity fetches and embeds each
    as an image or audio clip), and each string of vLLM's `mm_payload` (its media beside
    the messages: gateway/api/mm_payload.py). Exact up to `MEDIA_MOST` (a count past it
    is refused, `counted_media`), and counted with no Python step per part, message or
    input object (gateway/api/media_count.py). `body`, the bytes `ask` was parsed from:
    when they hold no name the count reads (`_no_media`), none, uncounted. `walk`: the
    request's media walk, which reads `mm_payload` (400 past its bound); without one, a
    payload past the default bound counts as more than `MEDIA_MOST`.

    A message's `content` and `images` and a part's `type` are read in any case too, as a
    server in Go reads them (encoding/json matches names without regard to case and keeps
    the last): `{"content": "hi", "Content": [13 images]}` and `{"type": "text", "Type":
    "image_url", ...}` are 13 images and an image to such a server, and were none to the
    reservation and the bound. A part counts when any of its type names is not text."""
    if ask is None or (body is not None and _no_media(body)):
        return 0
    if walk is not None:
        return count_media(ask, walk, MEDIA_MOST)
    try:
        return count_media(ask, MediaWalk(MAX_MEDIA_WALK_VALUES), MEDIA_MOST)
    except GatewayError:  # refused at ingress (`counted_media`)
        return MEDIA_MOST + 1


def counted_media(ask: Mapping[str, Any], body: bytes, walk: MediaWalk | None = None) -> int:
    """`media_parts`, counted once per request (the token reservation and the usage bound
    are given it); 400 for more than `MEDIA_MOST` media items (text parts not counted),
    and for a `mm_payload` past the bound of `walk` (the request's media walk, which the
    media check reads next; the default bound's without one)."""
    found = media_parts(ask, body, MediaWalk(MAX_MEDIA_WALK_VALUES) if walk is None else walk)
    if found > MEDIA_MOST:
        raise GatewayError(
            ErrorCode.invalid_request,
            f"the request holds more than {MEDIA_MOST} media items (its messages' image, "
            "audio, video and file parts and images, its prompts' media): send fewer, in "
            "more requests",
        )
    return found


# What `_no_media` looks for in the lowered bytes: the names a media item sits under (a
# part's `type` is checked on its own), and a `\u` escape that may spell a letter of one
# (an ASCII letter or `_`, U+017F or U+212A, which fold to `s` and `k`).
# `modality`, `multimodal_data`; `audio`: vLLM's `input_audio` part without `type`;
# `mm_payload`: vLLM's media beside the messages, whatever names its items
_MEDIA_NAMES: Final = (b"image", b"video", b"audio", b"modal", MM_PAYLOAD.encode())
_LETTER_ESCAPE: Final = re.compile(rb"\\u(?:00[4-7]|017f|212a)")
_TEXT_TYPES: Final = (b'"type": "text"', b'"type":"text"')


def _no_media(body: bytes) -> bool:
    """Whether JSON `body` holds no media item `media_parts` counts, read from its bytes
    in C: none of the names media sit under (`images`, `image`, `video`, `audio`,
    `multimodal_data`, `modality`) in any case, no escape that may spell one, and every
    `type`, in any case, is a `"type": "text"` pair. (A `"` opening an unescaped `"type"`
    in valid JSON starts a key; one escaped inside a string is a key ending in `"type`;
    so when each `type` lies in such a pair, every part's type is text.) A body that
    holds any of them is walked, a chat of tool calls or of the word "image" too."""
    low = body.lower()
    if any(name in low for name in _MEDIA_NAMES):
        return False
    if b"\\u" in low and _LETTER_ESCAPE.search(low):
        return False
    types = low.count(b"type")
    return types == body.count(_TEXT_TYPES[0]) or types == sum(map(body.count, _TEXT_TYPES))
