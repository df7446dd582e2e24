"""`ProofReads` (gateway/api/tenant_reads.py): the inclusion proofs a process reads at
once, in all and per tenant; past either bound a 429 with `retry-after: 1`, and a read
that ends (or fails) gives its place back."""

from __future__ import annotations

import contextlib

import pytest

from gateway.api.tenant_reads import PROOF_READS, PROOF_READS_PER_TENANT, ProofReads
from gateway.errors import ErrorCode, GatewayError


def _refusal(reads: ProofReads, tenant: str) -> GatewayError:
    with pytest.raises(GatewayError) as caught, reads.taken(tenant):
        pass
    return caught.value


def test_one_tenant_reads_at_most_its_part_and_another_tenant_still_reads() -> None:
    reads = ProofReads()
    with contextlib.ExitStack() as held:
        for _ in range(PROOF_READS_PER_TENANT):
            held.enter_context(reads.taken("acme"))
        refused = _refusal(reads, "acme")
        assert refused.code is ErrorCode.rate_limit_exceeded and refused.status == 429
        assert (b"retry-after", b"1") in refused.headers
        assert "one tenant" in refused.message
        with reads.taken("other"):
            assert reads.reading("other") == 1
        assert reads.reading("acme") == PROOF_READS_PER_TENANT
    assert reads.reading("acme") == 0
    with reads.taken("acme"):  # its places came back
        pass


def test_the_process_reads_at_most_its_bound_whoever_asks() -> None:
    reads = ProofReads()
    tenants = [f"t{i}" for i in range(PROOF_READS)]
    with contextlib.ExitStack() as held:
        for tenant in tenants:
            held.enter_context(reads.taken(tenant))
        refused = _refusal(reads, "newcomer")
        assert refused.status == 429 and "the gateway already reads" in refused.message
        assert reads.reading("newcomer") == 0  # a refusal holds nothing
    with reads.taken("newcomer"):
        pass


def test_a_read_that_fails_gives_its_place_back() -> None:
    reads = ProofReads(most=1, per_tenant=1)
    with pytest.raises(ValueError, match="no checkpoint"), reads.taken("acme"):
        raise ValueError("no checkpoint covers it yet")
    assert reads.reading("acme") == 0
    with reads.taken("other"):
        pass
