"""Which fields a hosted provider's LiteLLM adapter would drop unsaid, as the pinned
LiteLLM (1.108.7) says (gateway/upstream/hosted_support.py), and which of a request's
fields are refused for it: a chat's, a text completion's LiteLLM asks as a chat, an
embeddings request's `dimensions`.

`PINNED` is read from LiteLLM's own `get_supported_openai_params`, one model of each
provider kind the docs name: a LiteLLM that takes more or fewer fields for one of them
fails here, and docs/api.md's list of what each provider refuses is to be checked again.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import pytest

from gateway.upstream.hosted_errors import HostedError
from gateway.upstream.hosted_support import ADVISORY, SupportTable, dropped_fields
from gateway.upstream.litellm_runtime import load_litellm

# provider_model: the non-advisory fields the gateway forwards that LiteLLM 1.108.7 drops.
_ANTHROPIC = (
    "audio frequency_penalty function_call functions logit_bias logprobs modalities n "
    "prediction presence_penalty"
)
PINNED = {
    "openai/gpt-4o": "reasoning_effort verbosity",
    "openai/o1": "frequency_penalty logprobs parallel_tool_calls presence_penalty "
    "top_logprobs top_p verbosity",
    "openai/gpt-5": "audio frequency_penalty logit_bias logprobs modalities prediction "
    "presence_penalty stop top_logprobs top_p web_search_options",
    "azure/gpt-4o": "reasoning_effort verbosity",
    "anthropic/claude-sonnet-4-5": f"{_ANTHROPIC} seed top_logprobs verbosity",
    "bedrock/anthropic.claude-3-5-sonnet-20240620-v1:0": f"{_ANTHROPIC} reasoning_effort "
    "seed top_logprobs verbosity web_search_options",
    "bedrock/meta.llama3-70b-instruct-v1:0": f"{_ANTHROPIC} reasoning_effort seed "
    "tool_choice tools top_logprobs verbosity web_search_options",
    "vertex_ai/gemini-2.0-flash": "function_call logit_bias prediction reasoning_effort verbosity",
    "gemini/gemini-2.5-flash": "audio function_call logit_bias prediction top_logprobs verbosity",
    "cohere/command-r": "audio function_call functions logit_bias logprobs modalities "
    "parallel_tool_calls prediction reasoning_effort response_format top_logprobs "
    "verbosity web_search_options",
    "mistral/mistral-large-latest": f"{_ANTHROPIC} reasoning_effort top_logprobs verbosity "
    "web_search_options",
}


@pytest.fixture(scope="module")
def litellm() -> ModuleType:
    return load_litellm()


@pytest.mark.parametrize("provider_model", sorted(PINNED))
def test_the_fields_each_provider_drops_are_the_pinned_litellms(
    litellm: ModuleType, provider_model: str
) -> None:
    dropped = dropped_fields(litellm, provider_model, None) - ADVISORY
    assert sorted(dropped) == PINNED[provider_model].split()


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"n": 2}, "n"),
        ({"seed": 7}, "seed"),
        ({"logprobs": True}, "logprobs"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"logit_bias": {"50256": -100}}, "logit_bias"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"frequency_penalty": 1}, "frequency_penalty"),
        ({"n": True}, "n"),  # JSON's true is not the default 1
    ],
)
def test_a_field_anthropic_would_lose_is_refused_naming_it_and_the_provider(
    litellm: ModuleType, fields: dict[str, Any], param: str
) -> None:
    table = SupportTable("anthropic", None)
    with pytest.raises(HostedError) as refused:
        table.check(litellm, "chat", {"messages": [], **fields}, "anthropic/claude-sonnet-4-5")
    assert (refused.value.status, refused.value.param) == (400, param)
    assert "not valid for anthropic (not sent)" in refused.value.message  # the operator's
    assert "anthropic" not in refused.value.public  # a routing internal to the client
    assert "this model's provider does not take it" in refused.value.public


@pytest.mark.parametrize(
    "fields",
    [
        {"n": 1, "logprobs": False, "presence_penalty": 0, "frequency_penalty": 0.0},
        {"logit_bias": {}, "top_logprobs": 0},
        {"user": "u", "safety_identifier": "s", "prompt_cache_key": "k", "service_tier": "auto"},
        {"temperature": 0.2, "top_p": 0.9, "stop": ["x"], "max_tokens": 5, "tools": []},
        {"stream": True, "stream_options": {"include_usage": True}},
    ],
)
def test_defaults_advisory_and_supported_fields_pass(
    litellm: ModuleType, fields: dict[str, Any]
) -> None:
    table = SupportTable("anthropic", None)
    table.check(litellm, "chat", {"messages": [], **fields}, "anthropic/claude-sonnet-4-5")


def test_support_depends_on_the_model_not_only_the_route(litellm: ModuleType) -> None:
    table = SupportTable("openai", None)
    table.check(litellm, "chat", {"messages": [], "top_p": 0.5}, "openai/gpt-4o")
    with pytest.raises(HostedError) as refused:
        table.check(litellm, "chat", {"messages": [], "top_p": 0.5}, "openai/o1")
    assert refused.value.param == "top_p"


@pytest.mark.parametrize(
    ("fields", "param"),
    [({"n": 2}, "n"), ({"seed": 7}, "seed"), ({"logprobs": 2}, "logprobs")],
)
def test_a_text_completion_litellm_asks_as_a_chat_is_held_to_the_chat_fields(
    litellm: ModuleType, fields: dict[str, Any], param: str
) -> None:
    # LiteLLM asks Anthropic's chat adapter for a text completion, which left `seed` (and
    # `n`, `logprobs`) out unsaid: the answer made without it was a 200.
    table = SupportTable("anthropic", None)
    table.check(
        litellm, "completions", {"prompt": "p", "max_tokens": 5}, "anthropic/claude-sonnet-4-5"
    )
    with pytest.raises(HostedError) as refused:
        table.check(
            litellm, "completions", {"prompt": "p", **fields}, "anthropic/claude-sonnet-4-5"
        )
    assert (refused.value.status, refused.value.param) == (400, param)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        # LiteLLM asks the chat adapter one chat of every prompt (one user message): one
        # choice came back for two prompts, sent and then 502 (the breaker charged).
        ({"prompt": ["alpha", "beta"]}, "prompt"),
        # Text completion fields LiteLLM hands the chat adapter as the provider's own
        # (top-level keys of Anthropic's Messages body): a provider that ignores them
        # answered without the echo, the suffix or the best of several, a 200.
        ({"prompt": "p", "echo": True}, "echo"),
        ({"prompt": "p", "suffix": "s"}, "suffix"),
        ({"prompt": "p", "best_of": 3}, "best_of"),
    ],
)
def test_a_text_completion_asked_as_a_chat_is_refused_what_a_chat_cannot_carry(
    litellm: ModuleType, fields: dict[str, Any], param: str
) -> None:
    table = SupportTable("anthropic", None)
    with pytest.raises(HostedError) as refused:
        table.check(litellm, "completions", fields, "anthropic/claude-sonnet-4-5")
    assert (refused.value.status, refused.value.param) == (400, param)


@pytest.mark.parametrize(
    "fields",
    [{"prompt": ["alpha"]}, {"prompt": "p", "echo": False, "best_of": 1}],
)
def test_one_prompt_and_text_fields_at_their_defaults_are_asked_as_a_chat(
    litellm: ModuleType, fields: dict[str, Any]
) -> None:
    SupportTable("anthropic", None).check(
        litellm, "completions", fields, "anthropic/claude-sonnet-4-5"
    )


@pytest.mark.parametrize(
    "provider_model", ["openai/m", "text-completion-openai/m", "hosted_vllm/m"]
)
def test_a_text_completion_sent_to_completions_keeps_its_fields(
    litellm: ModuleType, provider_model: str
) -> None:
    # OpenAI-style `/completions` routes: LiteLLM sends every forwarded field (the
    # provider refuses what it does not take, out loud).
    fields = {"n": 2, "seed": 7, "echo": True, "best_of": 2, "suffix": "s", "logprobs": 2}
    SupportTable("openai", None).check(
        litellm, "completions", {"prompt": "p", **fields}, provider_model
    )


@pytest.mark.parametrize(
    ("provider_model", "refused"),
    [
        ("openai/m", True),  # not text-embedding-3: LiteLLM leaves `dimensions` out
        ("openai/text-embedding-ada-002", True),
        ("mistral/mistral-embed", True),
        ("openai/text-embedding-3-small", False),
        ("azure/my-deployment", False),
        ("cohere/embed-english-v3.0", False),  # as `output_dimension`
        ("gemini/gemini-embedding-001", False),  # as `outputDimensionality`
        ("bedrock/amazon.titan-embed-text-v2:0", False),
    ],
)
def test_embeddings_dimensions_is_refused_where_litellm_leaves_it_out(
    litellm: ModuleType, provider_model: str, refused: bool
) -> None:
    table = SupportTable("provider", None)
    # `encoding_format` is not refused: floats from an adapter that drops it are written in
    # base64 when asked (openai_wire.py; the OpenAI SDKs ask for base64 by default).
    table.check(litellm, "embeddings", {"input": "x", "encoding_format": "base64"}, provider_model)
    asked = {"input": "x", "dimensions": 256}
    if not refused:
        table.check(litellm, "embeddings", asked, provider_model)
        return
    with pytest.raises(HostedError) as refusal:
        table.check(litellm, "embeddings", asked, provider_model)
    assert (refusal.value.status, refusal.value.param) == (400, "dimensions")


# A Bedrock model LiteLLM serves on bedrock-runtime's native Chat Completions, whose
# requests go to Converse when they hold `stop` (LiteLLM's `bedrock_route_for_request`).
_ROUTED = "bedrock/chat_completions/openai.gpt-oss-120b-1:0"


def _sent(litellm: ModuleType, fields: dict[str, Any]) -> dict[str, Any]:
    """What LiteLLM's own mapping keeps of `fields` for `_ROUTED` with drop_params."""
    model, provider, _, _ = litellm.get_llm_provider(_ROUTED)
    kept: dict[str, Any] = litellm.utils.get_optional_params(
        model=model, custom_llm_provider=provider, drop_params=True, messages=[], **fields
    )
    return kept


