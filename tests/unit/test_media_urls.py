"""`check_media_urls`, table-driven: which content-part URLs a hosted request may carry.
No DNS: hosts resolve through a table (IP literals are never looked up)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.upstream.media_urls import MAX_URLS, check_media_urls
from gateway.upstream.openai_wire import InvalidField

HOSTS = {
    "images.example": ["93.184.216.34"],
    "intranet.example": ["10.0.0.7"],
    "split.example": ["93.184.216.34", "127.0.0.1"],  # one public answer is not enough
    "localhost": ["127.0.0.1", "::1"],
}


async def resolve(host: str, _port: int) -> list[str]:
    if host not in HOSTS:
        raise OSError(f"{host}: not known")
    return HOSTS[host]


def image(url: Any) -> dict[str, Any]:
    parts = [{"type": "text", "text": "see http://127.0.0.1/ (prose)"}]
    return {
        "messages": [{"role": "user", "content": [*parts, {"type": "image_url", "image_url": url}]}]
    }


def check(params: dict[str, Any], provider: str = "anthropic") -> None:
    asyncio.run(check_media_urls(params, provider, resolve))


@pytest.mark.parametrize(
    "url",
    [
        {"url": "data:image/png;base64,iVBORw0KGgo="},
        {"url": "https://images.example/cat.png", "detail": "low"},
        "https://images.example/cat.png",  # the string form LiteLLM also takes
        {"url": "http://93.184.216.34/cat.png"},
    ],
)
def test_data_and_public_urls_pass(url: Any) -> None:
    check(image(url))


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8081/admin/status",
        "http://169.254.169.254/latest/meta-data/iam/",  # cloud metadata
        "http://[::1]/",
        "http://[::ffff:127.0.0.1]/",
        "http://168.63.129.16/machine",  # Azure Wire Server: "global", still inside
        "http://100.64.0.1/",  # carrier-grade NAT
        "http://localhost/",
        "http://intranet.example/",
        "http://split.example/",
        "http://unknown.example/",  # does not resolve: refused, not let through
        "file:///etc/passwd",
        "gs://gateway-bucket/secrets.pdf",  # read by the provider with our credentials
        "s3://bucket/key",
        "ftp://images.example/x",
        " HTTP://127.0.0.1/",
        "http:///nohost",
    ],
)
def test_private_unresolvable_and_other_schemes_are_refused(url: str) -> None:
    with pytest.raises(InvalidField) as refused:
        check(image({"url": url}))
    assert refused.value.param == "messages[0].content[1]"
    assert url.strip() not in str(refused.value)  # the URL is never quoted back


def test_urls_in_other_part_types_count_too() -> None:
    for part in (
        {"type": "file", "file": {"file_id": "http://127.0.0.1/x.pdf"}},
        {"type": "audio_url", "audio_url": {"url": "http://10.1.2.3/a.wav"}},
        {"type": "document", "source": {"type": "url", "url": "http://localhost/d"}},
    ):
        params = {"messages": [{"role": "user", "content": [part]}]}
        with pytest.raises(InvalidField):
            check(params)
    # an id or a media type is no URL
    ok = {"type": "file", "file": {"file_id": "file-abc123", "filename": "a.pdf"}}
    check({"messages": [{"role": "user", "content": [ok]}]})


def test_a_provider_whose_adapter_downloads_unguarded_takes_data_urls_only() -> None:
    check(image({"url": "data:image/png;base64,iVBORw0KGgo="}), provider="gigachat")
    with pytest.raises(InvalidField, match="data:"):
        check(image({"url": "https://images.example/cat.png"}), provider="gigachat")


def test_the_number_of_urls_is_bounded() -> None:
    part = {"type": "image_url", "image_url": {"url": "https://images.example/a.png"}}
    params = {"messages": [{"role": "user", "content": [part] * (MAX_URLS + 1)}]}
    with pytest.raises(InvalidField, match=f"at most {MAX_URLS}"):
        check(params)
