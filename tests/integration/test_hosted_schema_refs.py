"""A request whose conversion would hold the gateway's CPU never reaches LiteLLM's
adapters.

LiteLLM's Gemini adapter inlines every `$ref` of a tool's parameters (a deep copy of the
definition per reference, unbounded) before it sends the request: definitions that each
refer to the next twice made a 2 KB body 2**n copies in the gateway's process, which then
went to the provider. It names each tool result by searching the latest assistant
message's tool calls one by one: n calls and n results, n**2 comparisons (32,000 of each,
a 4 MB body: 80 s). A loopback server stands for the provider and records each request.
"""

from __future__ import annotations

import asyncio
import http.server
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.config.schema import BackendSettings
from gateway.upstream.hosted import HostedClient
from gateway.upstream.hosted_errors import HostedError
from tests.helpers.gateways import LITELLM_WARNINGS
from tests.helpers.http_thread import serving

pytestmark = LITELLM_WARNINGS


class _Provider(http.server.BaseHTTPRequestHandler):
    hits: list[str]

    def do_POST(self) -> None:
        self.hits.append(self.path)
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.send_response(500)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *_args: Any) -> None:
        """Quiet."""


@pytest.fixture
def provider() -> Iterator[tuple[str, list[str]]]:
    hits: list[str] = []
    handler = type("Provider", (_Provider,), {"hits": hits})
    with serving(handler) as url:
        yield url, hits


def doubling(depth: int) -> dict[str, Any]:
    """Definitions each referring to the next twice: 2**depth copies once inlined."""
    defs: dict[str, Any] = {
        f"d{i}": {
            "type": "object",
            "properties": {"a": {"$ref": f"#/$defs/d{i + 1}"}, "b": {"$ref": f"#/$defs/d{i + 1}"}},
        }
        for i in range(depth)
    }
    defs[f"d{depth}"] = {"type": "string"}
    return {"type": "object", "properties": {"x": {"$ref": "#/$defs/d0"}}, "$defs": defs}


def gemini(url: str) -> HostedClient:
    backend = BackendSettings.model_validate(
        {
            "id": "gemini",
            "kind": "hosted",
            "provider": "gemini",
            "base_url": url,
            "models": [{"name": "public", "provider_model": "gemini/gemini-2.0-flash"}],
            "region": "eu",
            "owner": "gemini",
            "api_key_env": "HOSTED_KEY",
        }
    )
    return HostedClient(backend, environ={"HOSTED_KEY": "k"}, timeout_s=10.0)


def refused_unsent(client: HostedClient, doc: dict[str, Any]) -> HostedError:
    async def send() -> None:
        await client.send("chat", doc, "public")

    with pytest.raises(HostedError) as refused:
        asyncio.run(send())
    assert refused.value.status == 400
    assert "not sent" in refused.value.message
    return refused.value


def test_a_tool_schema_that_would_expand_past_the_bound_is_refused_unsent(
    provider: tuple[str, list[str]],
) -> None:
    url, hits = provider
    # 14 doublings: some 160,000 values inlined (about 1 s of LiteLLM's time; each step
    # more doubles it); the body is 2 KB.
    tools = [{"type": "function", "function": {"name": "f", "parameters": doubling(14)}}]
    doc = {"model": "public", "messages": [{"role": "user", "content": "hi"}], "tools": tools}
    assert refused_unsent(gemini(url), doc).param == "tools"
    assert hits == []  # nothing reached the provider


def test_tool_results_searched_among_too_many_calls_are_refused_unsent(
    provider: tuple[str, list[str]],
) -> None:
    url, hits = provider
    # 4,096 calls and their results: 16 million comparisons (about 1.5 s of LiteLLM's
    # time; each doubling of both quadruples it); the body is 600 KB.
    calls = [
        {"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        for i in range(4096)
    ]
    results = [{"role": "tool", "tool_call_id": f"c{i}", "content": "x"} for i in range(4096)]
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": calls},
        *results,
    ]
    assert refused_unsent(gemini(url), {"model": "public", "messages": messages}).param == (
        "messages"
    )
    assert hits == []


def test_tool_calls_compared_with_too_many_parts_are_refused_unsent(
    provider: tuple[str, list[str]],
) -> None:
    url, hits = provider
    # 4,000 calls of distinct names in one message: LiteLLM's Gemini adapter compares each
    # with those before it, 8 million comparisons (some 2 s of its time, 9 s for twice as
    # many); the body is 350 KB.
    calls = [
        {"id": f"c{i}", "type": "function", "function": {"name": f"f{i}", "arguments": "{}"}}
        for i in range(4000)
    ]
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": calls},
    ]
    assert refused_unsent(gemini(url), {"model": "public", "messages": messages}).param == (
        "messages"
    )
    assert hits == []
