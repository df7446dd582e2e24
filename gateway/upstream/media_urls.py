"""URLs in a hosted request's content parts: only those no gateway-side fetch can abuse.

A chat message's non-text parts (`image_url`, `audio_url`, `video_url`, `file`,
`document`, ...) may carry a URL. Some LiteLLM adapters download it from the gateway's
host before calling the provider (Anthropic, Bedrock, Vertex/Gemini: through LiteLLM's
`safe_get`, which refuses non-public addresses while `litellm.user_url_validation` is on,
and owngate pins it on; GigaChat: a plain download, TLS unchecked, whose bytes are then
uploaded to the provider). Others hand a `gs://` or `s3://` URL to the provider, which
reads it with the gateway's own cloud credentials. A client could so make the gateway
reach its own network (cloud metadata at 169.254.169.254, the admin listener on
loopback, internal hosts) and ship what it read to a hosted provider.

The same URLs come in a message's `images` (LiteLLM's shape of the images a Gemini model
generated, which its Gemini and Vertex adapters send back like content parts), checked
the same way and named by the message (`messages[1].images`).

`check_media_urls` therefore admits, in a hosted request, only:
- `data:` URLs (the content itself), anywhere;
- `http(s)` URLs whose host is, or resolves only to, public addresses
  (gateway/media_hosts.py `is_public_address`: Python's `ip.is_global`, not multicast, not
  the cloud fabric addresses LiteLLM also blocks, an IPv6 address embedding an IPv4 one
  judged by that one),
  except for providers whose adapter downloads without LiteLLM's guard (`gigachat`),
  which get `data:` URLs only.
Any other scheme (`file:`, `gs:`, `s3:`, `ftp:`) is refused, and so is a reference to a
file stored in the provider account (`file_id`, `file_uri`, any URL at the Gemini API's
host, `https://generativelanguage.googleapis.com/v1beta/files/...` however its path is
spelled, which LiteLLM's Gemini adapter hands over as a stored file though its host is
public, and any string with `gs://` in it, `data:` URLs included, which its Gemini and
Vertex adapters send as a Cloud Storage object wherever `gs://` stands): the account,
and so its files, is shared by every tenant. The client gets 400 naming
the part (`messages[0].content[1]`), never the URL. Text parts are not looked at: a
URL in prose is text. At most `MAX_URLS` URLs per request, each host resolved within
`RESOLVE_TIMEOUT_S` for all of them together (unresolvable, or not in time: refused),
each distinct host once. Lookups run on `MAX_LOOKUPS` threads of their own: a client
sending hosts that resolve slowly delays only other clients' URL checks, never the
gateway's lookups of its own backends (the event loop's default executor). One tenant's
lookups hold at most `MAX_LOOKUPS_PER_TENANT` of those threads (`tenant_resolver`), from
when a lookup is handed to a thread until the thread returns, whether or not its request
still waits; its next lookup waits for one of its own (within its request's budget).
Before, a tenant sending names whose DNS server never answers (each holds its thread for
the resolver's whole timeout, after the request gave up at its 5 s) took all four
threads with four such requests at a time, and every other tenant's URL check waited
behind them and was refused.

An embeddings request has no content parts, but its `input` strings are read the same way
by some adapters: Vertex's multimodal embeddings send a string containing `gs://` as a
Cloud Storage object to embed, Gemini's a `gs://` URL or a Files API name (`files/...`)
as a stored file, Bedrock's Nova and Marengo an `s3://` URL as an S3 object; each is read
with the gateway's credentials, from an account every tenant shares. `check_embedding_input`
refuses such a string, naming the item (`input[2]`). A string that only mentions `gs://`
in prose is refused too, as Vertex would read it. The shapes themselves (an `input` or a
text completion's `prompt` is a string, or an array of strings, of integers or of integer
arrays: an object in the array is a multimodal instance or a file block to those
adapters, and LiteLLM turns each item of a prompt array into a user message for a chat
provider, content parts and all) are checked before, by gateway/upstream/openai_shapes.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import re
import socket
import weakref
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final
from urllib.parse import urlsplit

from gateway.media_hosts import is_public_address
from gateway.upstream.invalid_field import InvalidField
from gateway.upstream.openai_messages import content_parts

__all__ = [
    "MAX_LOOKUPS",
    "MAX_LOOKUPS_PER_TENANT",
    "MAX_URLS",
    "RESOLVE_TIMEOUT_S",
    "Resolver",
    "check_embedding_input",
    "check_media_urls",
    "system_resolver",
    "tenant_resolver",
]

MAX_URLS: Final = 64
RESOLVE_TIMEOUT_S: Final = 5.0  # for all of a request's lookups together
MAX_LOOKUPS: Final = 4  # threads resolving clients' URL hosts, for the whole process
MAX_LOOKUPS_PER_TENANT: Final = 2  # of them, the most one tenant's lookups hold at once
_lookups: ThreadPoolExecutor | None = None  # made on the first lookup (nothing at import)
# Per event loop, each tenant's places on the lookup threads (`tenant_resolver`).
_places: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Semaphore]] = (
    weakref.WeakKeyDictionary()
)
# Providers whose LiteLLM adapter downloads a URL without LiteLLM's address guard.
_UNGUARDED: Final = frozenset({"gigachat"})
_SCHEME: Final = re.compile(r"\s*([A-Za-z][A-Za-z0-9+.\-]*):")
_MAX_DEPTH: Final = 6
# A message's own list of images beside its content: LiteLLM's shape of the images a
# Gemini model generated (`message.images[k].image_url.url`), which its Gemini and Vertex
# adapters send back as parts of that turn, through the media path content parts take
# (a `gs://` object or a Files API URI as a stored file, read with the gateway's
# credentials; another URL downloaded or handed to the provider).
_IMAGES: Final = "images"
# Keys naming a file kept in the provider account (OpenAI and Anthropic `file_id`, Gemini's
# `file_uri`): one account serves every tenant, so one tenant could have another's upload
# read into its own answer.
_STORED: Final = frozenset({"file_id", "fileId", "file_uri", "fileUri"})

# An embeddings `input` string an adapter reads as an object in the provider account:
# Vertex multimodal (`"gs://" in text`, as LiteLLM writes it), Gemini (`gs://`, `files/`,
# the Files API URI), Bedrock Nova and Marengo (`s3://`); at the start in any case. A
# plain search (memchr-fast) and a match on a bounded head: linear in the string's length.
_GCS: Final = "gs://"
_STORED_PREFIX: Final = re.compile(
    r"gs://|s3://|files/|https?://generativelanguage\.googleapis\.com/[^/]*/files/",
    re.IGNORECASE,
)
_HEAD: Final = 256
_GEMINI_FILES_HOST: Final = "generativelanguage.googleapis.com"
_STORED_PART = (
    "inline content or a URL, not a reference to a file stored at the provider (a Gemini "
    "Files API URI): it would be read with the gateway's credentials, which every tenant "
    "shares"
)
_STORED_WHY = (
    "text or tokens, not a reference to a stored object (`gs://`, `s3://`, `files/`): the "
    "provider would read it with the gateway's credentials, which every tenant shares"
)

# host, port -> the addresses it resolves to
Resolver = Callable[[str, int], Awaitable[list[str]]]


async def system_resolver(host: str, port: int, *, tenant: str = "") -> list[str]:
    """The addresses `host` resolves to, as the OS resolver says (on `MAX_LOOKUPS` threads
    of this module's own, made on the first lookup), `tenant`'s lookup: it takes one of
    the tenant's `MAX_LOOKUPS_PER_TENANT` places first (waiting for one), and gives it
    back when the thread returns, not when the caller stops waiting."""
    global _lookups  # one pool per process, made when first needed
    if _lookups is None:
        _lookups = ThreadPoolExecutor(MAX_LOOKUPS, thread_name_prefix="owngate-url-dns")
    loop = asyncio.get_running_loop()
    places = _places.setdefault(loop, {})
    place = places.get(tenant)
    if place is None:
        place = places[tenant] = asyncio.Semaphore(MAX_LOOKUPS_PER_TENANT)
    await place.acquire()  # cancelled here (its request's budget spent): nothing held
    lookup = functools.partial(socket.getaddrinfo, host, port, type=socket.SOCK_STREAM)
    try:
        running = _lookups.submit(lookup)
    except BaseException:
        place.release()
        raise
    running.add_done_callback(lambda _: _give_back(loop, place))
    infos = await asyncio.wrap_future(running, loop=loop)
    return [str(info[4][0]) for info in infos]


def _give_back(loop: asyncio.AbstractEventLoop, place: asyncio.Semaphore) -> None:
    """A lookup's thread returned (or the lookup was dropped unstarted): its place is free."""
    with contextlib.suppress(RuntimeError):  # a closed loop: no one waits on its places
        loop.call_soon_threadsafe(place.release)


def tenant_resolver(tenant: str) -> Resolver:
    """`system_resolver` for `tenant`'s lookups (its part of the threads)."""
    return functools.partial(system_resolver, tenant=tenant)


async def check_media_urls(
    params: dict[str, Any], provider: str, resolve: Resolver = system_resolver
) -> dict[str, list[str]]:
    """Raise `InvalidField` for a URL in `params["messages"]` (LiteLLM arguments) that
    `provider`'s adapter, or the provider with the gateway's credentials, must not fetch;
    else the addresses each host name looked up resolved to (lowercase, no trailing dot):
    where a download of the call goes (gateway/upstream/hosted_names.py)."""
    found = list(_urls(params.get("messages")))
    if len(found) > MAX_URLS:
        raise InvalidField("messages", f"content parts with at most {MAX_URLS} URLs")
    guarded = provider.lower() not in _UNGUARDED
    deadline = asyncio.get_running_loop().time() + RESOLVE_TIMEOUT_S
    looked_up: dict[tuple[str, int], list[str] | None] = {}
    for where, url in found:
        match = _SCHEME.match(url)
        scheme = match.group(1).lower() if match else ""
        # Before the `data:` pass: the adapter reads `gs://` anywhere in the string.
        if url.find(_GCS) >= 0 or _STORED_PREFIX.match(url.lstrip()[:_HEAD]) or _gemini_api(url):
            raise InvalidField(where, _STORED_PART)  # a public host, a shared file
        if scheme == "data":
            continue
        if not guarded:
            raise InvalidField(where, "a `data:` URL (this model's adapter downloads URLs)")
        public = scheme in ("http", "https") and await _public(
            url, scheme, resolve, deadline, looked_up
        )
        if not public:
            raise InvalidField(
                where,
                "a `data:` URL or an http(s) URL whose host resolves only to public "
                "addresses (a hosted provider would have it fetched from the gateway)",
            )
    return {
        host.rstrip(".").lower(): found
        for (host, _port), found in looked_up.items()
        if found is not None
    }


def _gemini_api(url: str) -> bool:
    """Whether `url` is at the Gemini API's host, however the host is written (a port
    (`:443`), a trailing dot, userinfo) and whatever its path (`/v1beta/files/x`,
    `/v1beta/%66iles/x`, `/v1beta/files%2Fx`). LiteLLM's Gemini adapter hands any https
    URL to Google as `file_data.file_uri`, and Google, not LiteLLM, decides what it names:
    that host serves the API (its Files API among it), read with the gateway's key, and
    no public media, so no spelling of a path there is taken for a public URL."""
    try:
        host = urlsplit(url.strip()).hostname
    except ValueError:
        return False
    return host is not None and host.rstrip(".") == _GEMINI_FILES_HOST


def check_embedding_input(params: dict[str, Any]) -> None:
    """Raise `InvalidField` for an embeddings `input` (LiteLLM arguments) holding a string an
    adapter would read as an object stored in the provider account. Its shape (text or
    tokens, never objects) was checked already (gateway/upstream/openai_shapes.py)."""
    value = params.get("input")
    items = value if isinstance(value, list) else [value]
    for i, item in enumerate(items):
        if not isinstance(item, str):
            continue
        if item.find(_GCS) >= 0 or _STORED_PREFIX.match(item.lstrip()[:_HEAD]):
            raise InvalidField(f"input[{i}]" if isinstance(value, list) else "input", _STORED_WHY)


def _urls(messages: Any) -> Iterator[tuple[str, str]]:
    """(where, value) of each string with a URL scheme in a non-text content part, or in
    a message's `images` (`_IMAGES`)."""
    for where, part in content_parts(messages):
        if part.get("type") not in ("text", None):
            yield from _strings(where, part, 0)
    for i, message in enumerate(messages if isinstance(messages, list) else ()):
        images = message.get(_IMAGES) if isinstance(message, dict) else None
        if images is not None:
            yield from _strings(f"messages[{i}].{_IMAGES}", images, 0)


def _strings(where: str, value: Any, depth: int) -> Iterator[tuple[str, str]]:
    if isinstance(value, str):
        # `gs://` anywhere: LiteLLM's Gemini and Vertex adapters read the string as a Cloud
        # Storage object then (`"gs://" in image_url`), whatever comes before it.
        if _SCHEME.match(value) or value.find(_GCS) >= 0:
            yield where, value
    elif depth >= _MAX_DEPTH:
        raise InvalidField(where, f"nested at most {_MAX_DEPTH} deep")
    elif isinstance(value, dict):
        for key, item in value.items():
            if key in _STORED and item is not None:
                raise InvalidField(
                    where,
                    "inline content or a URL, not a reference to a file stored at the "
                    f"provider (`{key}`): it would be read with the gateway's credentials, "
                    "which every tenant shares",
                )
            if key != "type":
                yield from _strings(where, item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(where, item, depth + 1)


async def _public(
    url: str,
    scheme: str,
    resolve: Resolver,
    deadline: float,
    looked_up: dict[tuple[str, int], list[str] | None],
) -> bool:
    """Whether `url`'s host is, or resolves only to, public addresses (looked up by
    `deadline`, once per host and port: `looked_up` holds the answers, None for none)."""
    try:
        parts = urlsplit(url.strip())
        host, port = parts.hostname, parts.port
    except ValueError:
        return False
    if not host:
        return False
    try:
        addresses = [str(ipaddress.ip_address(host))]
    except ValueError:
        key = (host, port or (443 if scheme == "https" else 80))
        if key not in looked_up:
            try:
                async with asyncio.timeout_at(deadline):
                    looked_up[key] = await resolve(*key)
            except (OSError, TimeoutError, UnicodeError):
                looked_up[key] = None
        found = looked_up[key]
        if found is None:
            return False
        addresses = found
    return bool(addresses) and all(is_public_address(a) for a in addresses)
