"""One worker of `owngate serve --workers N` as it knows itself: its place among the
workers, read from the environment its supervisor (`gateway.workers`) starts it with
(`OWNGATE_WORKER_INDEX`, `OWNGATE_WORKER_RUNTIME_DIR`), and what it changes in each config
it loads (`for_worker`): its own provenance log, origin and high-water file, and its own
shared-state replica id."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path

from gateway.config.schema import GatewaySettings

__all__ = ["INDEX_ENV", "RUNTIME_ENV", "WorkerIdentity", "for_worker", "worker_identity"]

INDEX_ENV = "OWNGATE_WORKER_INDEX"
RUNTIME_ENV = "OWNGATE_WORKER_RUNTIME_DIR"


@dataclasses.dataclass(frozen=True, slots=True)
class WorkerIdentity:
    index: int  # 1..N
    runtime_dir: Path


def worker_identity(environ: Mapping[str, str]) -> WorkerIdentity | None:
    """This process's place among the workers; None when it is not a worker."""
    index = environ.get(INDEX_ENV)
    runtime = environ.get(RUNTIME_ENV)
    if not index or not runtime:
        return None
    return WorkerIdentity(int(index), Path(runtime))


def for_worker(
    identity: WorkerIdentity | None, config_dir: Path = Path(".")
) -> Callable[[GatewaySettings], GatewaySettings]:
    """What a worker changes in a loaded config (read from `config_dir`): its own
    provenance log, origin and high-water file (`ProvenanceSettings.for_worker`), and its
    own shared-state replica id when one is configured (each worker holds its own leases
    and in-flight counts, so two must never share an id)."""

    def prepare(config: GatewaySettings) -> GatewaySettings:
        if identity is None:
            return config
        update: dict[str, object] = {}
        if config.provenance is not None:
            update["provenance"] = config.provenance.for_worker(identity.index, config_dir)
        if config.state.replica_id:
            update["state"] = config.state.model_copy(
                update={"replica_id": f"{config.state.replica_id}-worker-{identity.index}"}
            )
        return config.model_copy(update=update) if update else config

    return prepare
