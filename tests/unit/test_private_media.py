"""Media URLs a private backend would fetch (gateway/api/private_media.py), the hosts they
name (gateway/media_hosts.py) and a backend's `media_urls:` (gateway/config/media.py)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from pydantic import ValidationError

from gateway import media_hosts
from gateway.api import private_media
from gateway.api.private_media import MAX_REMOTE, MediaRefs
from gateway.config.media import MediaUrlSettings
from gateway.config.schema import BackendSettings
from gateway.errors import GatewayError
from gateway.media_hosts import BadURL, is_public_address, remote_host
from tests.helpers.python_calls import by_name, python_calls, python_steps

PUBLIC = MediaUrlSettings()


def refusal(doc: dict[str, Any], settings: MediaUrlSettings = PUBLIC) -> GatewayError | None:
    refs = MediaRefs.of(doc, orjson.dumps(doc))
    return None if refs is None else refs.refusal(settings)


def chat(*parts: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": list(parts)}]}


def image(url: Any) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


@pytest.mark.parametrize(
    ("url", "address"),
    [
        ("http://2130706433/", "127.0.0.1"),
        ("http://0x7f.1/", "127.0.0.1"),
        ("http://0x7F000001/", "127.0.0.1"),
        ("http://0177.0.0.1/", "127.0.0.1"),
        ("http://127.1:8080/x", "127.0.0.1"),
        ("http://127.0.0.1./", "127.0.0.1"),
        ("HTTPS://169.254.169.254/latest/meta-data/", "169.254.169.254"),
        ("http://0/", "0.0.0.0"),
        ("http://[::ffff:127.0.0.1]/", "::ffff:7f00:1"),
        ("http://[::FFFF:a9fe:a9fe]:80/", "::ffff:a9fe:a9fe"),
    ],
)
def test_every_numeric_form_of_an_address_is_read_as_that_address(url: str, address: str) -> None:
    host = remote_host(url)
    assert host.name == address
    assert host.address is not None and not is_public_address(host.address)


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.0.0.5",
        "172.16.0.1",
        "192.168.1.1",
        "169.254.169.254",
        "100.64.0.1",  # CGNAT
        "0.0.0.0",
        "224.0.0.1",
        "168.63.129.16",  # Azure Wire Server
        "::1",
        "fd00::5",  # ULA
        "fe80::1",
        "::ffff:10.0.0.5",  # IPv4-mapped
        "::10.0.0.5",  # IPv4-compatible
        "2002:a9fe:a9fe::",  # 6to4 of 169.254.169.254
        "64:ff9b::7f00:1",  # NAT64 of 127.0.0.1
        # Global to Python 3.11's `is_global`, inside the network all the same:
        "64:ff9b:1::a00:1",  # local-use NAT64 (RFC 8215), the operator's own translator
        "64:ff9b:1:a00:1::",  # another place in it (a /64 prefix)
        "fec0::1",  # site-local
        "::ffff:0:a9fe:a9fe",  # IPv4-translated (SIIT) 169.254.169.254
    ],
)
def test_non_public_addresses(address: str) -> None:
    assert not is_public_address(address)


@pytest.mark.parametrize(
    "address", ["8.8.8.8", "2606:4700::1111", "64:ff9b::808:808", "::ffff:0:808:808"]
)
def test_public_addresses(address: str) -> None:
    assert is_public_address(address)


@pytest.mark.parametrize(
    "url",
    [
        "http://a@127.0.0.1/",  # userinfo: parsers disagree on which `@` ends it
        "http://images.example.com\\@127.0.0.1/",
        "http://exa%6dple.com/",
        "http://\uff11\uff12\uff17.0.0.1/",  # IDNA maps fullwidth digits onto 127
        "http://127.0.0.1 /",
        "http://ex\tample.com/",
        "http://1.2.3.4.5/",
        "http://256.0.0.1/",
        "http://08.0.0.1/",
        "http://[::1/",
        "http://host:port/",
        "http:///x",
        "http:127.0.0.1",
        "ftp://example.com/",
    ],
)
def test_urls_fetchers_read_differently_are_bad(url: str) -> None:
    with pytest.raises(BadURL):
        remote_host(url)


@pytest.mark.parametrize(
    ("doc", "param"),
    [
        (chat(image("http://169.254.169.254/")), "messages[0].content[0]"),
        (chat(image("file:///etc/passwd")), "messages[0].content[0]"),
        (chat(image("gopher://127.0.0.1:6379/_INFO")), "messages[0].content[0]"),
        (chat(image("/srv/x.png")), "messages[0].content[0]"),  # SGLang opens the path
        (chat(image("DATA:image/png;base64,AA")), "messages[0].content[0]"),
        (chat({"type": "image_url", "image_url": "http://localhost/"}), "messages[0].content[0]"),
        (chat({"image_url": {"url": "http://x.localhost/"}}), "messages[0].content[0]"),
        (
            chat(
                # (beside `"type": "text"` it is refused before: tests/unit/test_part_keys.py)
                {"Type": "image_url", "Image_URL": {"URL": "http://10.0.0.1/"}}
            ),
            "messages[0].content[0]",
        ),
        (
            chat({"type": "input_video", "input_video": {"url": "http://[fd00::1]/"}}),
            "messages[0].content[0]",
        ),
        (
            chat({"type": "file", "file": {"file_data": "file:///etc/shadow"}}),
            "messages[0].content[0]",
        ),
        (  # llama.cpp fetches what starts with `http`; a guessed scheme reads a user `http`
            chat({"type": "input_audio", "input_audio": {"data": "http@127.0.0.1/"}}),
            "messages[0].content[0]",
        ),
        (
            {
                "model": "m",
                "input": [{"prompt_string": "x", "multimodal_data": ["http://10.0.0.1/"]}],
            },
            "input[0].multimodal_data",
        ),
        (
            {"model": "m", "content": {"prompt_string": "x", "multimodal_data": ["file:///x"]}},
            "content.multimodal_data",
        ),
        # SGLang's embedding input objects: `image` and `video` are loaded as a chat image
        ({"model": "m", "input": [{"text": "x", "image": "http://10.0.0.1/"}]}, "input[0].image"),
        ({"model": "m", "input": [{"text": "x"}, {"video": "/srv/v.mp4"}]}, "input[1].video"),
        ({"model": "m", "input": [{"image": "iVBORw0KGgo="}]}, "input[0].image"),  # a path?
        # Infinity reads each `input` string as a URL it fetches when `modality` is not text
        ({"model": "m", "modality": "image", "input": ["http://169.254.169.254/"]}, "input[0]"),
        ({"model": "m", "modality": "audio", "input": "http://127.0.0.1:6379/"}, "input"),
        (
            {"model": "m", "modality": "image", "input": ["data:image/png;,A", "/etc/passwd"]},
            "input[1]",
        ),
        # vLLM's `mm_payload`, multimodal input beside the messages: before, never read
        (
            {"model": "m", "messages": [{"role": "user", "content": "x"}],
             "mm_payload": {"image": [{"image_url": "http://10.0.0.1/a.png"}]}},
            "mm_payload",
        ),
        ({"model": "m", "prompt": "x", "mm_payload": ["file:///etc/passwd"]}, "mm_payload"),
        ({"model": "m", "prompt": "x", "mm_payload": {"video": {"url": "/srv/v.mp4"}}},
         "mm_payload"),
    ],
)  # fmt: skip
def test_references_inside_the_network_are_refused(doc: dict[str, Any], param: str) -> None:
    refused = refusal(doc)
    assert refused is not None and refused.param == param
    assert refused.status == 400


@pytest.mark.parametrize(
    "doc",
    [
        {"model": "m", "messages": [{"role": "user", "content": "see http://127.0.0.1/"}]},
        chat({"type": "text", "text": "file:///etc/passwd and http://10.0.0.1/"}),
        chat(image("https://images.example.com/a.png"), image("data:image/png;base64,AA")),
        chat({"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}),
        chat({"type": "image_url", "image_url": {"url": "https://8.8.8.8/a.png", "detail": "low"}}),
        {"model": "m", "prompt": {"prompt_string": "x", "multimodal_data": ["iVBORw0KGgo="]}},
        {"model": "m", "prompt": [1, 2, 3]},
        {"model": "m", "input": [{"text": "see http://10.0.0.1/", "image": "data:image/png;,A"}]},
        {"model": "m", "input": ["image", "video"]},
        # text embeddings: `input` is text, whatever it spells
        {"model": "m", "modality": "text", "input": ["http://10.0.0.1/"]},
        {"model": "m", "modality": None, "input": "http://10.0.0.1/"},
        {"model": "m", "modality": "image", "input": ["https://images.example.com/a.png"]},
        {"model": "m", "prompt": "x", "mm_payload": {"image": ["data:image/png;,A", "a1b2"]}},
    ],
)
def test_text_data_and_public_urls_pass(doc: dict[str, Any]) -> None:
    assert refusal(doc) is None


def test_remote_none_allows_data_urls_only() -> None:
    none = MediaUrlSettings(remote="none")
    assert refusal(chat(image("data:image/png;base64,AA")), none) is None
    refused = refusal(chat(image("data:,"), image("https://images.example.com/a.png")), none)
    assert refused is not None and refused.param == "messages[0].content[1]"


def test_listed_hosts_only_in_their_canonical_form() -> None:
    listed = MediaUrlSettings(remote="listed", hosts=("Images.Example.com.", "8.8.8.8"))
    assert listed.hosts == ("images.example.com", "8.8.8.8")
    for url in (
        "https://images.example.com:443/a",
        "http://IMAGES.EXAMPLE.COM./b",
        "http://134744072/",
    ):
        assert refusal(chat(image(url)), listed) is None, url
    for url in ("https://images.example.com.evil.net/", "https://cdn.example.com/"):
        assert refusal(chat(image(url)), listed) is not None, url


@pytest.mark.parametrize(
    ("media", "why"),
    [
        ({"remote": "listed"}, "remote: listed"),
        ({"hosts": ["images.example.com"]}, "remote: listed"),
        ({"remote": "listed", "hosts": ["127.0.0.1"]}, "loopback"),
        ({"remote": "listed", "hosts": ["localhost"]}, "loopback"),
        ({"remote": "listed", "hosts": ["[::1]"]}, "loopback"),
        ({"remote": "listed", "hosts": ["a b"]}, "neither"),
        ({"remote": "everything"}, "remote"),
    ],
)
def test_media_urls_settings_are_checked(media: dict[str, Any], why: str) -> None:
    with pytest.raises(ValidationError, match=why):
        MediaUrlSettings.model_validate(media)


def test_media_urls_is_for_private_backends() -> None:
    hosted = {
        "id": "h",
        "kind": "hosted",
        "provider": "openai",
        "models": [{"name": "m", "provider_model": "openai/gpt-4o"}],
        "region": "us",
        "owner": "openai",
        "api_key_env": "K",
    }
    BackendSettings.model_validate(hosted)
    with pytest.raises(ValidationError, match="private backends"):
        BackendSettings.model_validate({**hosted, "media_urls": {"remote": "none"}})


def test_a_dumped_hosted_backend_validates_again() -> None:
    # A reload or a round trip carries the default back, set: not a hosted mistake.
    hosted = {
        "id": "h",
        "kind": "hosted",
        "provider": "openai",
        "models": [{"name": "m", "provider_model": "openai/gpt-4o"}],
        "region": "us",
        "owner": "openai",
        "api_key_env": "K",
    }
    dumped = BackendSettings.model_validate(hosted).model_dump()
    assert BackendSettings.model_validate(dumped).media_urls.remote == "public"


def test_at_most_max_remote_urls() -> None:
    urls = [image(f"https://images.example.com/{i}.png") for i in range(MAX_REMOTE + 1)]
    refused = refusal(chat(*urls))
    assert refused is not None and "at most" in refused.message


def test_a_plain_chat_is_looked_at_without_a_python_call() -> None:
    doc = {"model": "m", "messages": [{"role": "user", "content": "hi " * 1000}] * 8}
    body = orjson.dumps(doc)
    assert python_calls(lambda: MediaRefs.of(doc, body), by_name) == ["of"]


@pytest.mark.parametrize(
    "message",
    [
        {"role": "user", "content": "hi"},
        {"role": "user"},
    ],
    ids=["plain", "no content"],
)
def test_the_messages_are_told_plain_without_a_python_step_each(message: dict[str, Any]) -> None:
    """An 8 MiB body of 250,000 plain messages held the event loop 0.6 s in a Python loop
    over them, four times its parse: the steps are now the same for 10 messages or 1,000
    (counted). (A message that is not plain has them all walked, within
    `limits.max_media_walk_values`: tests/integration/test_media_walk_bound.py.)"""

    def steps(count: int) -> int:
        plain = [{"role": "user", "content": "hi"}] * (count - 1)
        doc = {"model": "m", "messages": [*plain, message]}
        body = orjson.dumps(doc)
        return python_steps(lambda: MediaRefs.of(doc, body))

    assert steps(1_000) == steps(10)


def test_text_parts_and_data_urls_are_not_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    parsed: list[str] = []

    def counting(url: str) -> media_hosts.Host:
        parsed.append(url)
        return remote_host(url)

    monkeypatch.setattr(private_media, "remote_host", counting)
    doc = chat({"type": "text", "text": "a"}, image("data:image/png;base64,AA"))
    assert MediaRefs.of(doc, orjson.dumps(doc)) is None
    assert parsed == []


def test_a_chat_body_s_bytes_are_searched_only_for_a_hidden_content() -> None:
    # Not for llama.cpp's prompt objects; once for `"content"` (and by a regex for an
    # escaped letter: a message's earlier `content` copy, tests/unit/test_part_keys.py).
    searches: list[tuple[str, bytes]] = []

    class Searched(bytes):
        def find(self, sub: Any, *args: Any) -> int:
            searches.append(("find", sub))
            return super().find(sub, *args)

        def count(self, sub: Any, *args: Any) -> int:
            searches.append(("count", sub))
            return super().count(sub, *args)

    doc = {"model": "m", "messages": [{"role": "user", "content": "word " * 20_000}]}
    assert MediaRefs.of(doc, Searched(orjson.dumps(doc))) is None
    assert searches == [("count", b'"content"')]
    searches.clear()
    doc = {"model": "m", "prompt": "word " * 20_000}
    assert MediaRefs.of(doc, Searched(orjson.dumps(doc))) is None
    assert searches == []


@pytest.mark.parametrize(
    "message",
    [
        {"role": "user", "Content": [image("http://127.0.0.1/")]},
        {"role": "user", "images": ["http://169.254.169.254/"]},
        {"content": "hi", "CONTENT": [{"image_url": "http://10.0.0.1/"}]},
    ],
)
def test_a_message_of_two_keys_besides_a_plain_one_is_walked(message: dict[str, Any]) -> None:
    # The hot path took any message of at most two keys whose `content` (exact case) is a
    # string or missing for a plain one: a `Content` array (a server in Go reads it) or
    # `images` beside a role were never walked, though the walk refuses them.
    refused = refusal({"model": "m", "messages": [message]})
    assert refused is not None and str(refused.param).startswith("messages[0].")


def test_an_input_object_s_media_key_spelled_with_escapes_is_read() -> None:
    body = b'{"model":"m","input":[{"im\\u0061ge":"http://127.0.0.1/"}]}'
    refs = MediaRefs.of(orjson.loads(body), body)
    refused = None if refs is None else refs.refusal(PUBLIC)
    assert refused is not None and refused.param == "input[0].image"
