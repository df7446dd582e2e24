"""Signed provenance log: which backend served each request, under which policy.

An RFC 6962 Merkle log of RFC 8785 records, stored in the C2SP tlog-tiles layout, with
C2SP tlog-checkpoint / signed-note (Ed25519) checkpoints, DSSE receipts and C2SP tlog-proof
inclusion proofs. Only the standard library and `cryptography` are needed: an auditor can
install this package without the server. See docs/provenance.md.

The gateway uses `ProvenanceLog` (writer), the record builders, `Salts` / `commit` and
`seal_receipts` / `make_receipt`; auditors use `verify_log`, `verify_receipt`,
`verify_tlog_proof` and `verify_commitment`, all of which raise a `ProvenanceError` rather
than return a bool.

The package is in wings, each a subpackage:

- `formats/`  the data formats and their math (notes, checkpoints, cosignatures, Merkle
  proofs, tiles, WAL frames, records, commitments, receipts): pure, no threads, no writes;
- `writer/`   the log the gateway writes (`ProvenanceLog`), its checkpointer, sealer,
  cosignature collector and `preflight`;
- `audit/`    what an auditor runs on a copied log: `LogDirectory`, `verify_log`, summaries;
- `witness/`  a C2SP tlog-witness (core, state file, ASGI app) and its client.

Beside them, shared: `errors` (the one error hierarchy), `files` (durable writes), `keys`
(signing key files); `testing` has helpers for tests of code that writes a log.

The wing rules, besides the shared modules (tests/integration/test_import_contract.py checks them):
`formats` imports no other wing; `audit` and `witness` import only `formats`; `writer`
imports `formats` and, to ask witnesses for cosignatures, `witness.client`; no wing
imports `audit`. So the formats an independent verifier reimplements are all in
`formats/`, and each wing reads on its own.
"""

from gateway.provenance.audit.reader import LogDirectory
from gateway.provenance.audit.verify import LogSummary, verify_log
from gateway.provenance.errors import (
    CommitmentMismatchError,
    KeyFormatError,
    LogCorruptedError,
    LogForkError,
    LogUnavailableError,
    LogVerificationError,
    MalformedError,
    ProofError,
    ProvenanceError,
    RecordError,
    SignatureError,
)
from gateway.provenance.formats.checkpoint import (
    Checkpoint,
    SignedCheckpoint,
    open_checkpoint,
    sign_checkpoint,
)
from gateway.provenance.formats.commitments import (
    REQUEST_DOMAIN,
    RESPONSE_DOMAIN,
    BodyKind,
    Salts,
    commit,
    commit_digest,
    verify_commitment,
)
from gateway.provenance.formats.note import Signer, Verifier, open_note, sign_note
from gateway.provenance.formats.proofs import TlogProof, verify_tlog_proof
from gateway.provenance.formats.receipt_batch import seal_receipts
from gateway.provenance.formats.receipts import (
    Receipt,
    make_receipt,
    receipt_version,
    verify_receipt,
)
from gateway.provenance.formats.records import (
    BackendRef,
    DataClass,
    LogEntry,
    PolicyRef,
    Record,
    Retention,
    TraceStep,
    Usage,
    completion_record,
    dispatch_record,
    parse_record,
    refusal_record,
    validate_record,
)
from gateway.provenance.keys import (
    generate_signing_key,
    load_signer,
    load_verifiers,
    write_signing_key,
)
from gateway.provenance.writer.log import LogSettings, ProvenanceLog
from gateway.provenance.writer.store import Recovery, SignedNote

__all__ = [
    "REQUEST_DOMAIN",
    "RESPONSE_DOMAIN",
    "BackendRef",
    "BodyKind",
    "Checkpoint",
    "CommitmentMismatchError",
    "DataClass",
    "KeyFormatError",
    "LogCorruptedError",
    "LogDirectory",
    "LogEntry",
    "LogForkError",
    "LogSettings",
    "LogSummary",
    "LogUnavailableError",
    "LogVerificationError",
    "MalformedError",
    "PolicyRef",
    "ProofError",
    "ProvenanceError",
    "ProvenanceLog",
    "Receipt",
    "Record",
    "RecordError",
    "Recovery",
    "Retention",
    "Salts",
    "SignatureError",
    "SignedCheckpoint",
    "SignedNote",
    "Signer",
    "TlogProof",
    "TraceStep",
    "Usage",
    "Verifier",
    "commit",
    "commit_digest",
    "completion_record",
    "dispatch_record",
    "generate_signing_key",
    "load_signer",
    "load_verifiers",
    "make_receipt",
    "open_checkpoint",
    "open_note",
    "parse_record",
    "receipt_version",
    "refusal_record",
    "seal_receipts",
    "sign_checkpoint",
    "sign_note",
    "validate_record",
    "verify_commitment",
    "verify_log",
    "verify_receipt",
    "verify_tlog_proof",
    "write_signing_key",
]
