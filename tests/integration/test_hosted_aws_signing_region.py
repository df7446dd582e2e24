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

from pathlib import Path

import pytest

from tests.helpers.bedrock_gateway import bedrock_call
from tests.helpers.gateways import LITELLM_WARNINGS

pytestmark = LITELLM_WARNINGS

ACCESS_KEY_ID = "AKIAEXAMPLEEXAMPLE00"


@pytest.mark.parametrize("environment", [{}, {"AWS_REGION_NAME": "us-east-1"}])
def test_a_bedrock_call_to_a_base_url_is_signed_for_the_declared_region(
    tmp_path: Path, environment: dict[str, str]
) -> None:
    credentials = {
        "AWS_ACCESS_KEY_ID": ACCESS_KEY_ID,
        "AWS_SECRET_ACCESS_KEY": "example-secret-access-key",
        **environment,
    }
    call = bedrock_call(tmp_path, credentials)
    (authorization,) = call.post.header_values(b"authorization")
    # AWS4-HMAC-SHA256 Credential=<key id>/<date>/<region>/<service>/aws4_request, ...
    credential = authorization.partition(b"Credential=")[2].partition(b",")[0].decode()
    key_id, _date, region, service, terminator = credential.split("/")
    assert (key_id, region, service, terminator) == (
        ACCESS_KEY_ID,
        "eu-west-1",
        "bedrock",
        "aws4_request",
    ), credential
