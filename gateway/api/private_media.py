"""Media URLs a private backend would fetch: none inside the organisation's network.

vLLM, llama.cpp and SGLang download the media a request names by URL themselves: vLLM
an `image_url`, `audio_url` or `video_url` part (a part without `type` too, read by its
keys), llama.cpp an `image_url`, and an `input_audio` or `input_video` whose `data` is a
URL, SGLang an `image_url`, `audio_url` or `video_url`, and the `image` and `video` of
an embeddings `input` object (`[{"text": ..., "image": ...}]`, its multimodal
embeddings), and Infinity each string of an embeddings `input` whose `modality` is
`image` or `audio` (a `kind: openai` backend). The fetch comes from the GPU host, inside
the network, and vLLM makes the bytes model input the client reads back: a client could
have it read
`http://169.254.169.254/latest/meta-data/`, `http://127.0.0.1:6379/` or
`http://10.0.0.5/admin`. vLLM opens `file:` URLs under `--allowed-local-media-path`,
llama.cpp `file://` ones under `--media-path`, SGLang a bare path ending in an image
extension (and any existing file as a video).

`MediaRefs.of` finds every string that may be such a reference: in each chat message's
content parts (every key but the part's `type` and `text`, to any depth; `content`,
`type` and `text` in any case too, as a server in Go reads names), in a message's
`images`, in llama.cpp's prompt objects (`multimodal_data` of a completion's
`prompt`, an embedding's `input` or `content`), and in SGLang's embedding `input`
objects (every key but `text`; a URL stands at `image` and `video`), in the `input`
strings of an embedding whose `modality` is not text (a URL stands there), and anywhere in
vLLM's `mm_payload` (multimodal input beside the messages; a URL stands at a key `url` or
ending in `_url`; before, it was not read). `refusal` then
judges them for one backend's `media_urls:` (gateway/config/media.py), before its
dispatch record:

- a string that starts with a scheme (`xxx:`) must be `data:` or an http(s) URL
  (`file:`, `gopher:`, `ftp:`, ... refused);
- one where a URL stands (a part's `url`, or a URL part's own string value:
  `"image_url": "..."`), or that starts with `http` (llama.cpp fetches any such string),
  must be one of those: a bare path or raw base64 is refused there;
- an http(s) URL must be one every fetcher reads alike, to a host that is not a literal
  non-public address (loopback, private, link-local, CGNAT, ULA, IPv4-mapped; decimal,
  octal and hex IPv4 forms read as the address they are) and not a `localhost` name
  (gateway/media_hosts.py); and then what the backend's `media_urls:` allows.

A DNS name that resolves to a private address is not decided here: the server resolves
it again when it fetches, and the answer may change in between (DNS rebinding). The
backend's own settings close that (docs/security.md: vLLM's `--allowed-media-domains`
and `VLLM_MEDIA_URL_ALLOW_REDIRECTS=0`, an egress firewall). Text parts are not read: a
URL in prose is text. A body with no array content and no llama.cpp prompt object (every
plain chat) is not walked: it is only searched for a message that writes `content` twice
(an earlier copy of parts behind the string orjson kept). One that is walked may not
hold a key twice, or in two cases, where a media reference stands
(gateway/api/part_keys.py): a server in Go would read a copy the walk did not.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from itertools import compress, repeat
from operator import contains, methodcaller
from typing import Any, Final

from gateway.api.media_walk import MediaWalk
from gateway.api.mm_payload import MM_PAYLOAD
from gateway.api.part_keys import refuse_ambiguous_parts, refuse_repeated_content
from gateway.config.media import MediaUrlSettings
from gateway.config.schema import MAX_MEDIA_WALK_VALUES
from gateway.errors import ErrorCode, GatewayError
from gateway.media_hosts import BadURL, is_local_name, is_public_address, remote_host

__all__ = ["MAX_REMOTE", "MediaRefs", "MediaWalk"]  # the walk: the media count begins it

MAX_REMOTE: Final = 256
"""The most http(s) media URLs a request may hold (each is parsed once)."""
# The holders of llama.cpp's prompt objects and of SGLang's embedding input objects
_PROMPT_KEYS: Final = ("prompt", "input", "content")
_PROMPT_TEXT: Final = frozenset({"prompt_string", "text"})  # their prose (llama.cpp, SGLang)
# Where SGLang's embedding input object holds a media item: its loader reads a URL, a
# path on its own disk or base64 there, as at a chat part's `image_url`.
_PROMPT_MEDIA: Final = frozenset({"image", "video"})
# A body that holds prompt objects with media names one of these (or spells it escaped).
_NEEDLES: Final = (b"multimodal_data", b'"image"', b'"video"', b"\\u")
_PLAIN: Final = frozenset({"role", "content"})  # a plain chat message's keys
_DICT: Final = frozenset({dict})
_CONTENT_OF: Final = methodcaller("get", "content", "")  # (absent: plain too)
# Infinity's embeddings `modality` that reads `input` as text (absent: text too); with any
# other (`image`, `audio`) it fetches each string of `input` as a URL.
_TEXT_MODALITY: Final = (None, "text")
_CONTENT: Final = b'"content"'
# An escaped ASCII letter (`\u0063`): no encoder writes one, a name spelled to hide may.
_ESCAPED_LETTER: Final = re.compile(rb"\\u00[4-7][0-9a-fA-F]")
_PUBLIC: Final = (
    "a `data:` URL or an http(s) URL to a public host: the private backend fetches it from "
    "inside the network"
)


class MediaRefs:
    """The media URLs of one request (`of`), judged for each private backend (`refusal`)."""

    __slots__ = ("_hosts", "_refused")

    def __init__(self, refused: GatewayError | None, hosts: list[tuple[str, str]]) -> None:
        self._refused = refused  # refused whatever the backend allows
        self._hosts = hosts  # (where, host name) of each http(s) URL

    @classmethod
    def of(
        cls,
        doc: Mapping[str, Any],
        body: bytes,
        most_values: int = MAX_MEDIA_WALK_VALUES,
        walk: MediaWalk | None = None,
    ) -> MediaRefs | None:
        """The media URLs of the request `doc` (parsed from `body`), or None when it names
        none (most requests: nothing is parsed for them). 400 when its media places hold
        more than `most_values` values read one at a time (`limits.max_media_walk_values`),
        or past the bound of `walk`, the request's walk when the media count began it
        (`usage_bound.counted_media`: its `mm_payload` is not walked again)."""
        # Hot path: plain chat messages (a role and a string content) and no llama.cpp
        # prompt object, looked at without a Python call. Any other key (`Content` or
        # `images` beside a role) is walked: the walk reads those too.
        # Told by C-level calls, no Python step per message: a loop over them held the
        # event loop 0.6 s for an 8 MiB body of 250,000 messages, four times its parse.
        messages = doc.get("messages")
        if not isinstance(messages, list) or (
            set(map(type, messages)) <= _DICT  # objects, each of plain keys only
            and all(map(_PLAIN.issuperset, messages))
            and all(map(isinstance, map(_CONTENT_OF, messages), repeat(str)))
        ):
            for name in _PROMPT_KEYS:  # a chat body has none: no search of its bytes
                value = doc.get(name)  # an object, or an array holding one (`_holds_objects`)
                if (
                    isinstance(value, dict)
                    or (isinstance(value, list) and dict in map(type, value))
                ) and _names_prompt_media(body):
                    break
            else:
                # A plain message may hide an earlier `content` (parts) behind its string:
                # orjson kept the last copy, a first-wins reader or a Go type keeping both
                # reads the parts. Searched, not parsed: a repeat writes the name more
                # often than the messages keep it, or spells it with an escaped letter.
                # (`count` and the regex take 4 and 3 ms for an 8 MiB body, orjson 27.)
                if isinstance(messages, list) and (
                    body.count(_CONTENT) > sum(map(contains, messages, repeat("content")))
                    or _ESCAPED_LETTER.search(body) is not None
                ):
                    refuse_repeated_content(body)
                # not an embedding of media URLs, nor vLLM's multimodal payload
                if doc.get("modality") in _TEXT_MODALITY and MM_PAYLOAD not in doc:
                    return None
        if walk is None:  # 400 past `most_values`, before anything else walks
            walk = MediaWalk(most_values)
        _references(doc, body, walk)
        # a key twice or in two cases: readers disagree (its own bound: a second read)
        refuse_ambiguous_parts(body, MediaWalk(most_values).spend)
        hosts: list[tuple[str, str]] = []
        for where, value, url_place in walk.refs:
            if value.startswith("data:"):  # as llama.cpp and SGLang read it: lowercase
                continue
            try:
                host = remote_host(value)
            except BadURL as exc:
                # llama.cpp fetches any string that starts with `http` (`http@127.0.0.1`
                # reads as user `http` at 127.0.0.1 to a parser that guesses the scheme).
                if url_place or _has_scheme(value) or value[:4].lower() == "http":
                    return cls(_refuse(where, f"{_PUBLIC} ({exc})"), hosts)
                continue  # no scheme, where no URL stands: text or base64 (`input_audio.data`)
            if host.address is not None and not is_public_address(host.address):
                why = "a loopback, private, link-local or other non-public address"
                return cls(_refuse(where, f"{_PUBLIC} (its host is {why})"), hosts)
            if host.address is None and is_local_name(host.name):
                return cls(_refuse(where, f"{_PUBLIC} (its host is a `localhost` name)"), hosts)
            hosts.append((where, host.name))
            if len(hosts) > MAX_REMOTE:
                return cls(_refuse("messages", f"at most {MAX_REMOTE} http(s) media URLs"), hosts)
        if walk.too_deep is not None:  # after the strings met before it, as they were met
            raise walk.too_deep
        return cls(None, hosts) if hosts else None

    def refusal(self, settings: MediaUrlSettings) -> GatewayError | None:
        """The 400 for a backend with `settings` (`media_urls:`), or None: it may have it."""
        if self._refused is not None:
            return self._refused
        if settings.remote == "public":
            return None
        listed = settings.hosts
        for where, host in self._hosts:
            if host not in listed:
                allowed = "a `data:` URL" + (
                    " or an http(s) URL to a host this model's backend fetches from"
                    if listed
                    else " (this model's backend fetches no URL)"
                )
                return _refuse(where, allowed)
        return None


def _refuse(where: str, expected: str) -> GatewayError:
    return GatewayError(ErrorCode.invalid_request, f"`{where}` must be {expected}", param=where)


def _has_scheme(value: str) -> bool:
    """Whether `value` starts with a URI scheme and its colon (RFC 3986)."""
    colon = value.find(":", 0, 40)
    return (
        colon > 0
        and value[0].isalpha()
        and value[:colon].isascii()
        and all(c.isalnum() or c in "+.-" for c in value[:colon])
    )


def _references(doc: Mapping[str, Any], body: bytes, walk: MediaWalk) -> None:
    """Each string a server may read as a media reference that may be refused or name a
    host, gathered into `walk` (gateway/api/media_walk.py)."""
    messages = doc.get("messages")
    for i, message in enumerate(messages if isinstance(messages, list) else ()):
        if not isinstance(message, dict):
            continue
        for key, value in message.items():
            folded = key.casefold() if len(key) in (6, 7) else ""
            if folded == "content" and isinstance(value, list):
                walk.parts(f"messages[{i}].{key}", value)
            elif folded == "images":
                walk.strings(f"messages[{i}].{key}", value, True, 0)
    # Infinity's embeddings of media: with `modality` "image" or "audio" each string of
    # `input` is a URL it fetches (or a `data:` URL).
    if doc.get("modality") not in _TEXT_MODALITY:
        value = doc.get("input")
        for k, item in enumerate(value if isinstance(value, list) else [value]):
            if isinstance(item, str):
                walk.strings(f"input[{k}]" if isinstance(value, list) else "input", item, True, 0)
    # vLLM's `mm_payload` (multimodal input given beside the messages): every string in
    # it is judged as a content part's are, a URL where a key names one.
    # (Walked once per request: the media count read it first, when it did.)
    if MM_PAYLOAD in doc and walk.too_deep is None:
        walk.payload(MM_PAYLOAD, doc[MM_PAYLOAD])
        walk.refs.extend(walk.payload_refs or ())
    # Prompt and input objects: only in a body that holds some (a chat body or a batch of
    # strings has none) and names their media (or may, escaped).
    held = any(_holds_objects(doc.get(name)) for name in _PROMPT_KEYS)
    if not held or not _names_prompt_media(body):
        return
    for name in _PROMPT_KEYS:
        value = doc.get(name)
        items = value if isinstance(value, list) else [value]
        for k, item in compress(enumerate(items), map(isinstance, items, repeat(dict))):
            where = f"{name}[{k}]" if isinstance(value, list) else name
            walk.spend(len(item) or 1)  # an empty object is read too
            for key, inner in item.items():
                if key not in _PROMPT_TEXT:
                    walk.strings(f"{where}.{key}", inner, key in _PROMPT_MEDIA, 1)


def _holds_objects(value: Any) -> bool:
    """Whether a prompt holder's `value` is an object or an array holding one: what the
    walk reads (a batch of strings or token ids is looked at in C, its bytes not searched)."""
    return isinstance(value, dict) or (isinstance(value, list) and dict in map(type, value))


def _names_prompt_media(body: bytes) -> bool:
    """Whether `body` may hold a media item in a prompt or input object (`_NEEDLES`)."""
    return any(body.find(needle) >= 0 for needle in _NEEDLES)  # find: memchr, not `in`
