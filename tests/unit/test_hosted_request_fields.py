"""What of a client's request reaches LiteLLM for a hosted provider (gateway/upstream/
openai_request.py `request_params`): the allow-list, checked without LiteLLM or a network."""

from __future__ import annotations

import pytest

from gateway.upstream.hosted_fields import RefusedField
from gateway.upstream.invalid_field import InvalidField
from gateway.upstream.openai_request import request_params

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("store", [True, False])
def test_a_client_cannot_ask_the_provider_to_store_the_request(store: bool) -> None:
    # `store: true` makes OpenAI (and Azure OpenAI) keep the prompt and the answer as a
    # stored completion, listed and read back with the gateway's provider key: longer
    # than the retention the policy checked against the backend's declaration.
    params, ignored = request_params("chat", {"model": "m", "messages": MESSAGES, "store": store})
    assert "store" not in params
    assert ignored == ("store",)


@pytest.mark.parametrize(
    "field",
    [
        "api_base",
        "base_url",
        "api_key",
        "custom_llm_provider",
        "model_list",
        "fallbacks",
        "mock_response",
        "extra_headers",
        "extra_body",
        "metadata",
        "litellm_params",
        "headers",
    ],
)
@pytest.mark.parametrize("endpoint", ["chat", "completions", "embeddings"])
def test_routing_fields_never_become_litellm_arguments(endpoint: str, field: str) -> None:
    doc = {"model": "m", "messages": MESSAGES, "prompt": "hi", "input": "hi", field: "x"}
    params, ignored = request_params(endpoint, doc)  # type: ignore[arg-type]
    assert field not in params and field in ignored
    assert "model" not in params  # the gateway sets it: the backend's provider_model


@pytest.mark.parametrize(
    ("endpoint", "required"),
    [("chat", "messages"), ("completions", "prompt"), ("embeddings", "input")],
)
@pytest.mark.parametrize("value", ["absent", None])
def test_a_missing_required_field_is_the_clients_error(
    endpoint: str, required: str, value: object
) -> None:
    # LiteLLM calls a text completion without `prompt` and fails on its own
    # (APIConnectionError): that read as the provider failing (503, the next backend
    # tried). The field is the client's to send: a 400 naming it, nothing sent.
    doc: dict[str, object] = {"model": "m", "messages": MESSAGES, "prompt": "hi", "input": "hi"}
    if value == "absent":
        del doc[required]
    else:
        doc[required] = None
    with pytest.raises(InvalidField) as refused:
        request_params(endpoint, doc)  # type: ignore[arg-type]  # a str, not the Literal
    assert refused.value.param == required


@pytest.mark.parametrize("entry", ["function_x", 1, ["a"], None])
def test_a_legacy_function_that_is_not_an_object_is_the_clients_error(entry: object) -> None:
    # LiteLLM's Gemini adapter raised TypeError on such an entry (`"function" in tool`
    # is a substring test on a string): a provider failure to the gateway, counted on
    # the hosted backend's breaker that every tenant shares.
    doc = {"model": "m", "messages": MESSAGES, "functions": [{"name": "f"}, entry]}
    with pytest.raises(InvalidField) as refused:
        request_params("chat", doc)
    assert refused.value.param == "functions[1]"


@pytest.mark.parametrize("stream", [True, False])
def test_only_include_usage_of_stream_options_is_sent(stream: bool) -> None:
    # LiteLLM took the client's `stream_options` whole: `{"x": 1, "include_obfuscation":
    # true}` reached the provider. Unknown keys are left out and named, as top-level ones.
    options = {"include_usage": False, "x": 1, "include_obfuscation": True, "api_base": "u"}
    doc = {"model": "m", "messages": MESSAGES, "stream": stream, "stream_options": options}
    params, ignored = request_params("chat", doc)
    assert params.get("stream_options") == ({"include_usage": True} if stream else None)
    assert ignored == (
        "stream_options.api_base",
        "stream_options.include_obfuscation",
        "stream_options.x",
    )


