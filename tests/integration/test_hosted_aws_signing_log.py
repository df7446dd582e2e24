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
from pathlib import Path

from tests.helpers.bedrock_gateway import bedrock_call
from tests.helpers.gateways import LITELLM_WARNINGS

pytestmark = LITELLM_WARNINGS

SESSION_TOKEN = "SecAwsSessionToken" + "t" * 30
SECRET_KEY = "SecAwsSecretKey" + "s" * 25


def test_a_bedrock_calls_signing_is_not_logged(tmp_path: Path) -> None:
    credentials = {
        "AWS_ACCESS_KEY_ID": "AKIAEXAMPLEEXAMPLE00",
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_SESSION_TOKEN": SESSION_TOKEN,
    }
    logging = {"format": "json", "level": "debug", "access_log": True}
    call = bedrock_call(tmp_path, credentials, logging)
    # It was signed with the session token: botocore's signer ran in the gateway.
    assert call.post.header_values(b"x-amz-security-token") == [SESSION_TOKEN.encode()]
    (authorization,) = call.post.header_values(b"authorization")
    signature = authorization.rpartition(b"Signature=")[2].decode()
    body_digest = hashlib.sha256(call.post.body).hexdigest()
    for secret in (SESSION_TOKEN, SECRET_KEY, body_digest, signature):
        assert secret not in call.output, secret
