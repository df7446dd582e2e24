"""`owngate attest`: the sidecar beside a private inference server that countersigns what
it served (two-party receipts, docs/provenance.md "Layer 3").

`Notary` numbers, signs and logs statements; `AttestApp` is the raw-ASGI relay that
computes both commitments from the bytes it relays and hands the countersignature back;
`listener_context` is its TLS when it is the backend's mutual-TLS endpoint.
"""

from gateway.attest.app import AttestApp, AttestSettings
from gateway.attest.listener import listener_context, tls_options
from gateway.attest.notary import Notary

__all__ = ["AttestApp", "AttestSettings", "Notary", "listener_context", "tls_options"]
