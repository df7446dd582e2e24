"""What sealing a batch of receipts and giving one its header cost in Python calls
(gateway/provenance/formats/receipt_batch.py, gateway/canonical.py,
gateway/api/exchange.py): each receipt's JCS encoding and its base64 (its path's hashes,
its payload, the header) are calls into C, with no Python frame of their own around
them; and the bytes are what `base64.b64encode` and orjson with sorted keys give."""

from __future__ import annotations

import base64
from types import SimpleNamespace
from typing import Any

import orjson

from gateway.api.exchange import receipt_headers_now
from gateway.canonical import canonical_json_of_plain
from gateway.provenance import seal_receipts
from gateway.provenance.testing import seeded_signer
from tests.helpers.python_calls import python_calls

LOG = seeded_signer("gateway.example/log/1")
_RECEIPTS = 12


def _payloads() -> list[tuple[int, bytes]]:
    return [
        (index, canonical_json_of_plain({"request_id": f"req_{index}", "v": 1}))
        for index in range(100, 100 + _RECEIPTS)
    ]


def test_a_batch_s_receipts_cost_no_call_per_encoding() -> None:
    payloads = _payloads()
    sealed: list[bytes] = []
    calls = python_calls(lambda: sealed.extend(seal_receipts(payloads, LOG.name, LOG)))
    encodings = [c for c in calls if c.endswith(("/base64.py:b64encode", ":_fast_dumps"))]
    # the batch statement's envelope (its payload and signature), once per batch: none
    # per receipt
    assert len(encodings) <= 2, encodings
    for position, (receipt, (_, payload)) in enumerate(zip(sealed, payloads, strict=True)):
        value = orjson.loads(receipt)
        assert receipt == orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
        assert value["position"] == position
        assert value["payload"] == base64.b64encode(payload).decode()
        assert all(len(base64.b64decode(node, validate=True)) == 32 for node in value["path"])


def test_a_receipt_header_is_the_receipt_in_base64() -> None:
    receipt = seal_receipts(_payloads(), LOG.name, LOG)[3]
    future: Any = SimpleNamespace(done=lambda: True, cancelled=lambda: False)
    trail = SimpleNamespace(receipt=future, receipt_now=lambda: receipt, receipt_failed=False)
    exchange: Any = SimpleNamespace(trail=trail)
    calls = python_calls(lambda: receipt_headers_now(exchange))
    assert not [c for c in calls if c.endswith("/base64.py:b64encode")], calls
    assert receipt_headers_now(exchange) == ((b"x-owngate-receipt", base64.b64encode(receipt)),)
