"""A chat field the provider's LiteLLM adapter would drop (`drop_params=True`) is refused
on the hosted attempt, before anything is sent (gateway/upstream/hosted_support.py).

LiteLLM 1.108.7 takes no `n`, `seed`, `logprobs` or `logit_bias` for Anthropic and left
them out unsaid: a client that asked for two choices got one, with a 200 and a record
committing to it. Now the request is 400 `upstream_bad_request` naming the field and
the provider, the provider gets nothing and the signed log holds a refusal record and
nothing else; the same request with the field at its default (`n: 1`) is served.

So is an inference server's own field that constrains the answer (vLLM's `guided_json`,
llama.cpp's `grammar`, `top_k`, ...: gateway/upstream/unsent_fields.py `ANSWER_FIELDS`)
when a down private backend fails the request over: LiteLLM is never given it, and the
client got unconstrained text with a 200.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.helpers.anthropic_stack import Stack, anthropic_stack
from tests.helpers.anthropic_stack import chat as ask
from tests.helpers.gateways import (
    LITELLM_WARNINGS,
    TENANT_KEY,
    backend,
)
from tests.helpers.net import free_port
from tests.helpers.provenance import request_records

pytestmark = LITELLM_WARNINGS


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with anthropic_stack(tmp_path_factory.mktemp("dropped"), "test.owngate/dropped") as served:
        yield served


@pytest.fixture(scope="module")
def failed_over(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """`stack`'s gateway with a private backend first, down (nothing listens on its port)."""
    down = backend("gpu", f"http://127.0.0.1:{free_port()}/v1", "m")
    root = tmp_path_factory.mktemp("failed_over")
    with anthropic_stack(root, "test.owngate/failed-over", (down,)) as served:
        yield served


def chat(stack: Stack, **fields: Any) -> httpx.Response:
    return ask(stack, messages=[{"role": "user", "content": "hi"}], **fields)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"n": 2}, "n"),
        ({"seed": 7}, "seed"),
        ({"logprobs": True, "top_logprobs": 2}, "logprobs"),
        ({"logit_bias": {"50256": -100}}, "logit_bias"),
    ],
)
def test_a_field_the_provider_would_lose_is_refused_unsent(
    stack: Stack, fields: dict[str, Any], param: str
) -> None:
    refused = chat(stack, **fields)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert (error["type"], error["code"], error["param"]) == (
        "invalid_request_error",
        "upstream_bad_request",
        param,
    )
    assert "not sent" in error["message"] and "provider does not take it" in error["message"]
    assert "anthropic" not in error["message"]  # which provider is a routing internal
    assert stack.anthropic.received == []
    request_id = refused.headers["x-request-id"]
    (refusal,) = request_records(stack.log, request_id, "refusal")
    assert (refusal["reason"], refusal["rule"]) == (
        "upstream_bad_request",
        "owngate/hosted_request",
    )
    assert {r["type"] for r in request_records(stack.log, request_id)} == {"refusal"}


def test_the_same_request_at_the_defaults_is_served(stack: Stack) -> None:
    answer = chat(stack, n=1, logprobs=False, user="someone")
    assert answer.status_code == 200, answer.text
    assert len(answer.json()["choices"]) == 1
    (received,) = stack.anthropic.received
    assert "n" not in received.body and "logprobs" not in received.body


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"return_token_ids": True}, "return_token_ids"),
        ({"chat_template_kwargs": {"enable_thinking": False}}, "chat_template_kwargs"),
        ({"decoy_field_x": 1}, "(key 4)"),  # a name the gateway does not know: its place
        (
            {"stream": True, "stream_options": {"continuous_usage_stats": True}},
            "stream_options.continuous_usage_stats",
        ),
    ],
)
def test_a_field_no_hosted_provider_is_sent_is_refused_unsent(
    stack: Stack, fields: dict[str, Any], param: str
) -> None:
    # It was left out without a word (its name computed, `ignored_fields`, and never
    # read): the answer made without it was a 200, and the record committed to it.
    refused = chat(stack, **fields)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert (error["code"], error["param"]) == ("upstream_bad_request", param)
    assert "not sent" in error["message"] and "not a field of this endpoint" in error["message"]
    assert "decoy" not in refused.text
    assert stack.anthropic.received == []
    request_id = refused.headers["x-request-id"]
    assert {r["type"] for r in request_records(stack.log, request_id)} == {"refusal"}


