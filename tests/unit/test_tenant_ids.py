"""Client-chosen identifiers sent as their tenant's own (gateway/upstream/tenant_ids.py)."""

from __future__ import annotations

import re
from typing import Any

import orjson
import pytest
from pydantic import ValidationError

from gateway.config.backends import BackendSettings
from gateway.provenance.testing import seeded_signer
from gateway.upstream.tenant_ids import (
    IDENTIFIER_FIELDS,
    cache_salt,
    salted_body,
    scoped_body,
    scoped_identifier,
    scoped_params,
)

LONGEST_TENANT = "t" * 63  # the longest id the config takes: BLAKE2b's key holds it


@pytest.mark.parametrize("value", ["", "user_123", "x" * 5000, "\ud800 lone surrogate", "é"])
def test_an_identifier_is_the_tenants_own_and_fits_openais_64_characters(value: str) -> None:
    mine = scoped_identifier("acme", value)
    assert mine == scoped_identifier("acme", value)  # stable: a cache key finds its cache
    assert re.fullmatch(r"og-[0-9a-f]{8}-[0-9a-f]{32}", mine)
    assert scoped_identifier("other", value) != mine
    assert scoped_identifier(LONGEST_TENANT, value) != mine
    assert scoped_identifier("acme", value + "!") != mine


def test_the_tag_names_the_tenant_whatever_the_value() -> None:
    tags = {scoped_identifier("acme", v).split("-")[1] for v in ("a", "b", "c")}
    assert len(tags) == 1
    assert scoped_identifier("other", "a").split("-")[1] not in tags


def test_scoped_params_rewrites_string_identifiers_only() -> None:
    params = {
        "messages": [{"role": "user", "content": "hi", "user": "kept"}],
        "user": "u",
        "safety_identifier": "u",
        "prompt_cache_key": "k",
        "temperature": 0.5,
    }
    scoped = scoped_params(params, "acme")
    assert params["user"] == "u"  # a copy: the client's document is not changed
    assert scoped["messages"] is params["messages"] and scoped["temperature"] == 0.5
    assert scoped["user"] == scoped["safety_identifier"] == scoped_identifier("acme", "u")
    assert scoped["prompt_cache_key"] == scoped_identifier("acme", "k")
    assert set(IDENTIFIER_FIELDS) == {"user", "safety_identifier", "prompt_cache_key"}
    wrong = {"user": 5, "prompt_cache_key": None}  # left for the type check to refuse
    assert scoped_params(wrong, "acme") == wrong


def test_a_cache_salt_is_the_tenants_own_and_a_clients_salt_partitions_within_it() -> None:
    salt = cache_salt("acme")
    assert re.fullmatch(r"[A-Za-z0-9_-]{43}", salt)  # 256 bits, as vLLM asks
    assert cache_salt("acme") == salt
    assert cache_salt("other") != salt
    assert cache_salt("acme", "s") not in (salt, cache_salt("other", "s"))
    assert cache_salt("acme", "s") == cache_salt("acme", "s")
    assert cache_salt("acme", "1") != cache_salt("acme", 1)  # the JSON value, typed
    assert cache_salt("acme", "") != salt  # an empty salt is a salt, not none
    # Another tenant writing acme's salt as its own gets its own partition.
    assert cache_salt("other", salt) != salt


def test_a_salted_body_changes_no_other_byte_when_the_client_wrote_no_salt() -> None:
    body = b' {"model": "m",\n "messages": [{"role": "user", "content": "hi"}]}'
    out = salted_body(body, orjson.loads(body), "acme")
    assert out == b' {"cache_salt":"' + cache_salt("acme").encode() + b'",' + body[2:]
    assert orjson.loads(out)["cache_salt"] == cache_salt("acme")


@pytest.mark.parametrize(
    "body",
    [
        b'{"model":"m","cache_salt":"s"}',
        b'{"model":"m","cache_salt":"x","cache_salt":"s"}',  # the last one is read
        b'{"model":"m","cache_s\\u0061lt":"s","Cache_Salt":"z","CACHE_\\u017fALT":"y"}',
    ],
)
def test_a_clients_salt_is_mixed_in_and_every_spelling_of_it_dropped(body: bytes) -> None:
    out = orjson.loads(salted_body(body, orjson.loads(body), "acme"))
    assert out == {"cache_salt": cache_salt("acme", "s"), "model": "m"}


