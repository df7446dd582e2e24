"""Body fields of the inference servers' own APIs that the gateway passes to a private
backend, each with why it keeps the gateway's promises.

A private body goes to the backend byte for byte, and a field no check refuses passes.
gateway/api/server_fields.py refuses the fields that break a promise; this is the other
half of the classification: every top-level field of vLLM's and SGLang's chat,
completion and embeddings request models, at the releases
tests/vectors/server_fields/README.md names, is the OpenAI API's own (`COMMON_FIELDS`,
`OPENAI_FIELDS`), refused there (or by gateway/api/control_fields.py), or listed here
(tests/unit/test_server_field_drift.py checks it, so a field a new release adds fails
that test until someone reads what the server does with it). Nothing here is read at run
time: a field's entry is a decision, with its reason. A hosted provider is sent none of
these but the OpenAI API's own: gateway/upstream/unsent_fields.py refuses each that asks
for something, by name (tests/unit/test_hosted_request_fields.py fails for an entry added
here that is not listed there).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

__all__ = ["OPENAI_FIELDS", "PASSED_FIELDS"]

# The OpenAI API's own request fields beyond the usual ones (`COMMON_FIELDS`) that these
# servers declare: legacy completions' (gateway/upstream/openai_request.py lists the API).
OPENAI_FIELDS: Final = frozenset({"best_of", "echo", "suffix"})

_SAMPLING: Final = (
    "tunes how the client's own answer is sampled or stopped, within its limits (the "
    "bound counts `min_tokens`; grammar compilation cost is not covered: docs/security.md)"
)
_PROMPT: Final = (
    "shapes the prompt from the body's own bytes, which the token bound counts (the "
    "template's own arguments inside `chat_template_kwargs` are refused)"
)
_ANSWER: Final = (
    "adds to the client's own answer (token ids, offsets, logprobs, hidden states, the "
    "rendered prompt), which `limits.max_response_bytes` bounds"
)
_SALT: Final = (
    "partitions the server's prefix cache within the tenant's own: with "
    "`isolate_prefix_cache` the gateway mixes the tenant's salt in (docs/security.md)"
)

PASSED_FIELDS: Final[Mapping[str, str]] = {
    # sampling and stopping (vLLM's SamplingParams, SGLang's sampling_params)
    **dict.fromkeys(
        (
            "top_k",
            "min_p",
            "min_tokens",
            "repetition_penalty",
            "length_penalty",
            "use_beam_search",
            "allowed_token_ids",
            "bad_words",
            "stop_token_ids",
            "stop_regex",
            "no_stop_trim",
            "ignore_eos",
            "include_stop_str_in_output",
            "skip_special_tokens",
            "spaces_between_special_tokens",
            "structured_outputs",
            "regex",
            "ebnf",
            "json_schema",
            "repetition_detection",
            "thinking_token_budget",
            "include_reasoning",
            "separate_reasoning",
            "stream_reasoning",
            "thinking",
            "stream_interval",  # tokens per streamed chunk, clamped up to the server's
            # a watermark in the client's own output, under the client's own key
            "watermark",
            "watermarking",
        ),
        _SAMPLING,
    ),
    # the prompt, from the body's bytes
    **dict.fromkeys(
        (
            "add_generation_prompt",
            "continue_final_message",
            "add_special_tokens",
            "chat_template_kwargs",
            "documents",
            "truncate_prompt_tokens",
            "truncation_side",
            # SGLang: prompt token ids in place of the rendered messages (at least two
            # bytes each), DeepSeek-V4's task token, and embedding vectors the body
            # carries for placeholder tokens (JSON numbers, nothing deserialized)
            "input_ids",
            "task",
            "embed_override_token_id",
            "embed_overrides",
        ),
        _PROMPT,
    ),
    # more of the client's own answer
    **dict.fromkeys(
        (
            "logprob_token_ids",
            "prompt_logprobs",
            "sampling_logprobs_mode",
            "return_token_ids",
            "return_tokens_as_token_ids",
            "return_prompt_token_ids",
            "return_input_ids_in_sglext",
            "return_output_ids_in_sglext",
            "return_prompt_text",
            "return_token_offsets",
            "return_weight_versions",
            "return_hidden_states",
            "return_routed_experts",
            "routed_experts_start_len",
            "routed_experts_prompt_start",
            "return_sampling_mask",  # SGLang: only with `return_meta_info`, refused
            "return_flat_raw_output_top_logprobs",
            "return_flat_raw_top_logprobs_b64",
            "mm_payload",  # vLLM: its render endpoint's output; its strings are held to
            # the backend's `media_urls` as a content part's are (private_media.py)
            "return_mm_kwargs",
            "embed_dtype",  # vLLM embeddings: the float type a base64 answer packs
            "endianness",
            "use_activation",
        ),
        _ANSWER,
    ),
    "cache_salt": _SALT,
}
