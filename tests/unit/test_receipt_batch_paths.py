"""A batch's receipts, sealed with each node of the batch's tree hashed once
(gateway/provenance/formats/receipt_batch.py `_mth_paths`) and the statement's envelope
encoded once (`canonical_part`), are byte for byte the receipts of the RFC 6962
reference: the root of the leaves, each receipt's audit path from
`merkle.inclusion_proof`, each receipt encoded whole as JCS."""

from __future__ import annotations

import base64

import pytest

from gateway.canonical import canonical_json, canonical_json_of_plain
from gateway.provenance import seal_receipts
from gateway.provenance.formats import merkle
from gateway.provenance.formats.dsse import signed_envelope
from gateway.provenance.formats.receipt_batch import BATCH_PAYLOAD_TYPE, BatchStatement
from gateway.provenance.formats.receipt_payload import RECEIPT_PAYLOAD_TYPE
from gateway.provenance.testing import seeded_signer
from tests.helpers.python_calls import python_calls

LOG = seeded_signer("gateway.example/log/1")


def _payloads(size: int, first: int = 40) -> list[tuple[int, bytes]]:
    return [
        (first + 2 * n, canonical_json_of_plain({"request_id": f"req_{n}", "v": 1}))
        for n in range(size)
    ]


def _reference(payloads: list[tuple[int, bytes]]) -> list[bytes]:
    leaves = [merkle.leaf_hash(payload) for _, payload in payloads]
    size = len(leaves)

    def read(height: int, index: int) -> bytes:  # complete subtrees, from the leaves
        return merkle.root_from_leaves(leaves[index << height : (index + 1) << height])

    indices = [index for index, _ in payloads]
    statement = BatchStatement(
        LOG.name, indices[0], indices[-1] - indices[0] + 1, size, merkle.root_from_leaves(leaves)
    )
    batch = signed_envelope(BATCH_PAYLOAD_TYPE, canonical_json(statement.payload()), LOG)
    return [
        canonical_json(
            {
                "batch": batch,
                "path": [
                    base64.b64encode(node).decode()
                    for node in merkle.inclusion_proof(position, size, read)
                ],
                "payload": base64.b64encode(payload).decode(),
                "payloadType": RECEIPT_PAYLOAD_TYPE,
                "position": position,
            }
        )
        for position, (_, payload) in enumerate(payloads)
    ]


@pytest.mark.parametrize("size", [*range(2, 36), 63, 64, 65, 100])
def test_a_batch_s_receipts_are_the_reference_s_bytes(size: int) -> None:
    payloads = _payloads(size)
    assert seal_receipts(payloads, LOG.name, LOG) == _reference(payloads)


def test_each_node_of_a_batch_s_tree_is_hashed_once() -> None:
    # 15 leaves: 14 inner nodes. Each receipt's path from its own range hashes (the
    # reference) hashes the right edge's nodes again for every leaf to their left.
    payloads = _payloads(15)
    calls = python_calls(lambda: seal_receipts(payloads, LOG.name, LOG))
    assert sum(1 for c in calls if c.endswith("merkle.py:node_hash")) == 14, calls
