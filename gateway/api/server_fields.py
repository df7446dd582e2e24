"""Body fields of the inference servers' own APIs that no tenant may send: refused for
every backend.

vLLM, SGLang and llama.cpp read fields beyond OpenAI's (their request models and
llama.cpp's `params_from_json_cmpl`). Most tune sampling and are bounded by the request's
own bytes and limits (gateway/api/usage_bound.py counts `n_predict`, `n_cmpl`,
`min_tokens` there). These are not, and the gateway forwards private bodies byte for byte,
so it refuses them with a 400 `invalid_request` naming the field, before any policy
decision, as it refuses a router's control fields (gateway/api/control_fields.py):

- **a prompt the body does not bound**: the server builds more prompt tokens than the
  request has bytes, past the bound the tenant's token budget is charged (a client's
  `chat_template` is a Jinja program: a loop repeats the messages a thousand times;
  `chat_template_kwargs` overriding the renderer's own arguments: `chat_template`,
  `tokenize`, `padding` to a `max_length`; per-request media processing that turns one
  image into more tokens than `MEDIA_ALLOWANCE`: vLLM's `mm_processor_kwargs` and
  `media_io_kwargs` (every frame of a video); vLLM's `padding` on an embeddings request,
  `max_length` padding its prompt to the model's whole length; SGLang's
  `images_config`, `max_dynamic_patch`, `video_config`, `use_audio_in_video`; an SGLang
  session that prepends earlier requests' context, another tenant's included);
- **other weights**: a LoRA adapter chosen in the body (llama.cpp's `lora`, SGLang's
  `lora_path`, or SGLang's `extra_key` spelling an adapter's id in its prefix cache)
  serves the request with weights the log does not name: the model is the `model`
  field's, as configured;
- **the server's code, files or network**: vLLM's `prompt_embeds` and content parts of
  type `image_embeds` / `audio_embeds` (serialized tensors the server deserializes:
  GHSA-mrw7-hf4f-83pf, GHSA-pmqf-x6x8-p7qw), `logits_processors` (classes imported by
  name), `kv_transfer_params` and SGLang's `bootstrap_host` (hosts the server connects
  to for KV cache), vLLM's `ec_transfer_params` (the host, port and memory address it
  fetches an image's encoder output from), SGLang's `custom_logit_processor`
  (serialized Python), fields naming a path or file (`*_path`: `lora_path`, a fork's
  `save_kvcache_path`);
- **another request's place on the server**: client-chosen request ids (`request_id`,
  SGLang's `rid`: a duplicate collides with another tenant's request), scheduling
  (`priority`, a data-parallel rank, llama.cpp's `id_slot`), which would let one tenant
  take a backend away from the others (docs/security.md), and NVIDIA Dynamo's request
  envelope (`nvext`: the worker, its rank, the queue priority, and the prefix-cache
  `cache_salt`, which Dynamo reads over the top-level one `isolate_prefix_cache` sets);
- **the server's metrics**: SGLang's `custom_labels`, client strings as metric labels;
- **what the server's shared caches held**: SGLang's `return_cached_tokens_details`,
  `return_spec_tokens_details`, `return_meta_info` (cached prompt tokens, accepted
  speculative drafts: what another tenant sent) and `ngram_corpus_id`;
- **another tenant's media**: vLLM's `uuid` on a content part names the media item in
  the server's multimodal caches in place of its content's hash, and with the media left
  out (`"image_url": null`) has the server take the item from its cache by that name
  alone. The caches serve every tenant: a tenant naming another's id is answered about
  that tenant's image (which its request does not carry: no log commits to it), and one
  that sends its own image under an id another tenant uses has that tenant answered
  about it.

Names are matched as the backend reads them, after JSON unescaping. The list is of what
these servers read at the versions named in docs/security.md; a field a server adds later
passes until it is added here or, harmless, to gateway/api/passed_fields.py
(tests/unit/test_server_field_drift.py names it once the pinned field lists are
re-extracted from the new release).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from gateway.api.labels import excerpt
from gateway.errors import ErrorCode, GatewayError
from gateway.upstream.openai_messages import content_parts

__all__ = [
    "COMMON_FIELDS",
    "RENDERER_ARGUMENTS",
    "SERVER_FIELDS",
    "SERVER_SUFFIXES",
    "refuse_server_fields",
    "refuse_unreadable_encoding",
]

_PROMPT: Final = (
    "has the server build a prompt the request's bytes do not bound, past the tokens its "
    "tenant is charged"
)
_WEIGHTS: Final = (
    "serves the request with weights other than the configured model's (an adapter chosen "
    "in the body)"
)
_SERVER: Final = "reaches the inference server's code, files or network"
_PLACE: Final = (
    "takes another request's place on the inference server (its id, queue position or slot)"
)
_SHARED: Final = (
    "names a media item in the inference server's cache, which every tenant shares (the "
    "server would take another tenant's image by that name, or give it this one)"
)

_LOGGED: Final = (
    "writes the client's strings into the inference server's own metrics (a label and "
    "its value, one time series per value)"
)
_ORACLE: Final = (
    "reports what the inference server's caches, which every tenant shares, already held "
    "(cached prompt tokens by tier, speculative drafts accepted), which tells one tenant "
    "what another sent"
)

_ENVELOPE: Final = (
    "picks the worker, its queue position and its prefix-cache partition on the inference "
    "server (NVIDIA Dynamo's `nvext`: its `cache_salt` overrides the tenant's own)"
)

SERVER_FIELDS: Final[Mapping[str, str]] = {
    # vLLM (ChatCompletionRequest, CompletionRequest, EmbeddingChatRequest extras)
    "chat_template": _PROMPT,
    "mm_processor_kwargs": _PROMPT,
    "media_io_kwargs": _PROMPT,  # per-request decoding: {"video": {"num_frames": -1}}
    "padding": _PROMPT,  # pooling requests: "max_length" pads to the model's whole length
    "prompt_embeds": _SERVER,
    "logits_processors": _SERVER,
    "kv_transfer_params": _SERVER,
    # encoder-cache disaggregation (EPD): a consumer fetches an image's encoder output
    # from the host, port and memory address named per media hash (Mooncake EC connector)
    "ec_transfer_params": _SERVER,
    "vllm_xargs": _SERVER,
    "request_id": _PLACE,
    "priority": _PLACE,
    # SGLang (ChatCompletionRequest, CompletionRequest extras)
    "images_config": _PROMPT,
    "max_dynamic_patch": _PROMPT,
    "min_dynamic_patch": _PROMPT,
    "session_id": _PROMPT,
    "session_params": _PROMPT,
    "lora_path": _WEIGHTS,
    "custom_logit_processor": _SERVER,
    "custom_params": _SERVER,
    "bootstrap_host": _SERVER,
    "bootstrap_port": _SERVER,
    "bootstrap_room": _SERVER,
    "bootstrap_pair_key": _SERVER,
    # a video's audio track decoded as audio items of its own (Nemotron Nano VL), and a
    # video's frames per second, frame count and tokens per frame
    "use_audio_in_video": _PROMPT,
    "video_config": _PROMPT,
    # the radix cache's partition, which SGLang extends with the LoRA adapter's id: a key
    # spelling an adapter's id (uuid5 of its name and path for `--lora-paths`) has a
    # base-model request reuse, or plant, prefixes computed with the adapter's weights
    "extra_key": _WEIGHTS,
    "custom_labels": _LOGGED,  # CompletionRequest: metric labels, any name and value
    # the server's meta_info: cached tokens by device, host and storage (sent even with
    # its `--enable-cache-report` off), and the accepted drafts of an n-gram speculator
    # whose corpus every request's tokens feed; a named external n-gram corpus
    "return_cached_tokens_details": _ORACLE,
    "return_spec_tokens_details": _ORACLE,
    "return_meta_info": _ORACLE,
    "ngram_corpus_id": _ORACLE,
    "rid": _PLACE,
    "routed_dp_rank": _PLACE,
    "data_parallel_rank": _PLACE,
    "disagg_prefill_dp_rank": _PLACE,
    # llama.cpp server (params_from_json_cmpl)
    "lora": _WEIGHTS,
    "id_slot": _PLACE,
    # vLLM's media cache ids by modality, at the top level where a server in front of vLLM
    # takes them in an OpenAI request (NVIDIA Dynamo's frontend, SGLang-Omni): the
    # content part's `uuid` below, for every item at once
    "multi_modal_uuids": _SHARED,
    # NVIDIA Dynamo's frontend (protocols/openai/nvext.rs): its request envelope names the
    # worker and data-parallel rank (`backend_instance_id`, `decode_worker_id`, `dp_rank`),
    # the queue priority (`agent_hints.priority`) and the prefix-cache partition
    # (`cache_salt`, which it reads over the top-level one isolate_prefix_cache sets)
    "nvext": _ENVELOPE,
}
# A content part (vLLM's `image_embeds`, `audio_embeds`) that is a serialized tensor, an
# image's or video's own tiling (SGLang), a media item's client-chosen cache id (vLLM's
# `uuid`), and what a body holding any of them must spell (or a JSON escape that could
# spell it).
_TENSOR: Final = "_embeds"
_TILING: Final = ("max_dynamic_patch", "min_dynamic_patch")
_MEDIA_ID: Final = "uuid"
_PART_NEEDLES: Final = (b"_embeds", b"dynamic_patch", b"uuid", b"\\u")
# Body bytes the four searches for them cost about as much as one message's look at its
# content: a body of fewer messages than its length over this has them looked at instead.
_BYTES_PER_MESSAGE: Final = 64
# A field naming a path or a file on the server, by any server's name for it.
SERVER_SUFFIXES: Final = ("_path", "_paths", "_file", "_files", "_dir", "filename")
# The OpenAI API's own request fields, as it spells them: the names of almost every
# request. None is a server field (checked below) or a control field
# (gateway/api/control_fields.py checks), so both checks pass each with one set look-up.
COMMON_FIELDS: Final = frozenset(
    {
        "model",
        "messages",
        "prompt",
        "input",
        "stream",
        "stream_options",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "n",
        "stop",
        "seed",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "logprobs",
        "top_logprobs",
        "user",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "response_format",
        "reasoning_effort",
        "encoding_format",
        "dimensions",
    }
)
assert not any(n in SERVER_FIELDS or n.endswith(SERVER_SUFFIXES) for n in COMMON_FIELDS)
# Arguments of the chat template renderer itself (transformers' `apply_chat_template`,
# which vLLM and SGLang call with `chat_template_kwargs` spread into it): a client's
# value replaces the server's template, tokenizes in the request's thread
# (GHSA-69j4-grxj-j64p), or pads the prompt to any length. A template's own variables
# (`enable_thinking`, `thinking`, `reasoning_effort`) pass.
RENDERER_ARGUMENTS: Final = frozenset(
    {
        "chat_template",
        "conversation",
        "messages",
        "tools",
        "documents",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
        "processor_kwargs",
    }
)


def refuse_server_fields(doc: Mapping[str, Any], body: bytes) -> None:
    """Raise 400 `invalid_request` naming the first top-level field of `doc` (parsed from
    `body`) that an inference server reads past the bound, the configured weights, or
    its own files, the first renderer argument in its `chat_template_kwargs`, or the
    first content part carrying a serialized tensor."""
    for name in doc:
        if name in COMMON_FIELDS:  # most names: one look-up
            continue
        why = SERVER_FIELDS.get(name)
        if why is None and name.endswith(SERVER_SUFFIXES):
            why = _SERVER
        if why is not None:
            shown = excerpt(name)  # a suffix matches a name of any length and characters
            raise GatewayError(
                ErrorCode.invalid_request,
                f"`{shown}` is not accepted: it {why} (docs/security.md)",
                param=shown,
            )
    kwargs = doc.get("chat_template_kwargs")
    if isinstance(kwargs, dict):
        for key in kwargs:
            if key in RENDERER_ARGUMENTS:
                param = f"chat_template_kwargs.{key}"
                raise GatewayError(
                    ErrorCode.invalid_request,
                    f"`{param}` is not accepted: it {_PROMPT} (docs/security.md)",
                    param=param,
                )
    # Only chat messages have content parts: no part to refuse without an array content.
    messages = doc.get("messages")
    if not isinstance(messages, list):
        return
    # A long body of few messages: a look at each message's content costs less than the
    # searches below over all of the body (a 100 KB prompt: about a quarter of the
    # request's instructions); either way the cost is at most the searches'.
    if len(messages) * _BYTES_PER_MESSAGE < len(body):
        for message in messages:
            if isinstance(message, dict) and isinstance(message.get("content"), list):
                break
        else:
            return
    # Only a body that spells a refused part's name, or may spell it escaped, is walked:
    # the hot path looks at no part. `find`, not `in` (a bytes `in` first tries its
    # operand as an int, formatting a TypeError), and no generator: four searches.
    tensor, tiling, media_id, escape = _PART_NEEDLES
    if (
        body.find(tensor) >= 0
        or body.find(tiling) >= 0
        or body.find(media_id) >= 0
        or body.find(escape) >= 0
    ):
        _refuse_content_parts(doc)


def _refuse_content_parts(doc: Mapping[str, Any]) -> None:
    """Raise 400 naming the first chat content part that is a serialized tensor (vLLM's
    `image_embeds`, `audio_embeds`: `{"type": "image_embeds", ...}`, or a part holding
    such a key without a type), which the server deserializes (GHSA-pmqf-x6x8-p7qw),
    whose image or video sets its own tiling (SGLang's `max_dynamic_patch` in an
    `image_url` or `video_url`: a tile is hundreds of tokens, past `MEDIA_ALLOWANCE`), or
    that names its media item's cache id (vLLM's `uuid`, `_SHARED`)."""
    for where, part in content_parts(doc.get("messages")):
        found = _part_problem(part)
        if found is not None:
            param, why = f"{where}{found[0]}", found[1]
            raise GatewayError(
                ErrorCode.invalid_request,
                f"`{param}` is not accepted: it {why} (docs/security.md)",
                param=param,
            )


def _part_problem(part: Mapping[str, Any]) -> tuple[str, str] | None:
    """(where in the part, why) for a content part the server would expand or
    deserialize, else None."""
    kind = part.get("type")
    if any(key.endswith(_TENSOR) for key in part) or (
        isinstance(kind, str) and kind.endswith(_TENSOR)
    ):
        return "", f"is a serialized tensor, which {_SERVER}"
    # vLLM reads any non-null value (`str(uuid)`: a number too); null asks for nothing.
    if part.get(_MEDIA_ID) is not None:
        return f".{_MEDIA_ID}", _SHARED
    for media in ("image_url", "video_url"):
        inner = part.get(media)
        if isinstance(inner, dict):
            for key in _TILING:
                if key in inner:
                    return f".{media}.{key}", _PROMPT
    return None


# The embeddings encodings the OpenAI API has: both answer a JSON object. vLLM also reads
# `bytes` and `bytes_only`, answered as `application/octet-stream` with the shape and
# dtype in a `metadata` header the gateway does not relay: no client reads that answer
# through the gateway, which refuses it as the wrong shape (a breaker failure: the
# client's own input would count against the backend). Refused here, before any backend.
_ENCODINGS: Final = frozenset({"float", "base64"})


def refuse_unreadable_encoding(doc: Mapping[str, Any]) -> None:
    """Raise 400 `invalid_request` when an embeddings request's `encoding_format` is set
    to anything but `float` or `base64` (null and absent: the backend's default)."""
    value = doc.get("encoding_format")
    if value is None or (isinstance(value, str) and value in _ENCODINGS):
        return
    raise GatewayError(
        ErrorCode.invalid_request,
        "`encoding_format` must be `float` or `base64`: other encodings (vLLM's `bytes`, "
        "`bytes_only`) answer in a form the gateway does not relay (docs/api.md)",
        param="encoding_format",
    )
