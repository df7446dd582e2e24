"""An attested backend's sidecar is sent the request's salts (`x-owngate-salts`), so that
it commits to the bytes with the gateway's own commitments. When that attempt fails and
another backend serves, the answer's commitment in the log must not be salted with a
salt the failed backend's host was given: with it, that host (another party: it holds
its own key, and may read the published log) could confirm a guess of an answer it never
saw, e.g. a one-word verdict. Each later dispatch gets its own response salt; the client's
receipt carries it, and opens the served answer's commitment.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from pathlib import Path

from gateway.provenance import write_signing_key
from gateway.provenance.formats.attestation import parse_salts
from tests.helpers.audit_rig import (
    ANSWER,
    JSON,
    WHOLE,
    client_gets,
    later_receipt,
    logged,
    settled,
    whole_answer,
    writes,
)
from tests.helpers.gateways import Gateway, backend
from tests.helpers.independent_audit import audit
from tests.helpers.log_truth import salt_of
from tests.helpers.raw_backend import ERROR_BODY, Answer, RawBackend, json_answer


def test_the_served_answer_is_not_salted_with_what_a_failed_sidecar_was_sent(
    start_raw: Callable[[Answer], RawBackend],
    start_gateway: Callable[..., Gateway],
    tmp_path: Path,
) -> None:
    sidecar_vkey = write_signing_key(tmp_path / "sidecar.key", "gpu-a")
    failing = json_answer(ERROR_BODY, b"503 Service Unavailable")  # it saw the salts
    attested, plain = start_raw(failing), start_raw(writes(whole_answer(200, ANSWER, JSON)))
    gateway, vkey = logged(
        start_gateway,
        tmp_path,
        [
            backend("gpu-a", attested.url, "m", attest={"key": sidecar_vkey}),
            backend("gpu-b", plain.url, "m"),
        ],
        routing={"default": {"strategy": "round_robin"}},
    )
    received = client_gets(gateway, WHOLE)
    assert received.status == 200, received.body
    assert len(attested.posts) == 1 and len(plain.posts) == 1
    sent = parse_salts(attested.posts[0].header_values(b"x-owngate-salts")[0])
    assert sent is not None
    _, response_salt = salt_of(base64.b64decode(received.headers["x-owngate-receipt"]))
    assert response_salt != sent.response, "gpu-a's host was given the answer's salt"
    request_id = received.headers["x-request-id"]
    settled(tmp_path / "log", vkey, request_id)
    later = later_receipt(gateway, request_id)
    assert audit(received, tmp_path / "log", vkey, later_receipt=later) == []
