"""A Bedrock call's AWS signing never reaches the log, at `logging.level: debug` too.

LiteLLM signs a Bedrock request with botocore's SigV4 signer, and botocore's debug lines
wrote the whole canonical request (`x-amz-security-token:<the session token>` among its
headers, and the SHA-256 of the request body: an unsalted hash of the prompt, which
confirms a guessed one), the string to sign and the signature into the gateway's log,
once per request. A real `owngate serve` at `debug`, a Bedrock backend on loopback, AWS
credentials that are canaries: none of them, nor the body's hash or the signature the
provider was sent, is in the gateway's output.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import httpx

from gateway.tenants import hash_api_key
from tests.helpers.gateways import HOSTED_ONLY_POLICY, LITELLM_WARNINGS
from tests.helpers.net import free_port
from tests.helpers.processes import GatewayProcess
from tests.helpers.raw_backend import RawBackend, json_answer

pytestmark = LITELLM_WARNINGS

KEY = "og-aws-signing-tenant-key-0123456789"
SESSION_TOKEN = "SecAwsSessionToken" + "t" * 30
SECRET_KEY = "SecAwsSecretKey" + "s" * 25
# A Bedrock Converse answer.
CONVERSE = (
    b'{"output": {"message": {"role": "assistant", "content": [{"text": "FROM-PROVIDER"}]}},'
    b' "stopReason": "end_turn", "usage": {"inputTokens": 1, "outputTokens": 1, "totalTokens": 2}}'
)


def test_a_bedrock_calls_signing_is_not_logged(tmp_path: Path) -> None:
    provider = RawBackend(json_answer(CONVERSE)).start()
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "hosted.yaml").write_text(HOSTED_ONLY_POLICY)
    config = {
        "listen": {"host": "127.0.0.1", "port": free_port()},
        "logging": {"format": "json", "level": "debug", "access_log": True},
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
        "AWS_ACCESS_KEY_ID": "AKIAEXAMPLEEXAMPLE00",
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_SESSION_TOKEN": SESSION_TOKEN,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_CONFIG_FILE": os.devnull,
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
    # It was signed with the session token: botocore's signer ran in the gateway.
    assert post.header_values(b"x-amz-security-token") == [SESSION_TOKEN.encode()]
    (authorization,) = post.header_values(b"authorization")
    signature = authorization.rpartition(b"Signature=")[2].decode()
    output = gateway.stdout() + gateway.stderr()
    for secret in (SESSION_TOKEN, SECRET_KEY, hashlib.sha256(post.body).hexdigest(), signature):
        assert secret not in output, secret
