"""No httpx client of a hosted call follows a redirect, including those LiteLLM makes
outside the factories gateway/upstream/litellm_runtime.py sets to stop at one: the Azure
SDK client it builds for a Cloudflare AI Gateway `base_url` followed a 307 to any host it
named, prompt and key resent there, and relayed that host's answer as the provider's."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

from tests.helpers.raw_backend import Post, RawBackend, completion_body, json_answer

KEY = "sk-redirect-key-0123456789"
PROMPT = "PROMPT-redirect-7d21"

_SCRIPT = """
import asyncio, sys
from gateway.config.schema import BackendSettings
from gateway.upstream.hosted import HostedClient, HostedError

async def main():
    url, model = sys.argv[1], sys.argv[2]
    backend = BackendSettings.model_validate({"id": "h", "kind": "hosted", "region": "us",
        "owner": "o", "provider": "azure", "base_url": url, "api_key_env": "K",
        "models": [{"name": "g", "provider_model": model}],
        "unsafe_unchecked_azure_host": True})
    client = HostedClient(backend, environ={"K": sys.argv[3]}, timeout_s=10)
    try:
        await client.send("chat", {"messages": [{"role": "user", "content": sys.argv[4]}]}, "g")
        print("answered")
    except HostedError as exc:
        print("error", exc.kind, exc.status)
    finally:
        await client.aclose()

asyncio.run(main())
"""


def test_the_azure_client_litellm_makes_for_a_cloudflare_gateway_stops_at_a_redirect() -> None:
    elsewhere = RawBackend(json_answer(completion_body("FROM-ELSEWHERE"))).start()

    async def redirect(writer: asyncio.StreamWriter, _post: Post) -> bool:
        location = f"{elsewhere.url}/v1/chat/completions".encode()
        writer.write(b"HTTP/1.1 307 Temporary Redirect\r\nlocation: %s\r\n" % location)
        writer.write(b"content-length: 0\r\n\r\n")
        await writer.drain()
        return False

    provider = RawBackend(redirect).start()
    try:
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                _SCRIPT,
                f"{provider.url}/gateway.ai.cloudflare.com/v1/acct/gw/azure-openai/resource",
                "azure/deployment",
                KEY,
                PROMPT,
            ],
            env={**os.environ, "AZURE_API_VERSION": "2024-10-21"},
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        provider.stop()
        elsewhere.stop()
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[:2] == ["error", "status"], done.stdout
    assert [PROMPT.encode() in post.body for post in provider.posts] == [True]
    assert elsewhere.connections == 0, [post.head for post in elsewhere.posts]
