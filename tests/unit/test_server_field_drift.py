"""Every top-level field of vLLM's and SGLang's chat, completion and embeddings request
models is classified by the gateway: the OpenAI API's own, passed as harmless
(gateway/api/passed_fields.py), or refused (gateway/api/server_fields.py,
gateway/api/control_fields.py). The fields are read from the pinned releases' protocol
files once, into tests/vectors/server_fields/upstream_fields.json (its README says how):
nothing is downloaded here. A field a new release adds fails the first test until it is
classified."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.api.control_fields import refuse_control_fields
from gateway.api.passed_fields import OPENAI_FIELDS, PASSED_FIELDS
from gateway.api.server_fields import COMMON_FIELDS
from gateway.errors import ErrorCode, GatewayError
from tests.helpers.paths import VECTORS

UPSTREAM: dict[str, Any] = orjson.loads(
    (VECTORS / "server_fields" / "upstream_fields.json").read_bytes()
)
ASK: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def refused(name: str) -> bool:
    """Whether a body holding `name` (set to a value every server reads as set) is refused
    naming it."""
    doc = {**ASK, name: 1}
    error: GatewayError | None = None
    try:
        refuse_control_fields(doc, orjson.dumps(doc))
    except GatewayError as raised:
        error = raised
    if error is None:
        return False
    assert (error.code, error.param) == (ErrorCode.invalid_request, name)
    return True


def upstream_fields() -> list[tuple[str, str, list[str]]]:
    return [
        (f"{server} {pinned['release']}", model, names)
        for server, pinned in UPSTREAM.items()
        for model, names in pinned["models"].items()
    ]


@pytest.mark.parametrize(("release", "model", "names"), upstream_fields())
def test_every_upstream_request_field_is_classified(
    release: str, model: str, names: list[str]
) -> None:
    unclassified = [
        name
        for name in names
        if name not in COMMON_FIELDS
        and name not in OPENAI_FIELDS
        and name not in PASSED_FIELDS
        and not refused(name)
    ]
    assert unclassified == [], (
        f"{release} {model} reads these top-level fields, which the gateway has not "
        f"classified: {unclassified}. Read what the server does with each; refuse it in "
        "gateway/api/server_fields.py (with a test and a docs/security.md bullet) when it "
        "widens where the backend connects, evades the token bound, crosses tenants "
        "through a cache or writes client strings into the server's logs or metrics, or "
        "list it with its reason in gateway/api/passed_fields.py"
    )


def test_the_pinned_lists_are_the_releases_read() -> None:
    assert {s: p["release"] for s, p in UPSTREAM.items()} == {"vllm": "0.34.0", "sglang": "0.5.23"}
    # the fields the red team found: the lists hold them, so the test above saw them
    sglang = {n for names in UPSTREAM["sglang"]["models"].values() for n in names}
    assert {"custom_labels", "return_cached_tokens_details", "use_audio_in_video"} <= sglang
    vllm = {n for names in UPSTREAM["vllm"]["models"].values() for n in names}
    assert {"ec_transfer_params", "padding", "kv_transfer_params"} <= vllm


@pytest.mark.parametrize("name", sorted(PASSED_FIELDS))
def test_a_passed_field_passes(name: str) -> None:
    # A field listed as harmless is one no check refuses: the lists do not overlap.
    assert not refused(name)
    assert name not in COMMON_FIELDS and name not in OPENAI_FIELDS


@pytest.mark.parametrize("name", sorted(OPENAI_FIELDS))
def test_openais_own_fields_pass(name: str) -> None:
    assert not refused(name)
