"""The entries a log holds from their append until its next checkpoint take the memory of
their own size, not of the buffer the encoder wrote them into.

orjson (`gateway.canonical`) returns each record in a buffer of about 4 KiB whatever its
length; `LogStore` kept those very objects for its next snapshot (every
`checkpoint_interval_ms`, 5 s for `owngate attest`), so each request held some 4 KiB per
record until then: ten times a record's size, at whatever rate clients send requests.
"""

from __future__ import annotations

import gc
import tracemalloc
from pathlib import Path

from gateway.canonical import canonical_json_of_plain
from gateway.provenance.formats.merkle import leaf_hash
from gateway.provenance.formats.wal import encode_frame
from gateway.provenance.testing import seeded_signer
from gateway.provenance.writer.store import LogStore

ORIGIN = "gateway.example/log/compact"
COUNT = 500


def _records(count: int) -> list[bytes]:
    return [
        canonical_json_of_plain({"kind": "dispatch", "request_id": f"req_{n:024x}", "n": n})
        for n in range(count)
    ]


def test_the_encoder_output_is_held_in_a_larger_buffer() -> None:
    """What makes the test below mean something: the encoder's output takes more memory
    than its length (if a later orjson stops doing so, this fails, not the next one)."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        entries = _records(COUNT)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held > 4 * sum(len(e) for e in entries)


def test_entries_waiting_for_a_checkpoint_take_their_own_size(tmp_path: Path) -> None:
    store = LogStore.open(tmp_path / "log", ORIGIN, [seeded_signer(ORIGIN)])
    try:
        tracemalloc.start()
        try:
            gc.collect()
            before = tracemalloc.get_traced_memory()[0]
            entries = _records(COUNT)
            size = sum(len(e) for e in entries)
            pairs = [(entry, leaf_hash(entry)) for entry in entries]
            store.append_frames(pairs, b"".join(encode_frame(e, h) for e, h in pairs))
            del entries, pairs
            gc.collect()
            held = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert store.size == COUNT
        # each entry: its bytes object (~33 bytes of header), its 32-byte leaf hash (~65),
        # their tuple (~56) and a slot of the list: some 200 bytes besides its own length
        assert held < size + 200 * COUNT, (held, size)
        assert len(store.snapshot().entries) == COUNT  # still held until the snapshot
    finally:
        store.close()
