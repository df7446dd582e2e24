"""The host an http(s) media URL names, read as strictly as the servers that fetch it.

A private inference server fetches the media URLs of a request itself (vLLM's
`image_url`, `audio_url`, `video_url`; llama.cpp's `image_url`, `input_audio`,
`input_video`; SGLang's), from inside the organisation's network. Each reads the URL with
its own parser (urllib3, curl, requests), and those disagree on what is not plain: a
backslash, spaces or control characters, userinfo (`http://a@b@c/`), percent-escapes in
the host, non-ASCII hosts that IDNA maps onto digits. `remote_host` refuses all of those
(`BadURL`) and returns the host as every parser reads it: a DNS name (lowercase, without
a trailing dot) or an address, IPv4 in any of the forms `inet_aton` and WHATWG URLs
accept (`2130706433`, `0x7f.1`, `0177.0.0.1`, `127.1`), IPv6 in brackets.

`is_public_address` says whether an address is globally routable (Python's `is_global`,
not multicast, not the cloud fabric addresses LiteLLM also blocks, not local-use NAT64 or
site-local IPv6), an IPv6 address that embeds an IPv4 one (IPv4-mapped, IPv4-compatible,
IPv4-translated, 6to4, NAT64) judged by that one; the
hosted check (gateway/upstream/media_urls.py) uses it for resolved addresses too.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Final, NamedTuple

__all__ = [
    "LOCAL_NAMES",
    "BadURL",
    "Host",
    "canonical_host",
    "is_local_name",
    "is_public_address",
    "remote_host",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# Names every resolver (or /etc/hosts on Debian and its kin) answers with loopback; any
# name under `localhost.` too (RFC 6761; curl and systemd-resolved resolve it so).
LOCAL_NAMES: Final = frozenset(
    {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback", "localhost6"}
)
# Public by `is_global`, yet reachable only from inside a cloud (as LiteLLM's list).
_FABRIC: Final = (
    ipaddress.ip_network("168.63.129.16/32"),  # Azure Wire Server
    ipaddress.ip_network("192.0.0.0/24"),
)
# IPv6 prefixes that carry an IPv4 destination in their bits.
_SIX_TO_FOUR: Final = ipaddress.ip_network("2002::/16")
_NAT64: Final = ipaddress.ip_network("64:ff9b::/96")
_COMPATIBLE: Final = ipaddress.ip_network("::/96")
_TRANSLATED: Final = ipaddress.ip_network("::ffff:0:0:0/96")  # SIIT's IPv4-translated
# Global to this Python's `is_global` (3.11), yet inside a network: local-use NAT64
# (RFC 8215: the operator's own translator to its IPv4 hosts, 10.0.0.0/8 included, at a
# place in the address the prefix length sets) and site-local (deprecated, still routed).
_INTERNAL6: Final = (
    ipaddress.ip_network("64:ff9b:1::/48"),
    ipaddress.ip_network("fec0::/10"),
)
_HTTP: Final = re.compile(r"(?i:https?)://")
# What no fetcher reads alike: controls, space, backslash, DEL, and (in the authority)
# anything not ASCII.
_UNSAFE: Final = re.compile(r"[\x00-\x20\x7f\\]")
_NAME: Final = re.compile(r"[a-z0-9_-]+(?:\.[a-z0-9_-]+)*\Z")
_NUMBER: Final = re.compile(r"(?:0[xX][0-9a-fA-F]*|[0-9]+)\Z")


class BadURL(ValueError):
    """Not an http(s) URL whose host every fetcher reads the same (the reason, never the
    URL)."""


class Host(NamedTuple):
    """An http(s) URL's host: `name` as compared (a lowercase DNS name without its
    trailing dot, or the address's canonical text) and the address, for a literal one."""

    name: str
    address: IPAddress | None


