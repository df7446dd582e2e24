"""A private backend's `media_urls:`: which media URLs in a request it may be sent to fetch.

vLLM, llama.cpp and SGLang download the http(s) URLs of a request's media parts
themselves, from inside the organisation's network (gateway/api/private_media.py). URLs
at loopback, private, link-local or other non-public literal addresses, `localhost` names
and other schemes than http(s) and `data:` are refused for every backend; these settings
narrow what is left, per backend:

- `remote: public` (the default): http(s) URLs to any other host;
- `remote: none`: `data:` URLs only (the media in the request itself);
- `remote: listed`: http(s) URLs only to the hosts in `hosts` (exact names, any port).
"""

from __future__ import annotations

from typing import Literal

from pydantic import field_validator, model_validator

from gateway.config.base import _Strict
from gateway.media_hosts import BadURL, canonical_host, is_local_name, is_public_address

__all__ = ["MediaUrlSettings"]


class MediaUrlSettings(_Strict):
    """Which http(s) media URLs a private backend may be sent (`data:` URLs always)."""

    remote: Literal["public", "none", "listed"] = "public"
    hosts: tuple[str, ...] = ()

    @field_validator("hosts")
    @classmethod
    def _canonical(cls, hosts: tuple[str, ...]) -> tuple[str, ...]:
        # Compared as a request's URL host is read (gateway/media_hosts.py): a name in
        # lowercase without its trailing dot, an address in its canonical form.
        names = []
        for host in hosts:
            try:
                name, address = canonical_host(host.strip("[]"))
            except BadURL as exc:
                raise ValueError(f"hosts: {host!r}: {exc}") from None
            if is_local_name(name) or (address is not None and not is_public_address(address)):
                raise ValueError(
                    f"hosts: {host!r} is a loopback, private or link-local host, which no "
                    "backend is sent to fetch"
                )
            names.append(name)
        return tuple(names)

    @model_validator(mode="after")
    def _hosts_when_listed(self) -> MediaUrlSettings:
        if (self.remote == "listed") != bool(self.hosts):
            raise ValueError(
                "media_urls.hosts lists the only hosts a backend fetches from: write it with "
                "remote: listed, and only then"
            )
        return self
