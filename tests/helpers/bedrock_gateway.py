"""One chat call through a real `owngate serve` whose only backend is Bedrock Converse on a
loopback `RawBackend` (`base_url`, declared `region: eu-west-1`), with AWS credentials the
test names: what the client got, what the provider was sent, and the gateway's output."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from gateway.tenants import hash_api_key
from tests.helpers.gateways import HOSTED_ONLY_POLICY
from tests.helpers.net import free_port
from tests.helpers.processes import GatewayProcess
from tests.helpers.raw_backend import Post, RawBackend, json_answer

KEY = "og-bedrock-gateway-key-0123456789"
# A Bedrock Converse answer.
CONVERSE = (
    b'{"output": {"message": {"role": "assistant", "content": [{"text": "FROM-PROVIDER"}]}},'
    b' "stopReason": "end_turn", "usage": {"inputTokens": 1, "outputTokens": 1, "totalTokens": 2}}'
)


@dataclass(frozen=True)
class BedrockCall:
    answer: httpx.Response
    post: Post  # the one request the provider got
    output: str  # the gateway's stdout and stderr


def bedrock_call(
    tmp_path: Path, credentials: dict[str, str], logging: dict[str, Any] | None = None
) -> BedrockCall:
    """Start the provider and the gateway (AWS profile files: none; `credentials` added to
    its environment), ask one chat, stop both."""
    provider = RawBackend(json_answer(CONVERSE)).start()
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "hosted.yaml").write_text(HOSTED_ONLY_POLICY)
    config: dict[str, Any] = {
        "listen": {"host": "127.0.0.1", "port": free_port()},
        "policy": {"paths": [str(policies)]},
        "backends": [
            {
                "id": "hosted",
                "kind": "hosted",
                "provider": "aws",
                "base_url": provider.url,
                "owner": "aws",
                "region": "eu-west-1",
                "retention": {"days": 0, "zero_data_retention": True},
                "models": [
                    {
                        "name": "m",
                        "provider_model": "bedrock/converse/anthropic.claude-3-haiku-20240307-v1:0",
                    }
                ],
            }
        ],
        "tenants": [{"id": "acme", "api_key_hashes": [hash_api_key(KEY)], "models": ["*"]}],
    }
    if logging is not None:
        config["logging"] = logging
    env = {"AWS_SHARED_CREDENTIALS_FILE": os.devnull, "AWS_CONFIG_FILE": os.devnull}
    gateway = GatewayProcess(config, tmp_path / "gw", env={**env, **credentials})
    try:
        gateway.start()
        answer = httpx.post(
            f"{gateway.url}/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hello"}]},
            headers={"authorization": f"Bearer {KEY}"},
            timeout=60,
        )
    finally:
        gateway.stop()
        provider.stop()
    assert answer.status_code == 200, (answer.text, gateway.output())
    (post,) = provider.posts
    return BedrockCall(answer, post, gateway.stdout() + gateway.stderr())