def test_a_text_completion_field_the_provider_would_lose_is_refused_unsent(stack: Stack) -> None:
    # LiteLLM asks Anthropic's chat adapter for a text completion: it left `seed` out
    # unsaid, and the answer made without it was a 200.
    def complete(**fields: Any) -> httpx.Response:
        stack.anthropic.reset()
        return httpx.post(
            f"{stack.url}/v1/completions",
            json={"model": "m", "prompt": "hi", "max_tokens": 8, **fields},
            headers={"authorization": f"Bearer {TENANT_KEY}"},
            timeout=120,
        )

    assert complete().status_code == 200
    refused = complete(seed=7)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["param"] == "seed"
    assert stack.anthropic.received == []


def test_several_prompts_of_a_text_completion_asked_as_a_chat_are_refused_unsent(
    stack: Stack,
) -> None:
    # LiteLLM asks Anthropic's chat adapter for a text completion, the prompts as one
    # chat's messages: one answer for both, a 502 once the prompts had been sent.
    stack.anthropic.reset()
    refused = httpx.post(
        f"{stack.url}/v1/completions",
        json={"model": "m", "prompt": ["first", "second"], "max_tokens": 8},
        headers={"authorization": f"Bearer {TENANT_KEY}"},
        timeout=120,
    )
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert (error["code"], error["param"]) == ("upstream_bad_request", "prompt")
    assert "not sent" in error["message"]
    assert "first" not in refused.text
    assert stack.anthropic.received == []
    request_id = refused.headers["x-request-id"]
    assert {r["type"] for r in request_records(stack.log, request_id)} == {"refusal"}


TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


@pytest.mark.parametrize(
    "fields",
    [
        {
            "presence_penalty": 0,
            "frequency_penalty": 0,
            "n": 1,
            "logprobs": False,
            "user": "end-user-1",
            "metadata": {"app": "sdk"},
            "max_tokens": None,
            "max_completion_tokens": 8,
            "tools": [TOOL],
            "tool_choice": "auto",
            "parallel_tool_calls": True,
        },
        {"response_format": {"type": "json_object"}, "store": False, "metadata": {}},
        {"stream": True, "stream_options": {"include_usage": True}, "temperature": 0.2},
    ],
    ids=["sdk-tools", "json-object", "stream-usage"],
)
def test_an_sdk_body_at_its_defaults_is_served(stack: Stack, fields: dict[str, Any]) -> None:
    # What the OpenAI SDK and LangChain send for honest requests: defaults, advisory
    # fields (`user`, `metadata`), `tool_choice: "auto"`, JSON mode.
    answer = chat(stack, **fields)
    assert answer.status_code == 200, answer.text
    if fields.get("stream"):
        assert b"data: [DONE]" in answer.content
    else:
        assert answer.json()["choices"][0]["finish_reason"] in {"stop", "length", "tool_calls"}
    (received,) = stack.anthropic.received
    assert "metadata" not in received.body or received.body["metadata"] != fields.get("metadata")


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"guided_json": {"type": "object"}}, "guided_json"),
        ({"grammar": 'root ::= "yes" | "no"'}, "grammar"),
        ({"top_k": 3, "decoy_field_x": 1}, "top_k"),
    ],
)
def test_a_server_field_that_constrains_the_answer_is_refused_on_failover(
    failed_over: Stack, fields: dict[str, Any], param: str
) -> None:
    served = chat(failed_over)  # the private backend is down: the hosted provider answers
    assert served.status_code == 200, served.text
    assert len(failed_over.anthropic.received) == 1
    refused = chat(failed_over, **fields)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert (error["type"], error["code"], error["param"]) == (
        "invalid_request_error",
        "upstream_bad_request",
        param,
    )
    assert "not sent" in error["message"] and "constrains or changes the answer" in error["message"]
    assert "decoy_field_x" not in refused.text
    assert failed_over.anthropic.received == []
    (refusal,) = request_records(failed_over.log, refused.headers["x-request-id"])
    assert (refusal["type"], refusal["reason"], refusal["rule"]) == (
        "refusal",
        "upstream_bad_request",
        "owngate/hosted_request",
    )
