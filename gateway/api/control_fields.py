"""Body fields that are a router's control channel, not the OpenAI API: refused for every
backend.

LiteLLM reads its keyword arguments as where to send a call and with what credentials
(`api_base`, `base_url`, `api_key`, `custom_llm_provider`, `aws_region_name`,
`vertex_location`, ...), as other places to try (`fallbacks`, `model_list`,
`user_config`), as headers to add (`extra_headers`) or as an answer to make up
(`mock_response`). A LiteLLM proxy turns the JSON body of a request into those keyword
arguments, so a private `kind: openai` backend that is such a proxy would send the prompt
wherever the client said, while the gateway's log says the private backend served it.

Private inference servers have such a channel too: in a disaggregated deployment (prefill
and decode on different servers) the router in front sets where the KV cache comes from
(vLLM's `kv_transfer_params`, SGLang's `bootstrap_host`), and a client that set it would
have the backend connect to a host of its choosing and build the answer from a KV cache
read there, not from the prompt the log commits to. Those, and the rest of the inference
servers' own fields no tenant may send, are listed in gateway/api/server_fields.py, which
`refuse_control_fields` calls. So are tools the server would run itself (an `mcp` tool's
`server_url`, a web search: gateway/upstream/client_tools.py), which such a proxy runs too.

The gateway forwards private request bodies byte for byte (it does not rewrite them), so
such a field is refused, not removed: a 400 `invalid_request` naming it, before any
policy decision, for private and hosted backends alike (a hosted call never sent them:
gateway/upstream/openai_request.py allow-lists its fields). The names are matched as the
backend reads them, after JSON unescaping (`"api\\u005fbase"` is `api_base`), and in any
case (`"API_BASE"`: a router written in Go matches names without regard to case).

OpenAI's own request fields are not here, however a router reads them: `metadata` and
`user` are the API's and pass (`user` and `metadata.user_id` as its tenant's own:
gateway/upstream/tenant_ids.py; docs/security.md says what that leaves open). But
`metadata` (in any case) must be an object or null, as OpenAI's API has it: a LiteLLM
proxy decodes a JSON string there as the object (for multipart and `extra_body`
callers), so `"metadata": "{\"user_id\": ...}"` named the end user with a value the
gateway never saw as one (its `user_id` is made the tenant's own only in an object).
Every other
argument LiteLLM reads from a request is: its `completion()` parameters, the names its
proxy refuses in a request body and the arguments its Router reads from a call's keywords
(`timeout`, `specific_deployment`, ...), as tests/unit/test_control_fields.py reads them from
the pinned LiteLLM (a name added by an upgrade fails that test until it is listed here).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from gateway.api.labels import excerpt
from gateway.api.server_fields import COMMON_FIELDS, refuse_server_fields
from gateway.errors import ErrorCode, GatewayError
from gateway.upstream.client_tools import tool_problem

__all__ = ["CONTROL_FIELDS", "CONTROL_PREFIXES", "refuse_control_fields"]

# LiteLLM 1.x `completion()` / Router / proxy arguments that choose a destination, a
# credential, a retry or fallback, extra headers or body, or a made-up answer; none is a
# field of the OpenAI API.
CONTROL_FIELDS: Final = frozenset(
    {
        "api_base",
        "base_url",
        "api_key",
        "api_version",
        "api_type",
        "custom_llm_provider",
        "deployment_id",
        "organization",
        "region_name",
        "model_list",
        "user_config",
        # a LiteLLM proxy's per-request Router settings, merged into the Router's call
        # (`route_request` in its route_llm_request.py): fallbacks to other model groups, a
        # routing strategy, tag routing, a tiny timeout that times out into the fallbacks
        "router_settings_override",
        # logging integrations turned on for the call (LiteLLM's `function_setup` reads them
        # from `completion()`'s keywords; its proxy strips only `callbacks`): the prompt goes
        # to each one's service (Langfuse, S3, ...) with the server's credentials
        "callbacks",
        "success_callback",
        "failure_callback",
        "input_callback",
        "service_callback",
        "fallbacks",
        "context_window_fallbacks",
        "content_policy_fallbacks",
        "num_retries",
        "max_retries",
        "extra_headers",
        "extra_body",
        "extra_query",
        "headers",
        "tags",
        "tenant_id",
        "client_id",
        "client_secret",
        "proxy_server_request",
        "secret_fields",
        # read by LiteLLM 1.x `completion()` too (its main.py's kwargs): TLS checking of
        # the call, a LiteLLM proxy to send it to, headers, an Azure deployment
        "ssl_verify",
        "use_litellm_proxy",
        "use_xai_oauth",
        "provider_specific_header",
        "azure",
        "engine",
        # a prompt other than the client's: a stored prompt, a template, dropped fields
        "prompt_id",
        "prompt_label",
        "prompt_variables",
        "prompt_version",
        "initial_prompt_value",
        "final_prompt_value",
        "roles",
        "bos_token",
        "eos_token",
        "hf_model_name",
        "drop_params",
        "additional_drop_params",
        "allowed_openai_params",
        "model_file_id_mapping",
        "include_server_side_tool_invocations",
        "_skip_mcp_handler",
        # an answer from the router's cache, and the router's own accounting
        "cache",
        "preset_cache_key",
        "base_model",
        "model_info",
        "input_cost_per_token",
        "output_cost_per_token",
        "input_cost_per_second",
        "output_cost_per_second",
        "cost_per_second",
        "rpm",
        "tpm",
        "cooldown_time",
        "retry_strategy",
        # LiteLLM 1.108.7's other `completion()` parameters (`all_litellm_params` in its
        # types/utils.py) that move the call: another model when the prompt is too long,
        # or any model for a name (`context_window_fallback_dict`, `model_alias_map`), a
        # region or a deployment (`data_residency`, `allowed_model_region`, `order`,
        # `weight`, `routing_strategy`, `fastest_response`: every deployment at once),
        # more places to try, a client or session of the caller's, guardrail services
        # that get the prompt, prompt caching (a retention of its own)
        "context_window_fallback_dict",
        "model_alias_map",
        "custom_prompt_dict",
        "data_residency",
        "allowed_model_region",
        "order",
        "weight",
        "routing_strategy",
        "fastest_response",
        "silent_model",
        "tag_regex",
        "enable_tag_filtering",
        "max_fallbacks",
        "fallback_depth",
        "attempted_targets",
        "retry_policy",
        "use_chat_completions_api",
        "use_in_pass_through",
        "allm_passthrough_route",
        "provider_affinity_header",
        "configurable_clientside_auth_params",
        "client",
        "use_client",
        "shared_session",
        "guardrails",
        "enable_prompt_caching",
        "caching",
        "caching_groups",
        "cache_key",
        "ttl",
        # ... and credentials and hosts its proxy refuses in a request body (auth_utils.py,
        # `_BANNED_REQUEST_BODY_PARAMS`): another endpoint for the call, the provider
        # account, TLS, the caller's own provider keys
        "deployment_url",
        "use_ssl",
        "user_provider_credentials",
        "user_api_key_auth_metadata",
        "workspace_id",
        "anthropic-workspace-id",
        "bedrock_tags",
        "fireworks_forward_user_id",
        # ... and the rest of its own: how it calls, logs, budgets and prices the call
        "acompletion",
        "aembedding",
        "atext_completion",
        "aimg_generation",
        "text_completion",
        "async_call",
        "self",
        "id",
        "model_config",
        "verbose",
        "rust",
        "logger_fn",
        "no-log",
        "turn_off_message_logging",
        "log_client_error_tracebacks",
        "complete_response",
        "completion_call_id",
        "stream_response",
        "stream_chunk_size",
        "force_timeout",
        "request_timeout",
        # each attempt's timeout on a LiteLLM proxy's Router: a tiny one times every
        # deployment out, into the fallbacks (as `request_timeout` and `stream_timeout`)
        "timeout",
        "client_side_timeout",
        "keepalive_seconds",
        "allow_client_keepalive_override",
        "max_agentic_loops",
        "max_budget",
        "budget_duration",
        "max_parallel_requests",
        "max_file_size_mb",
        "itpm",
        "otpm",
        "default_api_key_rpm_limit",
        "default_api_key_tpm_limit",
        "merge_reasoning_content_in_choices",
        "ensure_alternating_roles",
        "user_continue_message",
        "assistant_continue_message",
        "supports_system_message",
        "enable_json_schema_validation",
        "disable_add_transform_inline_image_block",
        "search_tool_name",
        "prompt_environment",
        "output_vector_size",
        "tiered_pricing",
        "cost_per_query",
        "citation_cost_per_token",
        "search_context_cost_per_query",
        "google_maps_grounding_cost_per_query",
        # ... and its Router's, read from the same keyword arguments (router.py), which a
        # LiteLLM proxy passes the body as: `specific_deployment` picks deployments by
        # their provider model string across model groups (a group named `openai/gpt-4o`
        # then reaches another group's deployment of that model, in another region),
        # `passthrough_on_no_deployment` calls the provider directly when no deployment
        # matches, the rest its retries, fallbacks, guardrails and logging callbacks
        "specific_deployment",
        "passthrough_on_no_deployment",
        "passthrough",
        "model_id",
        "model_group_retry_policy",
        "fallback_model_group",
        "disable_fallbacks",
        "include_fallback_errors",
        "selected_guardrail",
        "standard_callback_dynamic_params",
        "routing_groups",
        "routing_strategy_args",
        "original_function",
        "original_generic_function",
        "call_type",
        "adapter_id",
    }
)
# Families of the same: LiteLLM's own (`litellm_params`, `litellm_metadata`, ...), made-up
# answers (`mock_response`, `mock_tool_calls`, `mock_testing_fallbacks`, ...), and each
# cloud's location and credentials (`aws_region_name`, `aws_bedrock_runtime_endpoint`,
# `vertex_project`, `vertex_location`, `vertex_credentials`, `azure_...`, `watsonx_...`).
CONTROL_PREFIXES: Final = (
    "litellm_",
    "mock_",
    "aws_",
    "vertex_",
    "vertexai_",
    "azure_",
    "watsonx_",
    "gigachat_",  # `gigachat_auth_url`: where the router sends its GigaChat credentials
    # where it logs the prompt and the answer, with whose keys (LiteLLM's proxy refuses
    # these too: `langfuse_host`, `langsmith_base_url`, `posthog_api_url`, ...)
    "langfuse_",
    "langsmith_",
    "lunary_",
    "humanloop_",
    "braintrust_",
    "arize_",
    "posthog_",
    "signoz_",
    "newrelic_",
    "dd_",
    "wandb_",
    "weave_",
    "slack_",
    "gcs_",
    "s3_",
    # provider endpoints and identities (`sagemaker_base_url`, `nvcf_function_id`,
    # `anthropic_issuer_url`, `token_exchange_endpoint`, `openai_service_account_id`, ...)
    "sagemaker_",
    "nvcf_",
    "agentcore_",
    "anthropic_",
    "openai_",
    "github_copilot_",
    "token_exchange_",
    # routers that pick the model (`auto_router_default_model`, ...) and timeouts
    "auto_router_",
    "complexity_router_",
    "quality_router_",
    "adaptive_router_",
    "stream_timeout",
    "timeout_by_",
    # its prices (the router's accounting: `input_cost_per_token_batches`, ...)
    "input_cost_",
    "output_cost_",
    "cache_creation_input_",
    "cache_read_input_",
    "ocr_cost_",
    "annotation_cost_",
    "regional_",
    # its private state (`_router_weights`, `_litellm_addressed_response_id`, ...); no
    # OpenAI field starts with `_`
    "_",
)

# The prefixes by their first word (up to the first `_`; "" for `_`): a name is compared
# with the few sharing its first word, not with every prefix (a dozen names a request).
_PREFIXES_BY_WORD: Final[Mapping[str, tuple[str, ...]]] = {
    word: tuple(p for p in CONTROL_PREFIXES if p.partition("_")[0] == word)
    for word in {p.partition("_")[0] for p in CONTROL_PREFIXES}
}
assert all(p.find("_") >= 0 for p in CONTROL_PREFIXES)


def _is_control(name: str) -> bool:
    """Whether `name` (case-folded) is a control field or starts with a control prefix."""
    if name in CONTROL_FIELDS:
        return True
    prefixes = _PREFIXES_BY_WORD.get(name.partition("_")[0])
    return prefixes is not None and name.startswith(prefixes)


# The OpenAI API's usual fields pass with one look-up, no case fold or prefix search.
assert not any(_is_control(name) for name in COMMON_FIELDS)


# OpenAI's `metadata`: an object or null only (`_refuse_encoded_metadata`).
_METADATA: Final = "metadata"


def _refuse_encoded_metadata(name: str, value: Any) -> None:
    """400 for a `metadata` that is not an object or null: a LiteLLM proxy decodes a
    string there as its metadata object (and reads its `user_id` as the end user)."""
    if value is None or isinstance(value, dict):
        return
    raise GatewayError(
        ErrorCode.invalid_request,
        f"`{excerpt(name)}` must be an object or null: a router may read a string there as "
        "an object the gateway did not check",
        param=excerpt(name),
    )


# The fields that declare tools (`tool_problem` reads them), as a Go router reads them.
_TOOL_FIELDS: Final = frozenset({"tools", "functions"})


def refuse_control_fields(doc: Mapping[str, Any], body: bytes) -> None:
    """Raise 400 `invalid_request` naming the first top-level control field in `doc`
    (parsed from `body`), then the first field an inference server reads past the token
    bound, the configured weights or its own code and files
    (gateway/api/server_fields.py), then the first tool the client would not run
    (gateway/upstream/client_tools.py).

    A name matches in any case (`"FALLBACKS"`, `"Api_Ba\\u017fe"`): a router written in Go
    (encoding/json and its look-alikes match names without regard to case, folding
    U+017F and U+212A to `s` and `k`) reads it as the field, and a `kind: openai`
    backend may be such a router."""
    tools = "tools" in doc  # or a name that folds to `tools` or `functions`, below
    for name in doc:
        if len(name) == len(_METADATA) and name.casefold() == _METADATA:
            _refuse_encoded_metadata(name, doc[name])
        if name in COMMON_FIELDS:  # most names: lower case already, and none a control field
            continue
        folded = name if name.isascii() and name.islower() else name.casefold()
        if _is_control(folded):
            name = excerpt(name)  # a prefix matches a name of any length and characters
            raise GatewayError(
                ErrorCode.invalid_request,
                f"`{name}` is not an OpenAI request field: the gateway decides where a "
                "request goes, with which credentials, and what answers it",
                param=name,
            )
        tools = tools or folded in _TOOL_FIELDS
    refuse_server_fields(doc, body)
    found = tool_problem(doc) if tools else None  # a usual body: no call
    if found is not None:
        param, why = found
        raise GatewayError(
            ErrorCode.invalid_request,
            f"`{param}` is not accepted: {why} (docs/security.md)",
            param=param,
        )
