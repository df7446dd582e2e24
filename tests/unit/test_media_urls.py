"""`check_media_urls`, table-driven: which content-part URLs a hosted request may carry.
No DNS: hosts resolve through a table (IP literals are never looked up)."""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any

import pytest

from gateway.upstream import media_urls
from gateway.upstream.invalid_field import InvalidField
from gateway.upstream.media_urls import (
    MAX_URLS,
    check_embedding_input,
    check_media_urls,
)
from gateway.upstream.openai_shapes import check_shapes

HOSTS = {
    "images.example": ["93.184.216.34"],
    "intranet.example": ["10.0.0.7"],
    "split.example": ["93.184.216.34", "127.0.0.1"],  # one public answer is not enough
    "localhost": ["127.0.0.1", "::1"],
    "generativelanguage.googleapis.com": ["142.250.74.10"],
}


_GEMINI_FILE = "https://generativelanguage.googleapis.com/v1beta/files/another-tenants-upload"


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
    # a media type or a file name is no URL (a file id is refused: see below)
    ok = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
    check({"messages": [{"role": "user", "content": [ok]}]})
    named = {"type": "file", "file": {"file_data": "data:application/pdf;base64,AA"}}
    check({"messages": [{"role": "user", "content": [{**named, "filename": "a.pdf"}]}]})


def test_a_provider_whose_adapter_downloads_unguarded_takes_data_urls_only() -> None:
    check(image({"url": "data:image/png;base64,iVBORw0KGgo="}), provider="gigachat")
    with pytest.raises(InvalidField, match="data:"):
        check(image({"url": "https://images.example/cat.png"}), provider="gigachat")


def test_the_number_of_urls_is_bounded() -> None:
    part = {"type": "image_url", "image_url": {"url": "https://images.example/a.png"}}
    params = {"messages": [{"role": "user", "content": [part] * (MAX_URLS + 1)}]}
    with pytest.raises(InvalidField, match=f"at most {MAX_URLS}"):
        check(params)


def several_images(*urls: str) -> dict[str, Any]:
    parts = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    return {"messages": [{"role": "user", "content": parts}]}


def test_each_host_is_looked_up_once() -> None:
    asked: list[str] = []

    async def counting(host: str, port: int) -> list[str]:
        asked.append(host)
        return await resolve(host, port)

    params = several_images(*(f"https://images.example/{n}.png" for n in range(20)))
    asyncio.run(check_media_urls(params, "anthropic", counting))
    assert asked == ["images.example"]


def test_the_lookup_budget_is_for_the_whole_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each lookup alone is well within the budget; together they are not. A client must
    not hold a request (and the lookup threads) for MAX_URLS x the budget."""
    monkeypatch.setattr(media_urls, "RESOLVE_TIMEOUT_S", 0.5)

    async def slow(host: str, _port: int) -> list[str]:
        await asyncio.sleep(0.2)
        return ["93.184.216.34"]

    params = several_images(*(f"https://host{n}.example/a.png" for n in range(10)))
    with pytest.raises(InvalidField, match=r"content\[\d\]"):
        asyncio.run(check_media_urls(params, "anthropic", slow))


def test_client_hosts_are_never_resolved_on_the_loops_default_executor() -> None:
    """The loop's default executor also resolves the gateway's own backends: clients'
    slow hosts must not be able to fill it."""
    used: list[object] = []

    class Recording(concurrent.futures.ThreadPoolExecutor):
        def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
            used.append(fn)
            return super().submit(fn, *args, **kwargs)

    async def main() -> list[str]:
        asyncio.get_running_loop().set_default_executor(Recording(1))
        return await media_urls.system_resolver("127.0.0.1", 80)

    assert asyncio.run(main()) == ["127.0.0.1"]
    assert used == []


@pytest.mark.parametrize(
    "part",
    [
        {"type": "file", "file": {"file_id": "file-another-tenants-upload"}},  # OpenAI
        {"type": "document", "source": {"type": "file", "file_id": "file_011abc"}},  # Anthropic
        {"type": "file", "file": {"file_uri": "https://generativelanguage.googleapis.com/f/1"}},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA", "fileId": "x"}},
    ],
    ids=["openai-file-id", "anthropic-file-id", "gemini-file-uri", "nested-fileId"],
)
def test_files_stored_at_the_provider_are_refused(part: dict[str, Any]) -> None:
    """One provider account serves every tenant: a file id would read another tenant's
    upload into this tenant's answer."""
    params = {"messages": [{"role": "user", "content": [part]}]}
    with pytest.raises(InvalidField, match=r"messages\[0\]\.content\[0\].*stored at the provider"):
        check(params)


