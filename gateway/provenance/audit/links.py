"""Completion -> dispatch links, as `verify_log` checks them entry by entry: a completion
links to an earlier, still open dispatch of the same request, by index and leaf hash; a
dispatch stays open until its completion."""

from __future__ import annotations

from gateway.provenance.errors import LogVerificationError
from gateway.provenance.formats.records import Record

__all__ = ["RecordLinks"]


def _fail(reason: str, index: int) -> LogVerificationError:
    return LogVerificationError(reason, index=index)


class RecordLinks:
    """Completion -> dispatch links: dispatches stay open until their completion."""

    def __init__(self) -> None:
        self.open: dict[int, tuple[str, bytes]] = {}

    def check(self, index: int, record: Record, leaf: bytes) -> None:
        if record.type == "dispatch":
            self.open[index] = (record.request_id, leaf)
            return
        if record.type != "completion":
            return
        link = record.data["dispatch"]
        target, target_hash = link["index"], bytes.fromhex(link["hash"])
        if target >= index:
            raise _fail(f"completion links to entry {target}, which is not earlier", index)
        found = self.open.pop(target, None)
        if found is None:
            raise _fail(
                f"completion links to entry {target}, which is not an open dispatch record "
                "(not a dispatch, or already completed)",
                index,
            )
        request_id, dispatch_hash = found
        if request_id != record.request_id:
            raise _fail(
                f"completion of request {record.request_id!r} links to the dispatch of "
                f"request {request_id!r} at entry {target}",
                index,
            )
        if dispatch_hash != target_hash:
            raise _fail(f"completion's link hash differs from entry {target}'s hash", index)
