"""The media items of a request (`usage_bound.media_parts`), counted with no Python step per
message, content part, input object or string.

The count runs on the event loop before routing, over every message of a body the byte
scan could not rule out (`usage_bound._no_media`). Judged one part at a time in Python, an
8 MiB body of `{"type": "text", "Type": "text", "text": "a"}` parts took four times its
parse (0.8 s), one of SGLang input objects or of `{"a": "b"}` in `mm_payload` as long or
longer; the `Type` shape was bounded by nothing. So each place is read by C-level calls
over all its members at once (`map`, `compress`, `chain`), as usage_bound.py's docstring
says what counts:

- a message's members whose name is `content` or `images` in any case, as a server in Go
  reads them (`str.casefold` folds none of these names from another length: no `ss`,
  `ff`, `fi`, `fl` or `st` in them): each part of a `content` array judged (`_parts`),
  each item of `images` counted (one that is not an array, one item);
- a part is media when its `type` is neither `text` nor null, when `type` is null beside a
  member other than `text`, when a member's name holds `image`, `audio` or `video` (in any
  case), or when a member other than `type` whose name Go reads as `type` (`Type`) holds
  anything but `text` or null in a part of more than one member; the members are read
  only for the parts that are not plain text (`type` text, no other member than `text`);
- each `multimodal_data`, `image` and `video` item of a prompt or input object (llama.cpp's
  and SGLang's), a batch read in slices, stopping once the count passes `most`;
- each string of vLLM's `mm_payload`: walked by gateway/api/media_walk.py (`MediaWalk.payload`,
  the media check's own walk of it, within `limits.max_media_walk_values`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from itertools import chain, compress, islice, repeat
from operator import and_, contains, eq, gt, is_, le, not_, or_
from typing import Any, Final

from gateway.api.media_walk import MediaWalk
from gateway.api.mm_payload import MM_PAYLOAD

__all__ = ["count_media"]

_TEXT_PART: Final = frozenset(("type", "text"))
_TEXT_OR_NULL: Final = ("text", None)
# What names a part's media to vLLM when it has no `type` (or a `uuid`): `image_url`,
# `image_pil`, `image_embeds`, `audio_url`, `input_audio`, `audio_embeds`, `video_url`;
# any name holding one of these counts (in any case).
_PART_MEDIA: Final = re.compile("image|audio|video").search
# Where a prompt or input object sits: a completion's `prompt`, an embedding's `input`, and
# llama.cpp's embeddings `content` (read when there is no `input`), each the object itself
# or entries of a batch; its media: llama.cpp's `multimodal_data` (an array of items),
# SGLang's embeddings `image` and `video` (one item each; an array counts its items).
_PROMPT_HOLDERS: Final = ("prompt", "input", "content")
_PROMPT_MEDIA: Final = ("multimodal_data", "image", "video")
_SLICE: Final = 4096  # the fewest input objects a batch is read in at a time
_TEXT_MODALITY: Final = (None, "text")  # Infinity's `modality` that reads `input` as text
_FEW: Final = 4  # spellings of a message's `content` or `images` read one at a time


def count_media(ask: Mapping[str, Any], walk: MediaWalk, most: int) -> int:
    """The media items of `ask` (see the module's docstring), exact up to `most`: past it,
    some count over `most`. `walk` reads `mm_payload` (400 past its bound)."""
    found = _modality_inputs(ask)
    if MM_PAYLOAD in ask:
        found += walk.payload(MM_PAYLOAD, ask[MM_PAYLOAD])
    messages = ask.get("messages")
    if isinstance(messages, list):
        found += _messages(messages)
    for name in _PROMPT_HOLDERS:
        if found > most:
            break
        value = ask.get(name)
        if isinstance(value, dict):
            found += _objects_media([value])
        elif isinstance(value, list):
            found += _batch_media(value, most - found)
    return found


def _modality_inputs(ask: Mapping[str, Any]) -> int:
    """The strings of an embedding's `input` that Infinity reads as media URLs (its
    `modality` not text: gateway/api/private_media.py), each counted."""
    if ask.get("modality") in _TEXT_MODALITY:
        return 0
    value = ask.get("input")
    if isinstance(value, str):
        return 1
    return sum(map(isinstance, value, repeat(str))) if isinstance(value, list) else 0


def _dicts(values: list[Any]) -> list[dict[str, Any]]:
    return list(compress(values, map(isinstance, values, repeat(dict))))


def _items(values: list[Any]) -> int:
    """Items at places where each one counts: an array's each, anything else but null one."""
    arrays = list(compress(values, map(isinstance, values, repeat(list))))
    return sum(map(len, arrays)) + len(values) - len(arrays) - values.count(None)