@pytest.mark.parametrize(
    "part",
    [
        # LiteLLM's Gemini adapter passes a Files API URI as `file_data.file_uri`: a file
        # stored in the account every tenant shares, though its host is public.
        {"type": "image_url", "image_url": {"url": _GEMINI_FILE}},
        {"type": "image_url", "image_url": " " + _GEMINI_FILE.upper()},
        {"type": "file", "file": {"file_data": _GEMINI_FILE}},
    ],
)
def test_a_gemini_files_api_uri_is_a_stored_file_not_a_public_url(part: dict[str, Any]) -> None:
    params = {"messages": [{"role": "user", "content": [part]}]}
    with pytest.raises(InvalidField, match=r"messages\[0\]\.content\[0\].*stored at the provider"):
        check(params)


def generated(url: Any) -> dict[str, Any]:
    """A conversation replaying an assistant turn with an image a Gemini model generated,
    in LiteLLM's shape (`message.images`)."""
    images = [{"type": "image_url", "image_url": {"url": url}}]
    return {
        "messages": [
            {"role": "user", "content": "draw"},
            {"role": "assistant", "content": "here", "images": images},
            {"role": "user", "content": "again"},
        ]
    }


@pytest.mark.parametrize(
    ("url", "why"),
    [
        # LiteLLM's Gemini and Vertex adapters send these as parts of the assistant's turn:
        # a Cloud Storage object and a Files API upload read with the gateway's credentials
        ("gs://another-tenant/scan.png", "stored at the provider"),
        (_GEMINI_FILE, "stored at the provider"),
        ("http://127.0.0.1/secret.png", "public"),
    ],
)
def test_a_messages_own_images_are_checked_like_content_parts(url: str, why: str) -> None:
    with pytest.raises(InvalidField, match=rf"messages\[1\]\.images.*{why}"):
        check(generated(url), "gemini")


def test_a_messages_own_inline_or_public_images_pass() -> None:
    check(generated("data:image/png;base64,iVBORw0KGgo="), "gemini")
    check(generated("https://images.example/cat.png"), "gemini")


@pytest.mark.parametrize(
    "url",
    [
        "https://generativelanguage.googleapis.com:443/v1beta/files/another-tenants-upload",
        "https://generativelanguage.googleapis.com./v1beta/files/another-tenants-upload",
        "https://u@Generativelanguage.Googleapis.com/v1beta/files/another-tenants-upload",
        "https://generativelanguage.googleapis.com//v1beta/files/another-tenants-upload",
    ],
)
def test_a_gemini_files_api_uri_is_a_stored_file_however_its_host_is_written(url: str) -> None:
    # LiteLLM hands any https URL to Google as `file_data.file_uri`: Google decides what it
    # names, so a port, a trailing dot or userinfo is no public URL either.
    params = image({"url": url})
    with pytest.raises(InvalidField, match=r"messages\[0\]\.content\[1\].*stored at the provider"):
        check(params, "gemini")


@pytest.mark.parametrize(
    "url",
    [
        # The adapter hands each to Google verbatim as `file_data.file_uri`; the Gemini API
        # host serves no public media, whatever the path says (escaped).
        "https://generativelanguage.googleapis.com/v1beta/%66iles/another-tenants-upload.png",
        "https://generativelanguage.googleapis.com/v1beta/files%2Fanother-tenants-upload.png",
    ],
)
def test_any_url_at_the_gemini_api_host_is_a_stored_file_however_its_path_is_written(
    url: str,
) -> None:
    with pytest.raises(InvalidField, match=r"messages\[0\]\.content\[1\].*stored at the provider"):
        check(image({"url": url}), "gemini")


