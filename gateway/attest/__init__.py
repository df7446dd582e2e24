"""`owngate attest`: the sidecar beside a private inference server that countersigns what
it served (two-party receipts, docs/provenance.md "Layer 3").

`Notary` numbers, signs and logs statements; `AttestRelay` relays a request to the backend,
computes both commitments from the bytes it relays and hands the countersignature back;
`gateway.attest.protocol` is its own HTTP/1.1 listener (the gateway listener's limits,
without uvicorn or ASGI); `serve` and `AttestThread` run it; `listener_context` is its TLS
when it is the backend's mutual-TLS endpoint.
"""

from gateway.attest.app import AttestRelay
from gateway.attest.listener import listener_context
from gateway.attest.notary import Notary
from gateway.attest.server import AttestThread, serve
from gateway.attest.settings import AttestSettings

__all__ = ["AttestRelay", "AttestSettings", "AttestThread", "Notary", "listener_context", "serve"]
