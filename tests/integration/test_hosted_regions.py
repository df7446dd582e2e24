"""A hosted backend whose config names no endpoint goes to its declared region, whatever
the environment says (gateway/upstream/provider_regions.py).

LiteLLM picks an AWS route's Region from `AWS_REGION_NAME` and the like, and a Vertex AI
route's location from `VERTEXAI_LOCATION` (else `us-central1`), unless the call names
one. Each test runs the real LiteLLM call and reads the URL it sends to at httpx's
`AsyncClient.send` (replaced for the test, after LiteLLM is loaded: nothing leaves the
process, no socket is opened)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import yaml

from gateway.app import AssemblyError, create_app
from gateway.config import parse_config
from gateway.config.schema import BackendSettings
from gateway.upstream.hosted import HostedClient, HostedError
from gateway.upstream.litellm_runtime import load_litellm
from gateway.upstream.openai_wire import Endpoint

CHAT = {"model": "public", "messages": [{"role": "user", "content": "hi"}]}
AWS_KEYS = {"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "s" * 40}
US_EAST = dict.fromkeys(("AWS_REGION_NAME", "AWS_REGION", "AWS_DEFAULT_REGION"), "us-east-1")


BEDROCK_EU = "bedrock-runtime.eu-central-1.amazonaws.com"


class _Stop(Exception):
    """Raised in place of sending."""


def backend(provider: str, provider_model: str, region: str, **more: Any) -> BackendSettings:
    return BackendSettings.model_validate(
        {
            "id": "hosted",
            "kind": "hosted",
            "provider": provider,
            "models": [{"name": "public", "provider_model": provider_model}],
            "region": region,
            "owner": provider,
            **more,
        }
    )


def client(
    settings: BackendSettings, monkeypatch: pytest.MonkeyPatch, env: Mapping[str, str]
) -> HostedClient:
    """A client of `settings` built with `env` set in the process environment too (LiteLLM
    reads `os.environ` itself), every region variable not in `env` unset."""
    for name in ("AWS_REGION_NAME", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE",
                 "AWS_CONFIG_FILE", "VERTEXAI_LOCATION", "VERTEX_LOCATION"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/owngate-test-aws-config")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return HostedClient(settings, environ=dict(env), timeout_s=10.0)


def sent_to(
    hosted: HostedClient, monkeypatch: pytest.MonkeyPatch, endpoint: Endpoint = "chat", **env: str
) -> str:
    """The URL the client's call goes to, with `env` set after the client was built."""
    seen: list[str] = []

    async def capture(_self: Any, request: httpx.Request, **_kw: Any) -> Any:
        seen.append(str(request.url))
        raise _Stop

    async def call() -> None:
        doc = dict(CHAT) if endpoint == "chat" else {"model": "public", "input": ["hi"]}
        prepared = await hosted.prepare(endpoint, doc, "public")  # loads LiteLLM
        monkeypatch.setattr(httpx.AsyncClient, "send", capture)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        await hosted.send_prepared(prepared)

    with pytest.raises(HostedError) as failed:
        asyncio.run(call())
    assert len(seen) == 1, (seen, failed.value)
    return seen[0]