@pytest.mark.parametrize(
    "url",
    [
        # LiteLLM's Gemini and Vertex adapters test `"gs://" in image_url`: each of these
        # went to Google as `file_data.file_uri`, the whole string, read with the
        # gateway's credentials.
        "data:image/png,gs://another-tenant/scan.png",
        "x gs://another-tenant/scan.png",
        "https://images.example/cat.png?u=gs://another-tenant/scan.png",
    ],
)
def test_a_media_string_naming_a_cloud_storage_object_anywhere_is_refused(url: str) -> None:
    with pytest.raises(InvalidField, match=r"messages\[0\]\.content\[1\].*stored at the provider"):
        check(image({"url": url}), "vertex_ai")
    with pytest.raises(InvalidField, match=r"messages\[1\]\.images.*stored at the provider"):
        check(generated(url), "gemini")


def test_a_file_given_inline_passes() -> None:
    part = {
        "type": "file",
        "file": {"file_data": "data:application/pdf;base64,AA", "filename": "a"},
    }
    check({"messages": [{"role": "user", "content": [part]}]})


# -- embeddings `input`: text and tokens, never a stored object -----------------------------


@pytest.mark.parametrize(
    ("value", "param"),
    [
        ("gs://bucket/scan.png", "input"),
        ("  GS://bucket/scan.png", "input"),  # case and leading space: refused all the same
        ("a caption gs://bucket/scan.png", "input"),  # Vertex reads any string holding it
        (["ok", " s3://bucket/report.pdf"], "input[1]"),
        (["files/abc123"], "input[0]"),
        ("https://generativelanguage.googleapis.com/v1beta/files/abc123", "input"),
    ],
)
def test_an_embeddings_input_naming_a_stored_object_is_refused(value: Any, param: str) -> None:
    with pytest.raises(InvalidField) as refused:
        check_embedding_input({"input": value})
    assert refused.value.param == param
    assert "bucket" not in str(refused.value)


@pytest.mark.parametrize(
    "value",
    [
        [{"image": {"gcsUri": "gs://bucket/scan.png"}}],
        [{"type": "file", "file": {"file_data": "data:image/png;base64,AAAA"}}],
        [True, 2],  # JSON's true is no token
        [[1, [2]]],
        [1.5],
    ],
)
def test_an_embeddings_input_that_is_no_text_or_tokens_is_refused(value: Any) -> None:
    with pytest.raises(InvalidField) as refused:
        check_shapes("embeddings", {"input": value})
    assert refused.value.param == "input[0]"
    assert "bucket" not in str(refused.value)


@pytest.mark.parametrize(
    "value",
    [
        "plain text",
        "see https://example.com/files/x and s3 buckets",  # a URL in prose is text
        "data:image/png;base64,iVBORw0KGgo=",  # the content itself
        ["a", "b"],
        [1, 2, 3],
        [[1, 2], [3]],
    ],
)
def test_text_and_tokens_pass_as_embeddings_input(value: Any) -> None:
    check_embedding_input({"input": value})


@pytest.mark.parametrize(
    ("value", "passes"),
    [
        ("describe gs://bucket/x", True),  # a prompt's text is text: never a stored object
        (["a", "b"], True),
        ([[1, 2], [3]], True),
        (["a", [{"type": "image_url", "image_url": {"url": "http://10.0.0.7/"}}]], False),
        ([{"type": "text", "text": "a"}], False),
    ],
)
def test_a_prompt_is_text_or_tokens(value: Any, passes: bool) -> None:
    if passes:
        check_shapes("completions", {"prompt": value})
        return
    with pytest.raises(InvalidField, match="a string, or a non-empty array"):
        check_shapes("completions", {"prompt": value})
