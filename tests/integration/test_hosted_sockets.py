"""Idle connections to hosted providers are within the listener's share.

`gateway/upstream/sockets.py` bounds the private pools' backend connections, idle ones
included; LiteLLM's aiohttp connector kept every connection a hosted call gave back for
15 s (`AIOHTTP_KEEPALIVE_TIMEOUT`), up to 1,000, counted by nothing of the gateway's. So
the attack that test_out_of_descriptors.py closes for private backends still worked with
hosted ones: under an open-file limit of 128 (cap 32), 30 requests at once to each of
three hosted backends in turn, and the third round met the limit (503s, connections
reset, the policy watcher failing with EMFILE). LiteLLM's connectors now count in the
same share (`gateway/upstream/hosted_sockets.py`).
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.helpers.descriptor_rounds import burst, start_at_128, three_backends
from tests.helpers.gateways import Sim, hosted_backend
from tests.helpers.processes import KEY

POLICY = """\
apiVersion: policy.owngate.dev/v1
kind: Policy
metadata: {id: hosted-abc, version: "1"}
spec:
  tenants: [acme]
  residency: {allow: [eu]}
  retention: {max_days: zero}
  fallback:
    mode: when_private_unavailable
    to: [{backend: ha}, {backend: hb}, {backend: hc}]
"""


def test_idle_hosted_connections_stay_within_the_listener_s_share(
    start_sim: Callable[..., Sim], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sims = {m: start_sim("vllm", models=(m,), decode_tokens_per_s=20) for m in "abc"}
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "hosted.yaml").write_text(POLICY)
    config = three_backends(sims)
    config["backends"] = [hosted_backend(f"h{m}", f"{s.url}/v1", m) for m, s in sims.items()]
    config["policy"] = {"paths": [str(tmp_path / "policies")]}
    monkeypatch.setenv("HOSTED_KEY", "sk-test")  # inherited by the gateway
    gateway = start_at_128(config, tmp_path)
    try:
        warm = {"model": "a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        headers = {"authorization": f"Bearer {KEY}"}
        answer = httpx.post(
            f"{gateway.url}/v1/chat/completions", json=warm, headers=headers, timeout=120
        )
        assert answer.status_code == 200, answer.text  # LiteLLM loaded
        for model in "abc":
            burst(gateway, model)
    finally:
        gateway.stop(signal.SIGKILL)
