"""What a real llama.cpp `llama-server` reads of a request body, beside what the gateway
reads of the same bytes (docs/security.md, "The body means one thing").

The gateway forwards a private request body as the client sent it, so where its parser
(orjson) and llama.cpp's (nlohmann/json) read one text differently, the policy, the
bound and the log would describe another request than the one served. These pin what the
pinned llama-server does with the shapes a client could use for that: a repeated key
(the last copy read, as orjson reads it), a key spelled with escapes (decoded alike), a
`stream` that is null or a string, and a `max_tokens` past 32 bits (read modulo 2**32,
so `2**32 - 1` is llama.cpp's -1, no limit: the gateway's bound reads any limit that
large as none).
"""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from gateway.api.usage_bound import COMPLETION_ALLOWANCE, completion_bound
from tests.helpers.gateways import Gateway, backend
from tests.helpers.real_backend.server import LlamaServer

pytestmark = pytest.mark.real_backend

_CHAT = b'"messages":[{"role":"user","content":"hi"}]'


@pytest.fixture
def gateway(real_llamacpp: LlamaServer, start_gateway: Callable[..., Gateway]) -> Gateway:
    return start_gateway(
        [backend("cpu-llama", real_llamacpp.base_url, real_llamacpp.alias, kind="llamacpp")]
    )


def _body(server: LlamaServer, fields: bytes) -> bytes:
    return b'{"model":"%s",%s,%s}' % (server.alias.encode(), _CHAT, fields)


def _direct(server: LlamaServer, fields: bytes) -> httpx.Response:
    return httpx.post(
        f"{server.base_url}/v1/chat/completions", content=_body(server, fields), timeout=60
    )


def _through(gateway: Gateway, server: LlamaServer, fields: bytes) -> httpx.Response:
    headers = {**gateway.headers, "content-type": "application/json"}
    url = f"{gateway.url}/v1/chat/completions"
    return httpx.post(url, content=_body(server, fields), headers=headers, timeout=60)


def _logprobs(response: httpx.Response) -> bool:
    assert response.status_code == 200, response.text
    return response.json()["choices"][0].get("logprobs") is not None


def _error(response: httpx.Response) -> tuple[int, str | None, str | None]:
    error = response.json()["error"]
    return response.status_code, error["code"], error["param"]


def test_a_repeated_key_is_read_by_its_last_copy_as_the_gateway_reads_it(
    real_llamacpp: LlamaServer, gateway: Gateway
) -> None:
    # llama.cpp keeps the last copy of a repeated key, as orjson does; other readers keep
    # the first, so the gateway refuses a repeat of any name (gateway/api/body_names.py).
    for first, last in ((b"false", b"true"), (b"true", b"false")):
        fields = b'"max_tokens":2,"logprobs":%s,"logprobs":%s' % (first, last)
        expected = last == b"true"
        assert _logprobs(_direct(real_llamacpp, fields)) is expected
        assert _error(_through(gateway, real_llamacpp, fields)) == (
            400,
            "invalid_request",
            "logprobs",
        )
    # llama.cpp reads the last `max_tokens` and the last `stream` too; the gateway refuses
    # repeats of those (a server in Go keeps a copy's value over a later `null`).
    direct = _direct(real_llamacpp, b'"ignore_eos":true,"max_tokens":1,"max_tokens":3')
    assert direct.json()["usage"]["completion_tokens"] == 3
    direct = _direct(real_llamacpp, b'"max_tokens":2,"stream":false,"stream":true')
    assert direct.headers["content-type"].startswith("text/event-stream")
    for name in (b"max_tokens", b"stream"):
        repeated = b'"max_tokens":2,"%s":false,"%s":true' % (name, name)
        got = _error(_through(gateway, real_llamacpp, repeated))
        assert got == (400, "invalid_request", name.decode())


def test_a_key_spelled_with_escapes_is_the_same_key_to_both(
    real_llamacpp: LlamaServer, gateway: Gateway
) -> None:
    escaped = b'"max_tokens":2,"str\\u0065am":true'
    assert _direct(real_llamacpp, escaped).headers["content-type"].startswith("text/event-stream")
    streamed = _through(gateway, real_llamacpp, escaped)
    assert streamed.status_code == 200, streamed.text
    assert streamed.headers["content-type"].startswith("text/event-stream")
    assert "data: [DONE]" in streamed.text


def test_a_null_stream_is_a_whole_answer_and_a_string_one_is_refused_by_both(
    real_llamacpp: LlamaServer, gateway: Gateway
) -> None:
    for answer in (
        _direct(real_llamacpp, b'"max_tokens":2,"stream":null'),
        _through(gateway, real_llamacpp, b'"max_tokens":2,"stream":null'),
    ):
        assert answer.status_code == 200, answer.text
        assert answer.headers["content-type"].startswith("application/json")
        assert answer.json()["object"] == "chat.completion"
    assert _direct(real_llamacpp, b'"max_tokens":2,"stream":"true"').status_code == 400
    refused = _through(gateway, real_llamacpp, b'"max_tokens":2,"stream":"true"')
    assert _error(refused) == (400, "invalid_request", "stream")


def test_a_limit_past_32_bits_wraps_on_llama_server_and_the_bound_reads_it_as_none(
    real_llamacpp: LlamaServer,
) -> None:
    # 2**32 + 1 is read as 1: llama.cpp keeps the low 32 bits of `max_tokens`.
    wrapped = _direct(real_llamacpp, b'"ignore_eos":true,"max_tokens":%d' % (2**32 + 1))
    assert wrapped.json()["usage"]["completion_tokens"] == 1
    # So 2**32 - 1 is its -1, no limit: the bound must not read it as a limit under
    # what a request without one is allowed.
    for limit in (2**32 - 1, 2**32 + 1, 2**63 - 1):
        assert completion_bound({"max_tokens": limit}, 0) == COMPLETION_ALLOWANCE
        assert completion_bound({"max_tokens": limit}, 0) == completion_bound({}, 0)
