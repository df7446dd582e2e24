"""Request fields a hosted provider would not be sent: refused, unless they ask for nothing.

gateway/upstream/openai_request.py sends a hosted provider only the OpenAI API's
documented fields of the endpoint (its allowlist: LiteLLM's keyword arguments are also
its control channel). A field outside it was left out of the call without a word, its
name computed (`ignored_fields`) and never read: a client that asked, or a private
backend's client failed over, for `return_token_ids`, `chat_template_kwargs`, vLLM's
`continuous_usage_stats` or a field of another endpoint (`dimensions` on a chat) got an
answer made without it, and a 200 the completion record committed to. Such a field is
now refused as a field the provider's adapter would drop is (gateway/upstream/
hosted_support.py): `RefusedField`, 400 `upstream_bad_request` naming it, nothing sent.
An inference server's own field that constrains or changes the answer (`ANSWER_FIELDS`)
is refused first, with its own reason.

Left out unsaid, as before: a null value; a value that asks for nothing a hosted provider
does not do anyway (`_ASKS_NOTHING`: a sampler switched off, `store: false`, vLLM's
defaults a client library sends); `LEFT_OUT` (`metadata`, whose loss leaves the answer as
asked); `stream_options.include_obfuscation` (padding).

A refusal names the field when its name is one the gateway knows (`KNOWN_FIELDS`: the
OpenAI API's fields of every endpoint, these lists, and every field
gateway/api/passed_fields.py passes to a private backend, which
tests/unit/test_hosted_request_fields.py checks are all here); any other name is the
client's own text, never repeated in an error or a log (docs/security.md): its place in
the body names it (`(key 3)`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from gateway.upstream.hosted_fields import RefusedField

__all__ = ["ANSWER_FIELDS", "KNOWN_FIELDS", "LEFT_OUT", "SERVER_FIELDS_UNSENT", "refuse_unsent"]

# The keys of `stream_options` sent on (OpenAI's API reference). The gateway always sets
# `include_usage` (it accounts for tokens; `encode_chunk` keeps the usage chunk from a client
# that did not ask). OpenAI's `include_obfuscation` only pads the chunks LiteLLM re-encodes
# anyway: left out. Any other key (vLLM's `continuous_usage_stats`) is refused as a
# top-level field outside the allowlist is, as `stream_options.<key>`, unless null or
# false: the object would reach LiteLLM's own keyword arguments.
_STREAM_OPTIONS: Final = frozenset({"include_usage"})
_STREAM_LEFT_OUT: Final = frozenset({"include_obfuscation"})
# Fields outside the allowlist whose loss leaves the answer as asked, left out unsaid (as
# hosted_support.py's `ADVISORY`): OpenAI's `metadata` tags a stored completion, which a
# hosted call never makes (`store: true` is refused), and LiteLLM would read it as its own.
# None is an inference server's field (tests/unit/test_hosted_request_fields.py checks it
# against gateway/api/passed_fields.py).
LEFT_OUT: Final = frozenset({"metadata"})
_UNSENT_WHY: Final = (
    "it is not a field of this endpoint that a hosted provider is sent (the provider would "
    "answer without it)"
)
# Fields of vLLM's, SGLang's and llama.cpp's own request APIs (no OpenAI field) that
# constrain or change a generated answer: structured output and sampling. A private backend
# gets them byte for byte and honours them; LiteLLM would not be given them (they are not
# in the allowlist), so a client failed over with `guided_json` got unconstrained text, and
# a 200. Refused for chat and completions when not null (`RefusedField`: 400, not sent);
# other fields outside the allowlist are refused after them (`refuse_unsent`).
ANSWER_FIELDS: Final = frozenset(
    {
        # structured output: vLLM (guided_* before 0.11, then structured_outputs),
        # SGLang, llama.cpp
        "guided_json",
        "guided_regex",
        "guided_choice",
        "guided_grammar",
        "guided_decoding_backend",
        "guided_whitespace_pattern",
        "structured_outputs",
        "regex",
        "json_schema",
        "ebnf",
        "grammar",
        # sampling: vLLM's SamplingParams, SGLang's sampling_params, llama.cpp's server
        "top_k",
        "min_p",
        "typical_p",
        "top_n_sigma",
        "repetition_penalty",
        "repeat_penalty",
        "repeat_last_n",
        "length_penalty",
        "use_beam_search",
        "allowed_token_ids",
        "bad_words",
        "mirostat",
        "mirostat_tau",
        "mirostat_eta",
        "dynatemp_range",
        "dynatemp_exponent",
        "dry_multiplier",
        "dry_base",
        "dry_allowed_length",
        "dry_penalty_last_n",
        "dry_sequence_breakers",
        "xtc_probability",
        "xtc_threshold",
        "samplers",
        # stopping and length
        "min_tokens",
        "n_predict",
        "stop_token_ids",
        "stop_regex",
        "ignore_eos",
        "include_stop_str_in_output",
        "no_stop_trim",
    }
)
# Values of those fields that ask for nothing a hosted provider does not do anyway (the
# sampler or limit switched off, an empty list): left out as before, not refused, so a
# client library that always sends its defaults is still served on failover. A bool is
# never read as 0 or 1.
_ASKS_NOTHING: Final[dict[str, tuple[object, ...]]] = {
    "top_k": (-1, 0),
    "min_p": (0,),
    "typical_p": (1,),
    "repetition_penalty": (1,),
    "repeat_penalty": (1,),
    "length_penalty": (1,),
    "use_beam_search": (False,),
    "min_tokens": (0,),
    "n_predict": (-1,),
    "ignore_eos": (False,),
    "include_stop_str_in_output": (False,),
    "no_stop_trim": (False,),
    "mirostat": (0,),
    "dynatemp_range": (0,),
    "dry_multiplier": (0,),
    "xtc_probability": (0,),
    "stop_token_ids": ([],),
    "allowed_token_ids": ([],),
    "bad_words": ([],),
    # the OpenAI API's and the servers' other fields at their defaults
    "store": (False,),
    "prompt_cache_retention": ("in_memory",),
    "echo": (False,),
    "skip_special_tokens": (True,),
    "spaces_between_special_tokens": (True,),
    "add_generation_prompt": (True,),
    "continue_final_message": (False,),
    "add_special_tokens": (False,),
    "return_token_ids": (False,),
    "return_tokens_as_token_ids": (False,),
}
_ANSWER_WHY: Final = (
    "an inference server's own field that constrains or changes the answer, which a hosted "
    "provider is not given (it would answer without it)"
)
# The inference servers' other fields (vLLM's, SGLang's) a private backend is passed
# (gateway/api/passed_fields.py): a hosted provider is sent none of them, so each is refused
# unless it asks for nothing, and named in the refusal. A field passed_fields.py adds fails
# tests/unit/test_hosted_request_fields.py until it is listed here (or in `ANSWER_FIELDS`).
SERVER_FIELDS_UNSENT: Final = frozenset(
    {
        # the prompt, from the body's bytes
        "add_generation_prompt",
        "add_special_tokens",
        "chat_template_kwargs",
        "continue_final_message",
        "documents",
        "embed_override_token_id",
        "embed_overrides",
        "input_ids",
        "task",
        "truncate_prompt_tokens",
        "truncation_side",
        # sampling, reasoning and streaming
        "include_reasoning",
        "repetition_detection",
        "separate_reasoning",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "stream_interval",
        "stream_reasoning",
        "thinking",
        "thinking_token_budget",
        "watermark",
        "watermarking",
        # more of the answer
        "embed_dtype",
        "endianness",
        "logprob_token_ids",
        "mm_payload",
        "prompt_logprobs",
        "return_flat_raw_output_top_logprobs",
        "return_flat_raw_top_logprobs_b64",
        "return_hidden_states",
        "return_input_ids_in_sglext",
        "return_mm_kwargs",
        "return_output_ids_in_sglext",
        "return_prompt_text",
        "return_prompt_token_ids",
        "return_routed_experts",
        "return_sampling_mask",
        "return_token_ids",
        "return_token_offsets",
        "return_tokens_as_token_ids",
        "return_weight_versions",
        "routed_experts_prompt_start",
        "routed_experts_start_len",
        "sampling_logprobs_mode",
        "use_activation",
        # the prefix cache's partition
        "cache_salt",
    }
)
# The keys of `stream_options` the servers read besides OpenAI's, named in a refusal.
_SERVER_STREAM_OPTIONS: Final = frozenset({"continuous_usage_stats"})
# The names a refusal may repeat (see the module's notes); with the allowlists'
# (`refuse_unsent`'s `known`).
KNOWN_FIELDS: Final = ANSWER_FIELDS | SERVER_FIELDS_UNSENT | LEFT_OUT | frozenset(_ASKS_NOTHING)


def refuse_unsent(
    endpoint: str, doc: Mapping[str, Any], sent: frozenset[str], known: frozenset[str]
) -> None:
    """`RefusedField` for the first field of `doc` (or key of its `stream_options`) that
    is not among those `sent` and asks for something (see the module's notes); `known`:
    the OpenAI field names a refusal may repeat besides `KNOWN_FIELDS`."""
    outside = [k for k in doc if k not in sent]
    if endpoint != "embeddings":
        for name in sorted(ANSWER_FIELDS.intersection(outside)):
            if not _left_out(name, doc[name]):
                raise RefusedField(name, _ANSWER_WHY)
    for place, name in enumerate(doc):
        if name in outside and not _left_out(name, doc[name]):
            raise RefusedField(_named(name, place, known | KNOWN_FIELDS), _UNSENT_WHY)
    options = doc.get("stream_options")
    for place, (key, value) in enumerate(options.items() if isinstance(options, dict) else ()):
        if key in _STREAM_OPTIONS or key in _STREAM_LEFT_OUT or value is None or value is False:
            continue
        raise RefusedField(
            f"stream_options.{_named(key, place, _SERVER_STREAM_OPTIONS)}", _UNSENT_WHY
        )


def _left_out(name: str, value: object) -> bool:
    """Whether the unsent field `name` may be left out unsaid: null, `LEFT_OUT`, or a
    value that asks for nothing."""
    return value is None or name in LEFT_OUT or _asks_nothing(name, value)


def _named(name: str, place: int, known: frozenset[str]) -> str:
    """`name` where it is one the gateway `known`s, else its place among its object's keys
    (1 for the first)."""
    return name if name in known else f"(key {place + 1})"


def _asks_nothing(name: str, value: object) -> bool:
    """Whether `value` of the server field `name` only restates what a hosted provider does."""
    return any(
        isinstance(value, bool) is isinstance(off, bool) and value == off
        for off in _ASKS_NOTHING.get(name, ())
    )
