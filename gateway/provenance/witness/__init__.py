"""A C2SP tlog-witness, and the client a log uses to ask one for cosignatures.

`witness.Witness` decides and cosigns (the add-checkpoint rules), remembering the latest
tree per log in `state`; `app` serves it as a raw ASGI app; `client` is the other side of
the same exchange, used by the log writer.

Imports `formats` only: a witness runs without the log writer or the auditor's tools.
"""

__all__: list[str] = []
