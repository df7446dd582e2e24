"""Media URLs a private backend would fetch from inside the organisation's network are
refused before its dispatch record: vLLM, llama.cpp and SGLang download them themselves
(gateway/api/private_media.py). A raw backend records every request it gets: a refused
one reaches it with nothing, and the log holds a refusal record, no dispatch. Public
URLs and `data:` URLs reach it byte for byte; a backend's `media_urls:` narrows that."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml

from gateway.app import create_app
from gateway.config import load_config
from gateway.serving import ServerThread
from tests.helpers.gateways import TENANT_KEY, Gateway, backend, gateway_config, logged_gateway
from tests.helpers.log_truth import ORIGIN
from tests.helpers.provenance import records
from tests.helpers.raw_backend import ERROR_BODY, Answer, RawBackend, json_answer
from tests.helpers.waiting import until

ANSWER = orjson.dumps(
    {
        "id": "c1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "user", "content": "ok"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
)
PUBLIC = "https://images.example.com/cat.png"
DATA = "data:image/png;base64,iVBORw0KGgo="


def image(url: Any) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def chat(*parts: dict[str, Any], **message: Any) -> dict[str, Any]:
    content = [{"type": "text", "text": "what is in it? http://127.0.0.1/ in prose"}, *parts]
    return {"model": "m", "messages": [{"role": "user", "content": content, **message}]}


# (path, body, param): each would have the backend fetch inside the network, or read a file.
REFUSED: dict[str, tuple[str, dict[str, Any], str]] = {
    "cloud metadata": (
        "/v1/chat/completions",
        chat(image("http://169.254.169.254/latest/meta-data/iam/")),
        "messages[0].content[1]",
    ),
    "redis on loopback": (
        "/v1/chat/completions",
        chat(image("http://127.0.0.1:6379/")),
        "messages[0].content[1]",
    ),
    "internal admin": (
        "/v1/chat/completions",
        chat(image("http://10.0.0.5/admin")),
        "messages[0].content[1]",
    ),
    "a local file": (
        "/v1/chat/completions",
        chat(image("file:///etc/passwd")),
        "messages[0].content[1]",
    ),
    "decimal loopback": (
        "/v1/chat/completions",
        chat(image("http://2130706433/")),
        "messages[0].content[1]",
    ),
    "hex loopback": (
        "/v1/chat/completions",
        chat(image("http://0x7f.1/")),
        "messages[0].content[1]",
    ),
    "octal loopback": (
        "/v1/chat/completions",
        chat(image("HTTP://0177.0.0.1/")),
        "messages[0].content[1]",
    ),
    "IPv4-mapped loopback": (
        "/v1/chat/completions",
        chat(image("http://[::ffff:127.0.0.1]:8080/")),
        "messages[0].content[1]",
    ),
    "unique local IPv6": (
        "/v1/chat/completions",
        chat(image("http://[fd00::5]/")),
        "messages[0].content[1]",
    ),
    "CGNAT": ("/v1/chat/completions", chat(image("http://100.64.0.1/")), "messages[0].content[1]"),
    "localhost": (
        "/v1/chat/completions",
        chat(image("http://LOCALHOST.:8000/")),
        "messages[0].content[1]",
    ),
    "userinfo confusion": (
        "/v1/chat/completions",
        chat(image("http://images.example.com@127.0.0.1/")),
        "messages[0].content[1]",
    ),
    "audio_url": (
        "/v1/chat/completions",
        chat({"type": "audio_url", "audio_url": {"url": "http://127.0.0.1/a.wav"}}),
        "messages[0].content[1]",
    ),
    "video_url as a string": (
        "/v1/chat/completions",
        chat({"type": "video_url", "video_url": "http://10.1.2.3/v.mp4"}),
        "messages[0].content[1]",
    ),
    "llama.cpp input_audio data URL": (
        "/v1/chat/completions",
        chat(
            {"type": "input_audio", "input_audio": {"data": "http://127.0.0.1/", "format": "wav"}}
        ),
        "messages[0].content[1]",
    ),
    "vLLM part without a type": (
        "/v1/chat/completions",
        chat({"image_url": "http://169.254.169.254/"}),
        "messages[0].content[1]",
    ),
    "SGLang local path": (
        "/v1/chat/completions",
        chat(image("/srv/uploads/other-tenant.png")),
        "messages[0].content[1]",
    ),
    "content in another case (a server in Go)": (
        "/v1/chat/completions",
        {
            "model": "m",
            "messages": [
                {"role": "user", "content": "hi", "Content": [image("http://127.0.0.1/")]}
            ],
        },
        "messages[0].Content[0]",
    ),
    "message images": (
        "/v1/chat/completions",
        chat(images=[image("http://192.168.1.1/")]),
        "messages[0].images",
    ),
    "vLLM chat embeddings": (
        "/v1/embeddings",
        chat(image("http://127.0.0.1/")),
        "messages[0].content[1]",
    ),
    "llama.cpp multimodal_data": (
        "/v1/completions",
        {
            "model": "m",
            "prompt": {"prompt_string": "<__media__>", "multimodal_data": ["http://127.0.0.1/"]},
        },
        "prompt.multimodal_data",
    ),
    # SGLang's `/v1/embeddings` reads `input` objects (`{"text", "image", "video"}`) and
    # loads each `image` / `video` as its chat image parts: a URL, a path, base64.
    "SGLang embedding image": (
        "/v1/embeddings",
        {"model": "m", "input": [{"text": "a cat"}, {"image": "http://169.254.169.254/"}]},
        "input[1].image",
    ),
    "SGLang embedding image path": (
        "/v1/embeddings",
        {"model": "m", "input": [{"text": "a cat", "image": "/srv/uploads/other-tenant.png"}]},
        "input[0].image",
    ),
    "SGLang embedding video": (
        "/v1/embeddings",
        {"model": "m", "input": [{"video": "http://10.0.0.5/admin"}]},
        "input[0].video",
    ),
    # Infinity (a `kind: openai` backend) fetches each `input` string as a URL when the
    # embeddings request's `modality` is `image` or `audio`
    "Infinity image embedding": (
        "/v1/embeddings",
        {"model": "m", "modality": "image", "input": ["http://169.254.169.254/latest/"]},
        "input[0]",
    ),
    "Infinity audio embedding": (
        "/v1/embeddings",
        {"model": "m", "modality": "audio", "input": "http://10.0.0.5/admin"},
        "input",
    ),
}


def start(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    **media: Any,
) -> tuple[Gateway, RawBackend]:
    raw = start_raw(json_answer(ANSWER))
    extra: dict[str, Any] = {"media_urls": media} if media else {}
    gateway = logged_gateway(
        start_gateway, tmp_path, [backend("gpu", raw.url, "m", **extra)], ORIGIN
    )
    return gateway, raw


def post(gateway: Gateway, path: str, doc: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{gateway.url}{path}", json=doc, headers=gateway.headers, timeout=30)


def logged(tmp_path: Path, request_id: str, served_id: str) -> list[dict[str, Any]]:
    """`request_id`'s records, once a checkpoint covers the completion of `served_id`."""

    def covered() -> bool:
        return any(
            r["request_id"] == served_id and r["type"] == "completion"
            for r in records(tmp_path / "log")
        )

    until(covered, f"the signed completion of {served_id}", timeout=30, interval=0.02)
    return [r for r in records(tmp_path / "log") if r["request_id"] == request_id]