@pytest.mark.parametrize(
    ("provider_model", "host"),
    [
        ("bedrock/anthropic.claude-3-haiku-20240307-v1:0", BEDROCK_EU),
        ("bedrock/converse/amazon.nova-pro-v1:0", BEDROCK_EU),
        ("bedrock/invoke/anthropic.claude-3-haiku-20240307-v1:0", BEDROCK_EU),
        ("bedrock_mantle/openai.gpt-oss-120b", "bedrock-mantle.eu-central-1.api.aws"),
        ("sagemaker/my-endpoint", "runtime.sagemaker.eu-central-1.amazonaws.com"),
        ("sagemaker_chat/my-endpoint", "runtime.sagemaker.eu-central-1.amazonaws.com"),
    ],
)  # fmt: skip
def test_an_aws_backend_goes_to_its_declared_region_not_the_environments(
    provider_model: str, host: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: LiteLLM took AWS_REGION_NAME and sent the prompt to Virginia.
    settings = backend("aws", provider_model, "eu-central-1")
    hosted = client(settings, monkeypatch, {**AWS_KEYS, **US_EAST})
    assert urlsplit(sent_to(hosted, monkeypatch)).hostname == host


def test_a_declared_area_takes_the_environments_region_in_it_and_keeps_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = backend("aws", "bedrock/anthropic.claude-3-haiku-20240307-v1:0", "eu")
    hosted = client(settings, monkeypatch, {**AWS_KEYS, "AWS_REGION_NAME": "eu-west-1"})
    # The Region is read once, when the client is built: a later change does not move it.
    url = sent_to(hosted, monkeypatch, AWS_REGION_NAME="us-east-1")
    assert urlsplit(url).hostname == "bedrock-runtime.eu-west-1.amazonaws.com"


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"AWS_REGION_NAME": "us-east-1"}, "'us-east-1'"),
        ({"AWS_REGION": "ap-south-1"}, "'ap-south-1'"),
        ({"AWS_DEFAULT_REGION": "us-east-2"}, "'us-east-2'"),
        ({}, "'us-west-2'"),  # LiteLLM's default when nothing names a Region
    ],
)
def test_a_declared_area_the_environment_puts_outside_does_not_start(
    env: dict[str, str], named: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = backend("aws", "bedrock/anthropic.claude-3-haiku-20240307-v1:0", "eu")
    with pytest.raises(ValueError, match="declared region 'eu'") as refused:
        client(settings, monkeypatch, {**AWS_KEYS, **env})
    assert named in str(refused.value)


@pytest.fixture
def vertex_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """Google's token exchange answered without a network (it runs before the URL)."""
    from litellm.llms.vertex_ai.vertex_llm_base import VertexBase

    async def token(*_args: Any, **_kw: Any) -> tuple[str, str]:
        return "token", "project"

    monkeypatch.setattr(VertexBase, "get_access_token", lambda *_a, **_k: ("token", "project"))
    monkeypatch.setattr(VertexBase, "get_access_token_async", token)


VERTEX_MODELS = (
    "vertex_ai/claude-3-5-sonnet@20240620",
    "vertex_ai/mistral-large@2411",
    "vertex_ai/meta/llama-3.3-70b-instruct-maas",
)


@pytest.mark.parametrize("provider_model", VERTEX_MODELS)
@pytest.mark.usefixtures("vertex_token")
def test_a_vertex_backend_goes_to_its_declared_location_not_the_environments(
    provider_model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: VERTEXAI_LOCATION (or LiteLLM's us-central1) decided; declared Europe, sent to Iowa.
    settings = backend("google", provider_model, "europe-west4")
    hosted = client(settings, monkeypatch, {"VERTEXAI_LOCATION": "us-central1"})
    url = urlsplit(sent_to(hosted, monkeypatch))
    assert url.hostname == "europe-west4-aiplatform.googleapis.com"
    assert "/locations/europe-west4/" in url.path


@pytest.mark.parametrize(
    ("provider", "provider_model", "region", "host"),
    [
        ("aws", "bedrock/amazon.titan-embed-text-v2:0", "eu-central-1", BEDROCK_EU),
        ("google", "vertex_ai/text-embedding-005", "europe-west4",
         "europe-west4-aiplatform.googleapis.com"),
    ],
)  # fmt: skip
@pytest.mark.usefixtures("vertex_token")
def test_embeddings_go_to_the_declared_region_too(
    provider: str, provider_model: str, region: str, host: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {**AWS_KEYS, **US_EAST, "VERTEXAI_LOCATION": "us-central1"}
    hosted = client(backend(provider, provider_model, region), monkeypatch, env)
    assert urlsplit(sent_to(hosted, monkeypatch, "embeddings")).hostname == host


@pytest.mark.usefixtures("vertex_token")
def test_the_global_vertex_host_goes_to_the_location_of_the_declared_area(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # LiteLLM grafts `/locations/<VERTEXAI_LOCATION>/` onto a base_url without a path.
    settings = backend(
        "google", VERTEX_MODELS[0], "eu", base_url="https://aiplatform.googleapis.com"
    )
    hosted = client(settings, monkeypatch, {"VERTEXAI_LOCATION": "europe-west1"})
    url = urlsplit(sent_to(hosted, monkeypatch, VERTEXAI_LOCATION="us-central1"))
    assert "/locations/europe-west1/" in url.path


@pytest.mark.parametrize(
    ("env", "named"),
    [({"VERTEXAI_LOCATION": "us-east4"}, "'us-east4'"), ({}, "'us-central1'"),
     ({"VERTEX_LOCATION": "global"}, "'global'")],
)  # fmt: skip
def test_a_vertex_area_the_environment_puts_outside_does_not_start(
    env: dict[str, str], named: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ValueError, match="declared region 'eu'") as refused:
        client(backend("google", VERTEX_MODELS[0], "eu"), monkeypatch, env)
    assert named in str(refused.value)


def test_a_vertex_model_litellm_moves_to_another_location_does_not_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # LiteLLM's model list sends this model to `global` whatever `vertex_location` says.
    model = "vertex_ai/qwen/qwen3-next-80b-a3b-instruct-maas"
    with pytest.raises(ValueError, match="'europe-west4'") as refused:
        client(backend("google", model, "europe-west4"), monkeypatch, {})
    assert "(global)" in str(refused.value)


@pytest.mark.usefixtures("vertex_token")
def test_a_vertex_model_listed_in_the_declared_location_goes_there(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = "vertex_ai/qwen/qwen3-235b-a22b-instruct-2507-maas"  # listed: global, us-south1
    hosted = client(backend("google", model, "us-south1"), monkeypatch, {})
    url = urlsplit(sent_to(hosted, monkeypatch, VERTEXAI_LOCATION="global"))
    assert url.hostname == "us-south1-aiplatform.googleapis.com"


def test_the_vertex_locations_refused_are_those_litellm_would_move() -> None:
    """Every Vertex AI model LiteLLM's list gives locations: a location is refused exactly
    when LiteLLM's own `get_vertex_region` would send the call elsewhere."""
    litellm = load_litellm()
    from litellm.llms.vertex_ai.vertex_llm_base import VertexBase

    listed = {
        name: entry["supported_regions"]
        for name, entry in litellm.model_cost.items()
        if name.startswith("vertex_ai/") and isinstance(entry, dict)
        if entry.get("supported_regions")
    }
    assert listed  # the list still has such models: otherwise this test checks nothing
    for name, regions in listed.items():
        model = name.removeprefix("vertex_ai/")
        for location in {*regions, "europe-west4", "us-central1"} - {"global"}:
            moved = VertexBase.get_vertex_region(location, model) != location
            try:
                HostedClient(backend("google", name, location), environ={}, timeout_s=10.0)
            except ValueError:
                refused = True
            else:
                refused = False
            assert refused == moved, (name, location)


def test_serve_and_config_validate_name_a_region_the_environment_puts_outside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = "bedrock/anthropic.claude-3-haiku-20240307-v1:0"
    settings = backend("aws", model, "eu").model_dump(exclude_defaults=True)
    config = parse_config(yaml.safe_dump({"backends": [settings]}), env={})
    env = {**AWS_KEYS, "AWS_REGION_NAME": "us-east-1"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(AssemblyError) as info:
        create_app(config, environ=env, config_dir=tmp_path)
    named = [p for p in info.value.problems if "declared region 'eu'" in p]
    assert named and "AWS_REGION_NAME names 'us-east-1'" in named[0], info.value.problems