def remote_host(url: str) -> Host:
    """The host of `url`, an absolute http(s) URL (its scheme in any case, then `//`),
    or `BadURL`."""
    start = _HTTP.match(url)
    if start is None:
        raise BadURL("not an http(s) URL with a host")
    if _UNSAFE.search(url):
        raise BadURL("spaces, control characters or backslashes in a URL")
    rest = url[start.end() :]
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    authority = rest[:end]
    if "@" in authority:
        raise BadURL("credentials (`user@`) in a media URL")
    if not authority.isascii():
        raise BadURL("a host that is not ASCII (write it in punycode, `xn--`)")
    if authority.startswith("["):
        close = authority.find("]")
        host, port = authority[1:close], authority[close + 1 :]
        if close < 0 or (port and not port.startswith(":")):
            raise BadURL("a malformed IPv6 host")
        port = port[1:]
        if port and not port.isdigit():
            raise BadURL("a malformed port")
        if ":" not in host:
            raise BadURL("a malformed IPv6 host")
        return canonical_host(host)
    host, _, port = authority.partition(":")
    if port and not port.isdigit():
        raise BadURL("a malformed port")
    return canonical_host(host)


def canonical_host(host: str) -> Host:
    """`host` (an IPv6 address not bracketed) as `Host`: an IPv6 address, an IPv4 address
    in any numeric form, or a DNS name; `BadURL` for none (empty, a percent-escape,
    characters no name has)."""
    if ":" in host:
        try:
            return Host(*_address(ipaddress.IPv6Address(host)))
        except ValueError:
            raise BadURL("a malformed IPv6 host") from None
    name = host.lower()
    if name.endswith("."):
        name = name[:-1]
    if not name or not _NAME.match(name):
        raise BadURL("a host that is neither a DNS name nor an address")
    labels = name.split(".")
    if _NUMBER.match(labels[-1]):  # an IPv4 address, as URL parsers and inet_aton read it
        return Host(*_address(ipaddress.IPv4Address(_ipv4(labels))))
    return Host(name, None)


def is_local_name(name: str) -> bool:
    """Whether the DNS name `name` (as `Host.name`) is one resolvers answer with loopback."""
    return name in LOCAL_NAMES or name.endswith(".localhost")


def is_public_address(address: str | IPAddress) -> bool:
    """Whether `address` (text, perhaps with an IPv6 zone, or an address) is globally
    routable and outside the cloud fabric, an embedded IPv4 address judged by itself."""
    if isinstance(address, str):
        try:
            ip: IPAddress = ipaddress.ip_address(address.split("%", 1)[0])
        except ValueError:
            return False
    else:
        ip = address
    if isinstance(ip, ipaddress.IPv6Address):
        if any(ip in net for net in _INTERNAL6):
            return False
        embedded = _embedded(ip)
        if embedded is not None:
            ip = embedded
    if not ip.is_global or ip.is_multicast:
        return False
    return not any(ip in net for net in _FABRIC)


def _embedded(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 destination an IPv6 address carries, if it carries one."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip in _SIX_TO_FOUR:
        return ip.sixtofour
    if ip in _NAT64 or ip in _TRANSLATED or (ip in _COMPATIBLE and int(ip) > 1):
        # (`::` and `::1` are their own.)
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def _address(ip: IPAddress) -> tuple[str, IPAddress]:
    if isinstance(ip, ipaddress.IPv6Address) and ip.scope_id:
        raise BadURL("an IPv6 host with a zone")
    return str(ip), ip


def _ipv4(labels: list[str]) -> int:
    """The IPv4 address WHATWG's host parser (and `inet_aton`) reads from `labels`: 1 to 4
    numbers, each decimal, octal (a leading 0) or hexadecimal (0x), the last filling the
    bytes left. Anything else that ends in a number is refused, not guessed at."""
    if len(labels) > 4:
        raise BadURL("a host that ends in a number but is no IPv4 address")
    numbers = []
    for label in labels:
        if not _NUMBER.match(label):
            raise BadURL("a host that ends in a number but is no IPv4 address")
        if label[:2] in ("0x", "0X"):
            numbers.append(int(label[2:] or "0", 16))
        elif len(label) > 1 and label.startswith("0"):
            if not set(label) <= set("01234567"):
                raise BadURL("a host that ends in a number but is no IPv4 address")
            numbers.append(int(label, 8))
        else:
            numbers.append(int(label))
    last = numbers.pop()
    if any(n > 255 for n in numbers) or last >= 256 ** (4 - len(numbers)):
        raise BadURL("a host that ends in a number but is no IPv4 address")
    value = last
    for i, n in enumerate(numbers):
        value += n << (8 * (3 - i))
    return value
