"""A reload that narrows a data class reaches a labelled request in flight.

The request's attempts are re-decided against the newest set for the label it was
decided for (gateway/api/decided.py, `withdrawn_by_reload`), never as unlabelled: here
the unlabelled rules still allow the hosted fallback, so a re-decision that dropped the
label would let a PHI request out. An unlabelled request is re-decided as unlabelled, so
a `default_data_class` the reload adds applies to it too.

The private backend hangs until the test lets it answer 503 (after the reload), so the
request's next step would be its hosted fallback.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.helpers.gateways import (
    EU_ZERO,
    LITELLM_WARNINGS,
    Gateway,
    Sim,
    backend,
    hosted_backend,
    labelled_chat,
    served,
)
from tests.helpers.raw_backend import Answer, RawBackend, held_503
from tests.helpers.waiting import until

pytestmark = LITELLM_WARNINGS

POLICY = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: eu-health, version: "VERSION"}
spec:
  tenants: [acme]
  residency: {allow: [eu]}
  retention: {max_days: zero}
  fallback:
    mode: when_private_unavailable
    to: [{backend: hosted-eu}]
EXTRA  data_classes:
    phi: PHI
"""


def write(path: Path, version: str, phi: str = "{}", extra: str = "") -> None:
    text = POLICY.replace("VERSION", version).replace("PHI", phi).replace("EXTRA", extra)
    path.write_text(text)


@pytest.mark.parametrize(
    ("label", "narrowed"),
    [
        ("phi", {"phi": "{fallback: {mode: never}}"}),
        (None, {"phi": "{fallback: {mode: never}}", "extra": "  default_data_class: phi\n"}),
    ],
    ids=["labelled", "unlabelled-default-added"],
)
def test_a_reload_narrowing_the_class_in_flight_reaches_no_hosted_backend(
    start_raw: Callable[[Answer], RawBackend],
    start_sim: Callable[..., Sim],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
    label: str | None,
    narrowed: dict[str, str],
) -> None:
    release = threading.Event()
    private = start_raw(held_503(release))
    hosted_sim = start_sim("vllm", models=("m",), zero_latency=True)
    policy = tmp_path / "policies" / "p.yaml"
    policy.parent.mkdir()
    write(policy, "1")
    gateway = start_gateway(
        [
            backend("gpu-eu", private.url, "m", **EU_ZERO),
            hosted_backend("hosted-eu", f"{hosted_sim.url}/v1", "m"),
        ],
        policy={"paths": [str(policy.parent)], "reload_interval_s": 0.05},
        environ={"HOSTED_KEY": "test-key"},
    )
    try:
        with ThreadPoolExecutor(max_workers=1) as pool:
            answer = pool.submit(labelled_chat, gateway, label)
            until(lambda: bool(private.posts), "the private attempt")
            write(policy, "2", **narrowed)
            until(
                lambda: gateway.app.policies.current.compiled("eu-health").version == "2",
                "the reload",
                timeout=30.0,
            )
            # Unlabelled traffic may still fall back under the new set: only the class
            # (or the default that makes an unlabelled request that class) narrowed.
            assert gateway.app.policies.current.decide("acme", "m", "phi").hosted == ()
            release.set()
            response = answer.result(timeout=30)
    finally:
        release.set()
    assert response.status_code == 503, response.text
    assert served(hosted_sim) == 0, "a PHI request fell back to hosted after the reload"