@pytest.mark.parametrize("first_native", [True, False], ids=["native-first", "converse-first"])
def test_a_bedrock_request_litellm_sends_to_converse_is_held_to_converses_fields(
    litellm: ModuleType, first_native: bool
) -> None:
    native = {"messages": [], "seed": 7}
    converse = {"messages": [], "seed": 7, "stop": ["x"]}
    # LiteLLM's own mapping, which the table must follow: seed kept, seed dropped unsaid
    assert _sent(litellm, {"seed": 7})["seed"] == 7
    assert "seed" not in _sent(litellm, {"seed": 7, "stop": ["x"]})
    table = SupportTable("bedrock", None)
    if first_native:
        table.check(litellm, "chat", native, _ROUTED)
    with pytest.raises(HostedError) as refused:
        table.check(litellm, "chat", converse, _ROUTED)
    assert (refused.value.status, refused.value.param) == (400, "seed")
    table.check(litellm, "chat", native, _ROUTED)  # the native route takes it


def test_stop_is_refused_where_litellm_drops_it_on_every_bedrock_route(
    litellm: ModuleType,
) -> None:
    routed = "bedrock/openai.gpt-5.6"
    model, provider, _, _ = litellm.get_llm_provider(routed)
    bedrock = importlib.import_module("litellm.llms.bedrock.common_utils")
    assert bedrock.bedrock_rejects_stop_sequences(model)  # LiteLLM drops `stop` for it
    kept = litellm.utils.get_optional_params(
        model=model, custom_llm_provider=provider, drop_params=True, messages=[], stop=["x"]
    )
    assert not {"stop", "stopSequences"} & set(kept)  # unsaid, as LiteLLM maps it
    with pytest.raises(HostedError) as refused:
        SupportTable("bedrock", None).check(
            litellm, "chat", {"messages": [], "stop": ["x"]}, routed
        )
    assert (refused.value.status, refused.value.param) == (400, "stop")
