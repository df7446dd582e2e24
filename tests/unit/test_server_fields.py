"""An inference server's own body fields that evade the token bound, pick other weights,
or reach the server's code, files or network are refused for every backend
(gateway/api/server_fields.py, through `refuse_control_fields`), with a 400 naming the
field; the fields that only tune sampling, or that the bound counts, pass."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.api import server_fields
from gateway.api.body import parse_body
from gateway.api.control_fields import refuse_control_fields
from gateway.api.server_fields import SERVER_FIELDS
from gateway.errors import ErrorCode, GatewayError
from tests.helpers.python_calls import by_name, python_calls

ASK: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
IMAGE = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}


def refuse(doc: dict[str, Any]) -> None:
    refuse_control_fields(doc, orjson.dumps(doc))


LOOP = "{% for i in range(1000) %}{% for m in messages %}{{ m.content }}{% endfor %}{% endfor %}"


@pytest.mark.parametrize(
    ("fields", "param", "why"),
    [
        # a prompt the body does not bound: the tenant would be charged a fraction of it
        ({"chat_template": LOOP}, "chat_template", "prompt"),
        (
            {"chat_template_kwargs": {"chat_template": LOOP}},
            "chat_template_kwargs.chat_template",
            "prompt",
        ),
        (
            {"chat_template_kwargs": {"padding": "max_length", "max_length": 10**6}},
            "chat_template_kwargs.padding",
            "prompt",
        ),
        ({"chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs.tokenize", "prompt"),
        ({"mm_processor_kwargs": {"min_pixels": 10**9}}, "mm_processor_kwargs", "prompt"),
        # vLLM's pooling requests: the prompt padded to the model's whole length
        ({"input": "hi", "padding": "max_length"}, "padding", "prompt"),
        ({"media_io_kwargs": {"video": {"num_frames": -1}}}, "media_io_kwargs", "prompt"),
        ({"images_config": {"max_pixels": 10**9}}, "images_config", "prompt"),
        ({"max_dynamic_patch": 10**4}, "max_dynamic_patch", "prompt"),
        ({"session_params": {"id": "another-tenants-session"}}, "session_params", "prompt"),
        # other weights than the configured model's
        ({"lora": [{"id": 0, "scale": 1.0}]}, "lora", "weights"),
        ({"lora_path": "sql-adapter"}, "lora_path", "weights"),
        # the server's code, files or network
        ({"prompt_embeds": "gASV"}, "prompt_embeds", "code, files or network"),
        ({"logits_processors": ["os.system"]}, "logits_processors", "code, files or network"),
        (
            {"kv_transfer_params": {"remote_host": "10.0.0.1"}},
            "kv_transfer_params",
            "code, files or network",
        ),
        (
            {"ec_transfer_params": {"mm-hash": {"remote_host": "10.0.0.1", "remote_port": 1}}},
            "ec_transfer_params",
            "code, files or network",
        ),
        ({"bootstrap_host": "10.0.0.1"}, "bootstrap_host", "code, files or network"),
        ({"custom_logit_processor": "gASV"}, "custom_logit_processor", "code, files or network"),
        ({"save_kvcache_path": "/etc/passwd"}, "save_kvcache_path", "code, files or network"),
        ({"filename": "slot.bin"}, "filename", "code, files or network"),
        # another request's place on the server
        ({"request_id": "someone-elses"}, "request_id", "place"),
        ({"rid": "someone-elses"}, "rid", "place"),
        ({"priority": -100}, "priority", "place"),
        ({"id_slot": 0}, "id_slot", "place"),
        # another tenant's media, by the id a server's shared media cache keys it by
        (
            {"multi_modal_uuids": {"image": ["sku-1234"]}},
            "multi_modal_uuids",
            "every tenant shares",
        ),
        # SGLang: a video's audio track as audio items of their own, a video's frame rate
        # and frame count: more media tokens than the one part's allowance
        ({"use_audio_in_video": True}, "use_audio_in_video", "prompt"),
        ({"video_config": {"fps": 60, "max_frames": 10**5}}, "video_config", "prompt"),
        # SGLang keys its radix cache by `extra_key` + the LoRA adapter's id: a key spelling
        # an adapter's id shares prefixes computed with the adapter's weights
        ({"extra_key": "9b2f0c7e4d1a4c8e9f3b6a5d2e1c0b7a"}, "extra_key", "weights"),
        # SGLang: client strings as labels of the server's own metrics
        ({"custom_labels": {"tenant": "x" * 200}}, "custom_labels", "metrics"),
        # SGLang: what its shared caches held, with its cache report off
        ({"return_cached_tokens_details": True}, "return_cached_tokens_details", "caches"),
        ({"return_spec_tokens_details": True}, "return_spec_tokens_details", "caches"),
        ({"return_meta_info": True}, "return_meta_info", "caches"),
        ({"ngram_corpus_id": "another-tenants-corpus"}, "ngram_corpus_id", "caches"),
        # NVIDIA Dynamo's envelope: a worker and a queue position of the client's choosing,
        # and a prefix-cache salt read over the tenant's own (isolate_prefix_cache)
        (
            {"nvext": {"cache_salt": "another-tenants-salt", "backend_instance_id": 7}},
            "nvext",
            "prefix-cache partition",
        ),
        ({"nvext": {"agent_hints": {"priority": 1000}}}, "nvext", "queue position"),
    ],
)
def test_a_server_field_is_refused_naming_it(fields: dict[str, Any], param: str, why: str) -> None:
    with pytest.raises(GatewayError) as raised:
        refuse({**ASK, **fields})
    assert raised.value.code is ErrorCode.invalid_request
    assert raised.value.param == param
    assert why in str(raised.value)


def test_names_are_matched_as_the_backend_reads_them() -> None:
    body = orjson.dumps(ASK)[:-1] + b', "chat\\u005ftemplate": "{{ x }}"}'
    with pytest.raises(GatewayError) as raised:
        refuse_control_fields(parse_body(body, None), body)
    assert raised.value.param == "chat_template"


def test_a_long_server_field_name_is_cut_in_the_error() -> None:
    name = "x" * 5000 + "_path"
    with pytest.raises(GatewayError) as raised:
        refuse({**ASK, name: 1})
    assert len(str(raised.value)) < 1000


@pytest.mark.parametrize(
    "fields",
    [
        # sampling, and fields the bound counts (gateway/api/usage_bound.py)
        {"top_k": 3, "min_p": 0.1, "repetition_penalty": 1.1, "ignore_eos": True},
        {"n_predict": 5, "n_cmpl": 2, "min_tokens": 1, "max_tokens": 5},
        {"echo": True, "prompt_logprobs": 2, "truncate_prompt_tokens": 10, "n_probs": 3},
        {"add_generation_prompt": False, "continue_final_message": True},
        {"documents": [{"title": "t", "text": "x"}], "cache_salt": "s", "cache_prompt": True},
        {"grammar": 'root ::= "a"', "json_schema": {}, "guided_regex": "a+"},
        # a template's own variables
        {"chat_template_kwargs": {"enable_thinking": False, "thinking": True}},
        {"chat_template_kwargs": None},
        {"metadata": {"path": "/x"}, "user": "u1"},  # OpenAI's own fields
    ],
)
def test_fields_that_tune_sampling_pass(fields: dict[str, Any]) -> None:
    refuse({**ASK, **fields})


@pytest.mark.parametrize(
    "part",
    [
        {"type": "image_embeds", "image_embeds": "gASV"},
        {"type": "audio_embeds", "audio_embeds": "gASV"},
        {"image_embeds": {"image_grid_thw": "gASV"}},  # a part without a type, by its key
    ],
)
def test_a_serialized_tensor_in_a_content_part_is_refused(part: dict[str, Any]) -> None:
    # vLLM deserializes it (torch.load) into the model's input: GHSA-pmqf-x6x8-p7qw.
    doc = {"model": "m", "messages": [{"role": "user", "content": [IMAGE, part]}]}
    with pytest.raises(GatewayError) as raised:
        refuse(doc)
    assert raised.value.param == "messages[0].content[1]"


@pytest.mark.parametrize("media", ["image_url", "video_url"])
def test_a_part_that_sets_its_own_tiling_is_refused(media: str) -> None:
    # SGLang reads `max_dynamic_patch` per image or video: each tile is hundreds of tokens.
    part = {"type": media, media: {"url": "https://example.com/a", "max_dynamic_patch": 4096}}
    with pytest.raises(GatewayError) as raised:
        refuse({"model": "m", "messages": [{"role": "user", "content": ["x", part]}]})
    assert raised.value.param == f"messages[0].content[1].{media}.max_dynamic_patch"
    assert "prompt" in str(raised.value)


@pytest.mark.parametrize(
    "part",
    [
        # the media left out: vLLM takes the item from its cache by the client's name alone
        {"type": "image_url", "image_url": None, "uuid": "sku-1234"},
        # the media sent under a name another tenant uses: its requests get this image
        {**IMAGE, "uuid": "sku-1234"},
        {"type": "video_url", "video_url": {"url": "https://example.com/v.mp4"}, "uuid": 7},
        {"image_url": "https://example.com/a.png", "uuid": "x"},  # no type: vLLM reads it too
    ],
)
def test_a_media_items_own_cache_id_is_refused(part: dict[str, Any]) -> None:
    # vLLM's multimodal caches serve every tenant and key an item by its `uuid` when the
    # client gives one, in place of the hash of its content.
    doc = {"model": "m", "messages": [{"role": "user", "content": ["x", part]}]}
    with pytest.raises(GatewayError) as raised:
        refuse(doc)
    assert raised.value.param == "messages[0].content[1].uuid"
    assert "every tenant shares" in str(raised.value)
    assert "sku-1234" not in str(raised.value)


def test_an_escaped_media_cache_id_is_found_too() -> None:
    body = (
        b'{"model": "m", "messages": [{"role": "user", "content": '
        b'[{"type": "image_url", "image_url": null, "uu\\u0069d": "sku-1234"}]}]}'
    )
    assert b"uuid" not in body
    with pytest.raises(GatewayError) as raised:
        refuse_control_fields(parse_body(body, None), body)
    assert raised.value.param == "messages[0].content[0].uuid"


def test_a_null_media_cache_id_and_the_word_in_text_pass() -> None:
    text = {"type": "text", "text": "what is a uuid?"}
    refuse(
        {"model": "m", "messages": [{"role": "user", "content": [text, {**IMAGE, "uuid": None}]}]}
    )
    refuse({"model": "m", "messages": [{"role": "user", "content": "a uuid"}], "user": "uuid"})


def test_an_escaped_tensor_part_is_found_too() -> None:
    body = (
        b'{"model": "m", "messages": [{"role": "user", "content": '
        b'[{"type": "image\\u005fembeds", "image\\u005fembeds": "gASV"}]}]}'
    )
    assert b"_embeds" not in body
    with pytest.raises(GatewayError) as raised:
        refuse_control_fields(parse_body(body, None), body)
    assert raised.value.param == "messages[0].content[0]"


def test_media_parts_pass() -> None:
    refuse(
        {
            "model": "m",
            "messages": [{"role": "user", "content": [IMAGE, {"type": "text", "text": "x"}]}],
        }
    )


def test_the_usual_fields_are_passed_by_one_look_up(monkeypatch: pytest.MonkeyPatch) -> None:
    # Hot path: the usual names are not looked up in the server's fields or suffixes.
    looked_up: list[str] = []

    class Counting(dict[str, str]):
        def get(self, name: str, default: Any = None) -> Any:
            looked_up.append(name)
            return super().get(name, default)

    monkeypatch.setattr(server_fields, "SERVER_FIELDS", Counting(SERVER_FIELDS))
    refuse({**ASK, "max_tokens": 16, "stream": True, "top_k": 3})
    assert looked_up == ["top_k"]


def test_a_usual_body_is_checked_without_a_python_call() -> None:
    # Hot path: a body that spells no refused content part is checked with three searches,
    # no Python frame (a generator over the needles ran one per needle, and a bytes `in`
    # formats a TypeError before it searches).
    body = orjson.dumps({**ASK, "max_tokens": 16, "stream": False})
    doc = parse_body(body)
    frames = python_calls(lambda: refuse_control_fields(doc, body), by_name)
    assert frames == ["refuse_control_fields", "refuse_server_fields"]


class _Searched(bytes):
    """A body that notes each search of it."""

    searches = 0

    def find(self, *args: Any) -> int:
        _Searched.searches += 1
        return super().find(*args)

    def __contains__(self, item: Any) -> bool:
        _Searched.searches += 1
        return super().__contains__(item)


def test_a_long_prompt_of_few_messages_is_not_searched() -> None:
    # A 100 KB prompt: its messages' contents are looked at (no array content: no part to
    # refuse), not all of its bytes searched three times.
    doc = {**ASK, "messages": [{"role": "user", "content": "word " * 20_000}]}
    body = _Searched(orjson.dumps(doc))
    _Searched.searches = 0
    refuse_control_fields(doc, body)
    assert _Searched.searches == 0
    doc = {"model": "m", "prompt": "word " * 20_000}  # no messages at all: no parts either
    refuse_control_fields(doc, _Searched(orjson.dumps(doc)))
    assert _Searched.searches == 0


@pytest.mark.parametrize("messages", [1, 2_000])
def test_a_tensor_part_is_refused_however_many_messages_there_are(messages: int) -> None:
    # Few messages for the body's length: each content looked at; many: the body searched.
    talk = [{"role": "user", "content": "hi"}] * (messages - 1)
    parts = [
        {"type": "text", "text": "x" * 5_000},
        {"type": "image_embeds", "image_embeds": "gASV"},
    ]
    doc = {**ASK, "messages": [*talk, {"role": "user", "content": parts}]}
    with pytest.raises(GatewayError) as raised:
        refuse(doc)
    assert raised.value.param == f"messages[{messages - 1}].content[1]"
