"""A Bedrock call is signed for the declared AWS Region, with a `base_url` too.

A Bedrock backend with a `base_url` sends its calls to that URL, but LiteLLM signs them
(SigV4) for the Region it picks itself: the call's `aws_region_name`, else the
environment's (`AWS_REGION_NAME`, `AWS_REGION`, boto3's), else `us-west-2`. The gateway
named no Region on such a call (gateway/upstream/provider_regions.py pinned only the
calls without a `base_url`), so a backend declared `region: eu-west-1` signed its calls
for `us-west-2`, or for whatever Region the environment named: a real regional endpoint
refuses them. A real `owngate serve`, a Bedrock backend on loopback: the Authorization
header's credential scope names the declared Region, whatever the environment says.
"""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from gateway.tenants import hash_api_key
from tests.helpers.gateways import HOSTED_ONLY_POLICY, LITELLM_WARNINGS
from tests.helpers.net import free_port
from tests.helpers.processes import GatewayProcess
from tests.helpers.raw_backend import RawBackend, json_answer

pytestmark = LITELLM_WARNINGS

KEY = "og-aws-signing-region-key-0123456789"
ACCESS_KEY_ID = "AKIAEXAMPLEEXAMPLE00"
# A Bedrock Converse answer.
CONVERSE = (
    b'{"output": {"message": {"role": "assistant", "content": [{"text": "FROM-PROVIDER"}]}},'
    b' "stopReason": "end_turn", "usage": {"inputTokens": 1, "outputTokens": 1, "totalTokens": 2}}'
)


@pytest.mark.parametrize("environment", [{}, {"AWS_REGION_NAME": "us-east-1"}])
def test_a_bedrock_call_to_a_base_url_is_signed_for_the_declared_region(
    tmp_path: Path, environment: dict[str, str]
) -> None:
    provider = RawBackend(json_answer(CONVERSE)).start()
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "hosted.yaml").write_text(HOSTED_ONLY_POLICY)
    config = {
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
    env = {
        "AWS_ACCESS_KEY_ID": ACCESS_KEY_ID,
        "AWS_SECRET_ACCESS_KEY": "example-secret-access-key",
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_CONFIG_FILE": os.devnull,
        **environment,
    }
    gateway = GatewayProcess(config, tmp_path / "gw", env=env)
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
    (authorization,) = post.header_values(b"authorization")
    # AWS4-HMAC-SHA256 Credential=<key id>/<date>/<region>/<service>/aws4_request, ...
    credential = authorization.partition(b"Credential=")[2].partition(b",")[0].decode()
    key_id, _date, region, service, terminator = credential.split("/")
    assert (key_id, region, service, terminator) == (
        ACCESS_KEY_ID,
        "eu-west-1",
        "bedrock",
        "aws4_request",
    ), credential