def test_media_urls_inside_the_network_never_reach_a_private_backend(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    gateway, raw = start(start_raw, start_gateway, tmp_path)
    ids = {}
    for case, (path, doc, param) in REFUSED.items():
        response = post(gateway, path, doc)
        assert response.status_code == 400, (case, response.text)
        error = response.json()["error"]
        assert (error["code"], error["param"], error["type"]) == (
            "invalid_request",
            param,
            "invalid_request_error",
        ), case
        for spelled in (
            "127.0.0.1",
            "169.254",
            "10.0.0.5",
            "passwd",
            "2130706433",
            "0x7f",
            "other-tenant",
        ):
            assert spelled not in error["message"], (case, error["message"])
        ids[case] = response.headers["x-request-id"]
    assert raw.posts == []  # nothing reached it
    served = post(gateway, "/v1/chat/completions", chat(image(PUBLIC), image(DATA)))
    assert served.status_code == 200, served.text
    assert len(raw.posts) == 1
    found = logged(tmp_path, ids["cloud metadata"], served.headers["x-request-id"])
    # Nothing was sent: no dispatch record; the refusal says what the client got.
    assert [r["type"] for r in found] == ["refusal"], found
    assert (found[0]["reason"], found[0]["rule"]) == ("invalid_request", "owngate/media_urls")


def test_public_and_data_urls_reach_the_backend_byte_for_byte(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    gateway, raw = start(start_raw, start_gateway, tmp_path)
    doc = chat(
        image(PUBLIC),
        image(DATA),
        {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
    )
    body = orjson.dumps(doc)
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions",
        content=body,
        headers={**gateway.headers, "content-type": "application/json"},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    assert [p.body for p in raw.posts] == [body]


def test_sglang_embedding_inputs_are_held_to_the_backend_s_media_urls(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    """An SGLang embeddings `input` object's `image` is a media reference like a chat
    part's (before, no `input` object was read unless the body named llama.cpp's
    `multimodal_data`); its `text` is prose, as a text part's is."""
    gateway, raw = start(start_raw, start_gateway, tmp_path, remote="none")
    fetched = {"model": "m", "input": [{"text": "a cat", "image": PUBLIC}]}
    response = post(gateway, "/v1/embeddings", fetched)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "input[0].image"
    assert raw.posts == []
    inline = {"model": "m", "input": [{"text": "see http://127.0.0.1/ in prose", "image": DATA}]}
    body = orjson.dumps(inline)
    response = httpx.post(
        f"{gateway.url}/v1/embeddings",
        content=body,
        headers={**gateway.headers, "content-type": "application/json"},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    assert [p.body for p in raw.posts] == [body]


@pytest.mark.parametrize(
    ("media", "allowed", "refused"),
    [
        ({"remote": "none"}, [DATA], [PUBLIC]),
        (
            {"remote": "listed", "hosts": ["images.example.com"]},
            [DATA, PUBLIC, "https://IMAGES.example.com.:8443/x.png"],
            ["https://cdn.example.org/x.png", "https://images.example.com.evil.net/x.png"],
        ),
    ],
)
def test_a_backend_s_media_urls_setting_narrows_what_it_is_sent(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    media: dict[str, Any],
    allowed: list[str],
    refused: list[str],
) -> None:
    gateway, raw = start(start_raw, start_gateway, tmp_path, **media)
    for url in refused:
        response = post(gateway, "/v1/chat/completions", chat(image(url)))
        assert response.status_code == 400, (url, response.text)
        assert response.json()["error"]["param"] == "messages[0].content[1]"
    assert raw.posts == []
    for url in allowed:
        response = post(gateway, "/v1/chat/completions", chat(image(url)))
        assert response.status_code == 200, (url, response.text)
    assert len(raw.posts) == len(allowed)


def test_a_backend_that_fetches_no_url_is_passed_over_for_one_that_may(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    strict, open_ = start_raw(json_answer(ANSWER)), start_raw(json_answer(ANSWER))
    backends = [
        backend("strict", strict.url, "m", media_urls={"remote": "none"}),
        backend("open", open_.url, "m"),
    ]
    gateway = logged_gateway(start_gateway, tmp_path, backends, ORIGIN)
    for _ in range(4):  # whichever the picker tries first
        response = post(gateway, "/v1/chat/completions", chat(image(PUBLIC)))
        assert response.status_code == 200, response.text
    assert strict.posts == [] and len(open_.posts) == 4
    found = logged(tmp_path, response.headers["x-request-id"], response.headers["x-request-id"])
    assert [r["backend"]["id"] for r in found if r["type"] == "dispatch"] == ["open"]


@pytest.mark.parametrize(
    "message",
    [
        {"role": "user", "Content": [image("http://127.0.0.1:6379/")]},
        {"role": "user", "images": ["http://169.254.169.254/latest/meta-data/"]},
    ],
)
def test_a_two_key_message_with_a_media_key_is_read_too(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    message: dict[str, Any],
) -> None:
    """The plain-chat shortcut took any message of two keys without an array `content`:
    a role beside `Content` (a server in Go reads it) or `images` reached the backend."""
    gateway, raw = start(start_raw, start_gateway, tmp_path)
    response = post(gateway, "/v1/chat/completions", {"model": "m", "messages": [message]})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"].startswith("messages[0].")
    assert raw.posts == []


def test_a_config_reload_narrowing_media_urls_reaches_a_request_held_before_it(
    start_raw: Callable[[Answer], RawBackend],
    tmp_path: Path,
) -> None:
    """A request held at one of two backends across a gateway.yaml reload that sets both
    media_urls to `remote: none`; the held one then fails (503): the failover does not send
    its public URL to the other (before, the arrival config's `public` was read)."""
    release = threading.Event()
    raws = [start_raw(json_answer(ERROR_BODY, b"503 Service Unavailable", release))]
    raws.append(start_raw(json_answer(ERROR_BODY, b"503 Service Unavailable", release)))
    path = tmp_path / "gateway.yaml"

    def write(media: dict[str, Any]) -> None:
        backends = [backend(f"gpu{i}", raw.url, "m", **media) for i, raw in enumerate(raws)]
        config = gateway_config(backends).model_dump(mode="json", exclude_none=True)
        temporary = tmp_path / "gateway.yaml.tmp"
        temporary.write_text(yaml.safe_dump(config))
        temporary.replace(path)

    write({})
    app = create_app(load_config(path), config_dir=tmp_path, config_file=path)
    server = ServerThread(app).start()
    try:
        with ThreadPoolExecutor(max_workers=1) as pool:
            pending = pool.submit(
                httpx.post,
                f"{server.url}/v1/chat/completions",
                json=chat(image(PUBLIC)),
                headers={"authorization": f"Bearer {TENANT_KEY}"},
                timeout=60,
            )
            until(lambda: any(raw.posts for raw in raws), "the first attempt")
            arrival = app.parts
            write({"media_urls": {"remote": "none"}})
            until(lambda: app.parts is not arrival, "the config reload", timeout=30)
            release.set()
            response = pending.result(timeout=60)
    finally:
        release.set()
        server.stop()
    sent = sum(len(raw.posts) for raw in raws)
    assert sent == 1, "a URL went to a backend whose media_urls a reload narrowed"
    assert response.status_code == 503, response.text


# Bodies whose media parts a server in Go reads otherwise than the gateway (orjson keeps
# the last copy of a key, exact case): written as bytes, a dict holds no key twice.
_PRIVATE = "http://10.0.0.5/admin"
READ_TWICE: dict[str, tuple[bytes, str]] = {
    # Go keeps a string over a later `null`: the backend fetches it, the check read none.
    "url, then null": (
        b'{"type": "image_url", "image_url": {"url": "%s", "url": null}}',
        "messages[0].content[1].image_url.url",  # a repeat: gateway/api/body_names.py
    ),
    "url escaped, then null": (
        b'{"type": "image_url", "image_url": {"url": "%s", "u\\u0072l": null}}',
        "messages[0].content[1].image_url.url",
    ),
    # Go merges two copies of an object.
    "image_url twice": (
        b'{"type": "image_url", "image_url": {"url": "%s"}, "image_url": {"detail": "low"}}',
        "messages[0].content[1].image_url",
    ),
    # Text to vLLM, an image to a server in Go.
    "type in two cases": (
        b'{"type": "text", "text": "hi", "Type": "image_url", "image_url": "%s"}',
        "messages[0].content[1]",
    ),
}


@pytest.mark.parametrize("case", READ_TWICE)
def test_a_media_part_with_a_key_read_twice_never_reaches_a_private_backend(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    case: str,
) -> None:
    """`{"url": "http://10.0.0.5/", "url": null}`: a server decoding the part into a Go
    struct keeps the URL, while the media check read the last copy, no URL, and passed it
    (gateway/api/part_keys.py)."""
    gateway, raw = start(start_raw, start_gateway, tmp_path)
    part, param = READ_TWICE[case]
    body = (
        b'{"model": "m", "messages": [{"role": "user", "content": '
        b'[{"type": "text", "text": "look"}, ' + part % _PRIVATE.encode() + b"]}]}"
    )
    headers = {**gateway.headers, "content-type": "application/json"}
    url = f"{gateway.url}/v1/chat/completions"
    response = httpx.post(url, content=body, headers=headers, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_request", param)
    assert "10.0.0.5" not in error["message"]
    served = post(gateway, "/v1/chat/completions", chat(image(PUBLIC)))
    assert served.status_code == 200, served.text
    assert len(raw.posts) == 1  # the served one only
    # Refused with the body's other faults, before its log entry began: no dispatch.
    found = logged(tmp_path, response.headers["x-request-id"], served.headers["x-request-id"])
    assert found == [], found


# A chat that is plain to orjson (each message a role and a string content, the last copy)
# whose message wrote parts first: a first-wins reader (Go's gjson) reads the parts, and a
# Go type that keeps a string and parts in two fields both (gateway/api/part_keys.py).
_PARTS = b'[{"type": "image_url", "image_url": {"url": "%s"}}]' % _PRIVATE.encode()
HIDDEN_CONTENT: dict[str, bytes] = {
    "parts, then a string": b'"content": %s, "content": "hi"' % _PARTS,
    "the first copy escaped": b'"c\\u006fntent": %s, "content": "hi"' % _PARTS,
}


@pytest.mark.parametrize("case", HIDDEN_CONTENT)
def test_a_plain_message_hiding_earlier_parts_never_reaches_a_private_backend(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    case: str,
) -> None:
    gateway, raw = start(start_raw, start_gateway, tmp_path)
    body = (
        b'{"model": "m", "messages": [{"role": "system", "content": "be brief"}, '
        b'{"role": "user", ' + HIDDEN_CONTENT[case] + b"}]}"
    )
    headers = {**gateway.headers, "content-type": "application/json"}
    url = f"{gateway.url}/v1/chat/completions"
    response = httpx.post(url, content=body, headers=headers, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    # (a repeated name, refused for any object: gateway/api/body_names.py)
    assert (error["code"], error["param"]) == ("invalid_request", "messages[1].content")
    assert "10.0.0.5" not in error["message"]
    served = post(gateway, "/v1/chat/completions", chat(image(PUBLIC)))
    assert served.status_code == 200, served.text
    assert len(raw.posts) == 1  # the served one only
    found = logged(tmp_path, response.headers["x-request-id"], served.headers["x-request-id"])
    assert found == [], found
