"""What of a client's request reaches LiteLLM for a hosted provider (gateway/upstream/
openai_request.py `request_params`): the allow-list, checked without LiteLLM or a network."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from gateway.api.passed_fields import OPENAI_FIELDS, PASSED_FIELDS
from gateway.upstream.hosted_errors import HostedError
from gateway.upstream.hosted_fields import RefusedField
from gateway.upstream.hosted_prepare import prepare_request
from gateway.upstream.invalid_field import InvalidField
from gateway.upstream.openai_request import forwarded_fields, request_params
from gateway.upstream.unsent_fields import ANSWER_FIELDS, LEFT_OUT, SERVER_FIELDS_UNSENT

MESSAGES = [{"role": "user", "content": "hi"}]
# Each endpoint's required field: a document of one endpoint holds no other's.
REQUIRED: dict[str, dict[str, object]] = {
    "chat": {"messages": MESSAGES},
    "completions": {"prompt": "hi"},
    "embeddings": {"input": "hi"},
}


def ask(endpoint: str, **fields: object) -> dict[str, object]:
    return {"model": "m", **REQUIRED[endpoint], **fields}


@pytest.mark.parametrize("store", [False, None])
def test_a_client_cannot_ask_the_provider_to_store_the_request(store: bool) -> None:
    # `store: true` makes OpenAI (and Azure OpenAI) keep the prompt and the answer as a
    # stored completion, listed and read back with the gateway's provider key: longer
    # than the retention the policy checked against the backend's declaration.
    # (`store: true` is refused before this, gateway/upstream/hosted_fields.py.)
    params = request_params("chat", {"model": "m", "messages": MESSAGES, "store": store})
    assert "store" not in params


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
        "litellm_params",
        "headers",
    ],
)
@pytest.mark.parametrize("endpoint", ["chat", "completions", "embeddings"])
def test_routing_fields_never_become_litellm_arguments(endpoint: str, field: str) -> None:
    # Refused (gateway/api/control_fields.py refuses most before a backend is chosen).
    doc = ask(endpoint, **{field: "x"})
    with pytest.raises(RefusedField) as refused:
        request_params(endpoint, doc)  # type: ignore[arg-type]
    assert refused.value.param == "(key 3)"  # not a name the gateway repeats


@pytest.mark.parametrize("endpoint", ["chat", "completions", "embeddings"])
def test_metadata_is_left_out_unsaid(endpoint: str) -> None:
    # OpenAI's `metadata` tags a stored completion, which a hosted call never makes;
    # LiteLLM would read it as its own. An SDK that always sends it is served.
    doc = ask(endpoint, metadata={})
    params = request_params(endpoint, doc)  # type: ignore[arg-type]
    assert "metadata" not in params
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
    # true}` reached the provider. `include_obfuscation` (padding) and keys that ask for
    # nothing are left out; any other key is refused, named as top-level ones are.
    options = {"include_usage": False, "include_obfuscation": True, "x": None, "y": False}
    doc = {"model": "m", "messages": MESSAGES, "stream": stream, "stream_options": options}
    params = request_params("chat", doc)
    assert params.get("stream_options") == ({"include_usage": True} if stream else None)
    for key, named in (("api_base", "(key 5)"), ("continuous_usage_stats", None)):
        asking = {**doc, "stream_options": {**options, key: True}}
        with pytest.raises(RefusedField) as refused:
            request_params("chat", asking)
        assert refused.value.param == f"stream_options.{named or key}"


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
    doc = ask(endpoint, n=n, stream=stream)
    if not refused:
        params = request_params(endpoint, doc)  # type: ignore[arg-type]
        assert params.get("n") == n and params.get("stream") is (stream or None)
        return
    with pytest.raises(InvalidField) as error:
        request_params(endpoint, doc)  # type: ignore[arg-type]
    assert error.value.param == "n"


@pytest.mark.parametrize("n", [0, -1, -(2**63)])
@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_fewer_than_one_choice_is_the_clients_error(endpoint: str, n: int, stream: bool) -> None:
    # The gateway counts a whole answer's choices against `n` (hosted_finish.py
    # `short_of`): a provider that answered `n: 0` with its one choice (as Gemini's
    # candidateCount reads 0 as unset) was a 502 `upstream_error` blamed on it, its
    # breaker charged and the next backend called, for the client's malformed `n`.
    with pytest.raises(InvalidField) as error:
        request_params(endpoint, ask(endpoint, n=n, stream=stream))  # type: ignore[arg-type]
    assert error.value.param == "n"
    assert request_params(endpoint, ask(endpoint, n=1, stream=stream))["n"] == 1  # type: ignore[arg-type]


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
    doc = ask(endpoint, decoy_x=1, **{field: value})
    with pytest.raises(RefusedField) as refused:
        request_params(endpoint, doc)  # type: ignore[arg-type]
    assert refused.value.param == field
    assert "decoy_x" not in str(refused.value)


def test_a_null_field_is_left_out_and_an_embeddings_server_field_refused() -> None:
    doc = {"model": "m", "messages": MESSAGES, "top_k": None, "grammar": None, "decoy_x": None}
    params = request_params("chat", doc)
    assert not {"top_k", "grammar", "decoy_x"} & params.keys()
    embed = {"model": "m", "input": "hi", "top_k": 3}
    with pytest.raises(RefusedField, match="not a field of this endpoint") as refused:
        request_params("embeddings", embed)
    assert refused.value.param == "top_k"


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
    params = request_params("chat", {"model": "m", "messages": MESSAGES, field: value})
    assert field not in params


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


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("return_token_ids", True),
        ("chat_template_kwargs", {"enable_thinking": False}),
        ("skip_special_tokens", False),
        ("echo", True),
        ("store", "yes"),
        ("dimensions", 8),  # an embeddings field, on a chat
    ],
)
@pytest.mark.parametrize("endpoint", ["chat", "embeddings"])
def test_a_field_a_hosted_provider_is_not_sent_is_refused_not_left_out(
    endpoint: str, field: str, value: object
) -> None:
    # It was left out unsaid (`ignored_fields`, which nothing read): the client got an
    # answer made without it, and a 200. Refused as a field the adapter would drop is.
    doc = ask(endpoint, **{field: value})
    if field in forwarded_fields(endpoint):  # type: ignore[arg-type]
        return  # `dimensions` on embeddings: sent
    with pytest.raises(RefusedField) as refused:
        request_params(endpoint, doc)  # type: ignore[arg-type]
    assert refused.value.param == field


@pytest.mark.parametrize(
    "name", ["decoy_x", "a b", "x" * 65, "caf\u00e9", "ok\u202ename", "", "CANARY_field"]
)
def test_a_field_the_gateway_does_not_know_is_named_by_its_place(name: str) -> None:
    # The name is the client's own text: never repeated in an error or a log.
    doc = {"model": "m", "messages": MESSAGES, name: 1}
    with pytest.raises(RefusedField) as refused:
        request_params("chat", doc)
    assert refused.value.param == "(key 3)"
    assert name not in str(refused.value) or not name
    options = {"include_usage": True, name: 1}
    with pytest.raises(RefusedField) as refused:
        request_params("chat", {"model": "m", "messages": MESSAGES, "stream_options": options})
    assert refused.value.param == "stream_options.(key 2)"


@pytest.mark.parametrize("endpoint", ["chat", "completions", "embeddings"])
@pytest.mark.parametrize("field", sorted({*PASSED_FIELDS, *OPENAI_FIELDS}))
def test_no_field_a_private_backend_is_passed_is_left_out_unsaid_for_a_hosted_one(
    endpoint: str, field: str
) -> None:
    # Every field gateway/api/passed_fields.py passes to a private backend (the servers'
    # own, the OpenAI API's legacy ones) is sent to a hosted provider (the allowlist) or
    # refused when it asks for something: never left out while the answer is made
    # without it. A field added there is checked here without a change to this test.
    asking = ask(endpoint, **{field: "CANARY-value"})
    if field in forwarded_fields(endpoint):  # type: ignore[arg-type]
        return  # sent (its JSON type is checked: a string may be refused as invalid)
    with pytest.raises(RefusedField) as refused:
        request_params(endpoint, asking)  # type: ignore[arg-type]
    assert refused.value.param == field  # named: the gateway knows it
    assert "CANARY" not in str(refused.value)
    assert field not in LEFT_OUT
    assert field in ANSWER_FIELDS | SERVER_FIELDS_UNSENT or field in OPENAI_FIELDS


def test_sagemaker_embeddings_are_refused_for_botocore_s_retries() -> None:
    """The refusal (`BOTO3_ROUTES`) said boto3 went past the gateway's proxy, trust and
    answer bounds: those are forced now (`install_botocore_rules`). What remains, and
    what the client reads, is that botocore sends the prompt again on retries of its own."""
    with pytest.raises(HostedError) as refused:  # refused before any lookup or LiteLLM
        asyncio.run(
            prepare_request(
                "embeddings",
                ask("embeddings"),
                "sagemaker/my-endpoint",
                provider="aws",
                resolve=cast(Any, None),
                support=cast(Any, None),
            )
        )
    assert (refused.value.status, refused.value.param) == (400, "model")
    said = refused.value.public
    assert "retries" in said and "outside the gateway's attempts" in said, said
    assert "proxy" not in said and "trust" not in said, said
