"""An inference server's own fields that would evade the tenant's token budget, serve the
request with other weights, or reach the server's code, files or network are refused
with a 400 naming the field, on every proxied path, before the policy decides: the
simulated backend gets nothing and nothing is recorded (gateway/api/server_fields.py).
Fields that only tune sampling still reach it byte for byte."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.helpers.gateways import Gateway, Sim, logged_private_gateway
from tests.helpers.provenance import assert_never_logged

CHAT: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
LOOP = "{% for i in range(1000) %}{% for m in messages %}{{ m.content }}{% endfor %}{% endfor %}"
PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")


@pytest.fixture
def private(
    start_sim: Callable[..., Sim], start_gateway: Callable[..., Gateway], tmp_path: Path
) -> tuple[Gateway, Sim]:
    sim = start_sim("llamacpp", models=("m",), zero_latency=True)
    return logged_private_gateway(start_gateway, tmp_path, sim.url, "example.com/server"), sim


def post(gateway: Gateway, path: str, body: bytes) -> httpx.Response:
    return httpx.post(
        f"{gateway.url}{path}",
        content=body,
        headers={**gateway.headers, "content-type": "application/json"},
        timeout=60,
    )


@pytest.mark.parametrize(
    ("path", "extra", "param"),
    [
        ("/v1/chat/completions", {"chat_template": LOOP}, "chat_template"),
        (
            "/v1/chat/completions",
            {"chat_template_kwargs": {"chat_template": LOOP}},
            "chat_template_kwargs.chat_template",
        ),
        ("/v1/chat/completions", {"mm_processor_kwargs": {"fps": 10**4}}, "mm_processor_kwargs"),
        ("/v1/chat/completions", {"lora": [{"id": 0, "scale": 1.0}]}, "lora"),
        ("/v1/completions", {"lora_path": "adapter"}, "lora_path"),
        ("/v1/completions", {"prompt_embeds": "gASV"}, "prompt_embeds"),
        (
            "/v1/chat/completions",
            {"kv_transfer_params": {"remote_host": "x"}},
            "kv_transfer_params",
        ),
        (
            "/v1/completions",
            {"ec_transfer_params": {"mm-hash": {"remote_host": "x", "remote_port": 1}}},
            "ec_transfer_params",
        ),
        ("/v1/embeddings", {"chat_template": LOOP}, "chat_template"),
        # vLLM pads an embeddings prompt to the model's whole length: two bytes of input
        # become thousands of tokens, charged as two
        ("/v1/embeddings", {"padding": "max_length"}, "padding"),
        ("/v1/chat/completions", {"id_slot": 0}, "id_slot"),
        # SGLang: client strings as labels of its own metrics; what its shared caches held
        ("/v1/completions", {"custom_labels": {"tenant": "acme"}}, "custom_labels"),
        (
            "/v1/chat/completions",
            {"return_cached_tokens_details": True},
            "return_cached_tokens_details",
        ),
        ("/v1/chat/completions", {"use_audio_in_video": True}, "use_audio_in_video"),
        (
            "/v1/chat/completions",
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image_embeds", "image_embeds": "gASV"}]}
                ]
            },
            "messages[0].content[0]",
        ),
        (
            # vLLM would take another tenant's cached image by the name alone
            "/v1/chat/completions",
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "describe it"},
                            {"type": "image_url", "image_url": None, "uuid": "sku-1234"},
                        ],
                    }
                ]
            },
            "messages[0].content[1].uuid",
        ),
    ],
)
def test_a_server_field_is_refused_and_nothing_leaves(
    private: tuple[Gateway, Sim],
    tmp_path: Path,
    path: str,
    extra: dict[str, Any],
    param: str,
) -> None:
    gateway, sim = private
    ask = {"model": "m", "input": "hi"} if path == "/v1/embeddings" else CHAT
    if path == "/v1/completions":
        ask = {"model": "m", "prompt": "hi", "max_tokens": 2}
    refused = post(gateway, path, orjson.dumps({**ask, **extra}))
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert (error["code"], error["param"], error["type"]) == (
        "invalid_request",
        param,
        "invalid_request_error",
    )
    assert "range(1000)" not in refused.text and "remote_host" not in refused.text
    assert all(sim.app.captured(p) == [] for p in PATHS)
    # Nothing was dispatched, so nothing is recorded: the next request's records are
    # covered by a checkpoint, and none is the refused one's.
    ok = post(gateway, path, orjson.dumps(ask))
    assert ok.status_code == 200, ok.text
    log = tmp_path / "log"
    assert_never_logged(log, refused.headers["x-request-id"], ok.headers["x-request-id"])


def test_sampling_fields_still_reach_the_backend_untouched(private: tuple[Gateway, Sim]) -> None:
    gateway, sim = private
    body = {
        **CHAT,
        "n_predict": 4,
        "max_tokens": 4,
        "top_k": 3,
        "cache_prompt": True,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    answer = post(gateway, "/v1/chat/completions", orjson.dumps(body))
    assert answer.status_code == 200, answer.text
    (sent,) = sim.app.captured("/v1/chat/completions")
    assert orjson.loads(sent.body) == body  # byte pass-through, untouched
