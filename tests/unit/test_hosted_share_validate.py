"""The share hosted connectors join stays the running gateway's when a candidate config is
validated (`POST /admin/v1/config/validate`, `owngate config validate` in-process).

`Registry.build` used to point the process's hosted share at the registry it built, and
validating a candidate builds one (with a `BackendSockets` of the candidate's cap): every
hosted connector made after it joined that throwaway share, its connections no longer
counted with the running private pools' (the descriptor exhaustion the share prevents)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gateway.api.app import GatewayApp
from gateway.app import assemble
from gateway.upstream.sockets import hosted_share
from gateway.validation import validate
from tests.helpers.gateways import backend, gateway_config


def test_validating_a_candidate_leaves_the_hosted_share_the_running_one(tmp_path: Path) -> None:
    config = gateway_config([backend("gpu", "http://127.0.0.1:9", "m")])

    async def scenario() -> None:
        app = GatewayApp(assemble(config, {}, config_dir=tmp_path), tmp_path)
        running = app.parts.registry.sockets
        assert hosted_share() is running
        candidate = gateway_config(
            [backend("gpu", "http://127.0.0.1:9", "m")], listen={"max_connections": 100000}
        )
        assert validate(candidate, environ={}, config_dir=tmp_path, secrets=False) == []
        assert hosted_share() is running  # new hosted connectors still join the running one
        await app.parts.registry.close()

    asyncio.run(scenario())