@pytest.mark.parametrize(
    ("n", "stream", "refused"),
    [(2, True, True), (8, True, True), (1, True, False), (None, True, False), (2, False, False)],
)
@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_a_stream_of_several_choices_is_the_clients_error(
    endpoint: str, n: int | None, stream: bool, refused: bool
) -> None:
    # LiteLLM relays a stream of several choices with one finish reason (on index 0): a
    # choice cut short was relayed, `[DONE]` and all, as finished (tests/integration/
    # test_hosted_stream_choices.py). Whole answers of several choices pass.
    doc = {"model": "m", "messages": MESSAGES, "prompt": "hi", "n": n, "stream": stream}
    if not refused:
        params, _ = request_params(endpoint, doc)  # type: ignore[arg-type]
        assert params.get("n") == n and params.get("stream") is (stream or None)
        return
    with pytest.raises(InvalidField) as error:
        request_params(endpoint, doc)  # type: ignore[arg-type]
    assert error.value.param == "n"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("guided_json", {"type": "object"}),
        ("guided_regex", "[0-9]+"),
        ("guided_choice", ["yes", "no"]),
        ("guided_grammar", "root ::= 'a'"),
        ("guided_decoding_backend", "xgrammar"),
        ("structured_outputs", {"json": {"type": "object"}}),
        ("regex", "[0-9]+"),
        ("json_schema", {"type": "object"}),
        ("ebnf", "root ::= 'a'"),
        ("grammar", "root ::= 'a'"),
        ("top_k", 3),
        ("min_p", 0.1),
        ("repetition_penalty", 1.2),
        ("min_tokens", 16),
        ("stop_token_ids", [2]),
        ("ignore_eos", True),
    ],
)
@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_a_server_field_that_constrains_the_answer_is_refused_not_left_out(
    endpoint: str, field: str, value: object
) -> None:
    # A private backend honours these; LiteLLM is never given them, so a client failed
    # over with `guided_json` got unconstrained text and a 200. The refusal names the
    # field from the gateway's own list (never the client's other field names).
    doc = {"model": "m", "messages": MESSAGES, "prompt": "hi", "decoy_x": 1, field: value}
    with pytest.raises(RefusedField) as refused:
        request_params(endpoint, doc)  # type: ignore[arg-type]
    assert refused.value.param == field
    assert "decoy_x" not in str(refused.value)


def test_a_null_server_field_and_an_embeddings_one_are_left_out() -> None:
    doc = {"model": "m", "messages": MESSAGES, "top_k": None, "grammar": None, "decoy_x": 1}
    params, ignored = request_params("chat", doc)
    assert ignored == ("decoy_x", "grammar", "top_k") and "top_k" not in params
    embed = {"model": "m", "input": "hi", "top_k": 3}
    params, ignored = request_params("embeddings", embed)
    assert ignored == ("top_k",) and "top_k" not in params


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("top_k", -1),
        ("top_k", 0),
        ("min_p", 0.0),
        ("repetition_penalty", 1.0),
        ("repeat_penalty", 1),
        ("ignore_eos", False),
        ("min_tokens", 0),
        ("stop_token_ids", []),
        ("use_beam_search", False),
    ],
)
def test_a_server_field_at_a_value_that_asks_for_nothing_is_left_out(
    field: str, value: object
) -> None:
    # A client library that always sends its sampler defaults is served on failover: the
    # sampler switched off is what a hosted provider does anyway.
    params, ignored = request_params("chat", {"model": "m", "messages": MESSAGES, field: value})
    assert ignored == (field,) and field not in params


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("top_k", 40),
        ("top_k", True),
        ("min_p", 0.05),
        ("ignore_eos", True),
        ("ignore_eos", 0),
        ("repetition_penalty", 1.1),
        ("stop_token_ids", [2]),
    ],
)
def test_a_server_field_near_a_value_that_asks_for_nothing_is_refused(
    field: str, value: object
) -> None:
    with pytest.raises(RefusedField):
        request_params("chat", {"model": "m", "messages": MESSAGES, field: value})
