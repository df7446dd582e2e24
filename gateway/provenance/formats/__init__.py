"""The log's data formats and their math: encode, decode, hash, sign, verify.

C2SP signed notes (`note`), checkpoints (`checkpoint`), cosignatures (`cosignature`) and
inclusion proofs (`proofs`); RFC 6962 Merkle hashing (`merkle`); the tlog-tiles layout
(`tiles`, `tree`, `layout`); the write-ahead frames (`wal`); records (`records`, their
closed `schema`), salted commitments (`commitments`; `stream_body`: the bytes of a stream
as received that a response commitment covers) and DSSE receipts (`receipts`: per
request, its `receipt_payload` signed itself; or per batch, `receipt_batch`, a Merkle
root of payloads signed once; `dsse` the envelope rules both share).

Pure: no threads, no event loop, no writes. The only I/O is reading a log directory's
files (`tiles.TileReader`, `layout`, `wal.scan_segment`). This wing imports no other wing
of `gateway.provenance`: the writer, the auditor's tools and the witness all build on it.
"""

__all__: list[str] = []
