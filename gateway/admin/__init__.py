"""The admin API: FastAPI on its own listener (`admin.listen`), never on the public port.

The control plane for operators, security teams and auditors: status, policies, config,
reload, drain, keys and the provenance log as C2SP tlog-tiles over HTTP. It reads the
same running parts as the public surface (the composition root hands it the `Runtime`
and the actions as callables) and is the only place owngate imports a web framework:
the public listener stays raw ASGI (docs/architecture.md, "Why no web framework on the
hot path"). docs/admin-api.md describes it; docs/admin-openapi.json is its schema.
"""

__all__: list[str] = []