def _messages(messages: list[Any]) -> int:
    """The media of chat messages: their `content` parts and `images`, in any case."""
    messages = _dicts(messages)
    names = set(chain.from_iterable(map(dict.keys, messages)))  # each judged once
    contents = _named(messages, names, "content")
    arrays = compress(contents, map(isinstance, contents, repeat(list)))
    return _parts(list(chain.from_iterable(arrays))) + _items(_named(messages, names, "images"))


def _named(objects: list[dict[str, Any]], names: set[str], name: str) -> list[Any]:
    """The values of `objects`' members whose names (of `names`) Go reads as `name` (None
    for an object without one), read a spelling at a time; member by member past a few."""
    spelled = list(compress(names, map(eq, map(str.casefold, names), repeat(name))))
    if len(spelled) > _FEW:
        values = chain.from_iterable(map(dict.values, objects))  # no tuple per member
        keys = map(str.casefold, chain.from_iterable(map(dict.keys, objects)))
        return list(compress(values, map(eq, keys, repeat(name))))
    return list(chain.from_iterable(map(dict.get, objects, repeat(k)) for k in spelled))


def _parts(parts: list[Any]) -> int:
    """How many content `parts` are media (see the module's docstring)."""
    parts = _dicts(parts)
    kinds = list(map(dict.get, parts, repeat("type"), repeat("text")))
    plain = list(map(le, map(dict.keys, parts), repeat(_TEXT_PART)))
    other = list(map(not_, map(and_, map(eq, kinds, repeat("text")), plain)))
    rest, kinds = list(compress(parts, other)), list(compress(kinds, other))
    if not rest:
        return 0  # plain text parts only: the common case
    # by `type`: neither text nor null, or null beside a member other than `text`
    nulled = map(and_, map(is_, kinds, repeat(None)), map(not_, compress(plain, other)))
    media = map(or_, map(not_, map(contains, repeat(_TEXT_OR_NULL), kinds)), nulled)
    # by a member: its name judged once, then each part asked whether it holds one
    names = set(chain.from_iterable(map(dict.keys, rest)))
    named = set(compress(names, map(_PART_MEDIA, map(str.lower, names))))
    if named:
        media = map(or_, media, map(not_, map(named.isdisjoint, map(dict.keys, rest))))
    # `Type`, `TYPE`, ...: no other letter folds to one of `type`'s, so at most 15 spellings
    spelled = set(compress(names, map(eq, map(str.casefold, names), repeat("type"))))
    for name in spelled - {"type"}:
        held = map(not_, map(contains, repeat(_TEXT_OR_NULL), map(dict.get, rest, repeat(name))))
        media = map(or_, media, map(and_, held, map(gt, map(len, rest), repeat(1))))
    return sum(media)


def _objects_media(objects: list[Any]) -> int:
    """The media items of prompt or input objects (the entries that are objects)."""
    objects = _dicts(objects)
    return sum(_items(list(map(dict.get, objects, repeat(key)))) for key in _PROMPT_MEDIA)


def _batch_media(batch: list[Any], room: int) -> int:
    """The media items of a batch's input objects, read a slice at a time: the count stops
    once it passed `room` (the slices after it are not read)."""
    found = 0
    entries = iter(batch)
    while found <= room:
        piece = list(islice(entries, max(room + 1 - found, _SLICE)))
        if not piece:
            break
        found += _objects_media(piece)
    return found
