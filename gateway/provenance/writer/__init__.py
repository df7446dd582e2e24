"""The log writer the gateway runs: durable appends, checkpoints, receipts, cosignatures.

`log.ProvenanceLog` is the asyncio face (group commit through `queued`, `signal`, `outage`
and `sealer`); `store.LogStore` its synchronous core over a `segment_writer`, in a
`log_directory` it locks (`recovery` is what it rebuilds and refuses on open, `high_water`
the newest checkpoint kept outside the directory so that an emptied or older directory is
refused, not forked); the
`checkpointer` builds and signs checkpoints beside the appends; the
`cosignature_collector` asks witnesses to cosign them; `preflight` is what
`owngate config validate` checks before a log is opened.

Imports `formats` and, to ask witnesses, `witness.client`; never `audit`.
"""

__all__: list[str] = []