def _backend(**changes: Any) -> dict[str, Any]:
    return {
        "id": "b",
        "kind": "vllm",
        "base_url": "http://127.0.0.1:8000",
        "models": [{"name": "m"}],
        "region": "eu",
        "owner": "o",
        "isolate_prefix_cache": True,
        **changes,
    }


def test_isolate_prefix_cache_is_for_servers_that_read_cache_salt() -> None:
    for kind in ("vllm", "sglang", "openai"):
        assert BackendSettings.model_validate(_backend(kind=kind)).isolate_prefix_cache
    assert not BackendSettings.model_validate(
        _backend(isolate_prefix_cache=False, kind="llamacpp")
    ).isolate_prefix_cache
    with pytest.raises(ValidationError, match="llamacpp backend reads none"):
        BackendSettings.model_validate(_backend(kind="llamacpp"))
    hosted = {"kind": "hosted", "models": [{"name": "m", "provider_model": "openai/m"}]}
    with pytest.raises(ValidationError, match="hosted backend reads none"):
        BackendSettings.model_validate(_backend(**hosted, provider="openai"))
    attest = {"key": seeded_signer("sidecar").vkey}
    with pytest.raises(ValidationError, match="countersigns the body the client sent"):
        BackendSettings.model_validate(_backend(attest=attest))


def test_a_private_body_without_identifiers_is_sent_as_it_came() -> None:
    body = b'{"model": "m",  "messages": [{"role": "user", "content": "hi", "user": "x"}]}'
    assert scoped_body(body, orjson.loads(body), "acme") is body  # no byte changed


@pytest.mark.parametrize(
    ("body", "name", "written"),
    [
        (b'{"model":"m","user":"u1"}', "user", "u1"),
        (b'{"model":"m","safety_identifier":"u1"}', "safety_identifier", "u1"),
        (b'{"model":"m","prompt_cache_key":"k"}', "prompt_cache_key", "k"),
        # a router in Go reads `User` (and `u\u017fer`, its long s folded) as `user`
        (b'{"model":"m","User":"u1"}', "User", "u1"),
        (b'{"model":"m","u\\u017fer":"u1"}', "u\u017fer", "u1"),
        # a lax router reads 12345 as "12345": digested as its JSON text
        (b'{"model":"m","user":12345}', "user", "12345"),
        # a repeat: the last copy (orjson's) is scoped, the first is gone
        (b'{"model":"m","user":"first","user":"u1"}', "user", "u1"),
    ],
)
def test_a_private_bodys_identifiers_are_the_tenants_own(
    body: bytes, name: str, written: str
) -> None:
    out = scoped_body(body, orjson.loads(body), "acme")
    assert orjson.loads(out) == {"model": "m", name: scoped_identifier("acme", written)}
    assert b"first" not in out


def test_a_null_identifier_stays_null() -> None:
    body = b'{"model":"m","user":null}'
    sent = orjson.loads(scoped_body(body, orjson.loads(body), "acme"))
    assert sent == {"model": "m", "user": None}


@pytest.mark.parametrize(
    "body",
    [
        b'{"model":"m","metadata":{"app":"a","user_id":"u1"}}',
        b'{"model":"m","metadata":{"app":"a","user_id":"first","user_id":"u1"}}',
        # a router in Go reads names in any case
        b'{"model":"m","Metadata":{"app":"a","User_Id":"u1"}}',
    ],
)
def test_a_metadata_user_id_is_the_tenants_own(body: bytes) -> None:
    # A LiteLLM proxy reads `metadata.user_id` as the end user when there is no `user`
    # (its spend, budgets and rate limits): another tenant's end user, before.
    sent = orjson.loads(scoped_body(body, orjson.loads(body), "acme"))
    ((holder, metadata),) = [(k, v) for k, v in sent.items() if k != "model"]
    assert holder.casefold() == "metadata"
    assert metadata.pop("app") == "a"
    ((name, value),) = metadata.items()
    assert (name.casefold(), value) == ("user_id", scoped_identifier("acme", "u1"))


def test_metadata_without_a_user_id_is_sent_as_it_came() -> None:
    body = b'{"model": "m", "metadata": {"app": "a", "user": null}, "x": {"user_id": 1}}'
    assert scoped_body(body, orjson.loads(body), "acme") is body
    body = b'{"model":"m","metadata":{"user_id":null}}'
    assert orjson.loads(scoped_body(body, orjson.loads(body), "acme"))["metadata"] == {
        "user_id": None
    }
