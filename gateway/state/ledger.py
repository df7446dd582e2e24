"""Per-tenant accounting on one process: GCRA for requests and tokens, a slot count.

Both budgets are GCRA (the generic cell rate algorithm: a token bucket kept as one
number). A tenant's *theoretical arrival time* `tat` runs ahead of the clock by the time
its recent use takes to replenish. Times are whole microseconds, so this module and the
Lua scripts on Redis (`gateway.state.lua`) compute exactly the same numbers.

- requests per minute `R`: a request costs `I = 60 s / R` (rounded); it is admitted while
  `max(tat, now) - now <= (R - 1) * I`, then `tat = max(tat, now) + I`. A burst of `R`
  fits at once, then one every `I`. Refused: retry after `max(tat, now) - now - (R-1)*I`.
  A request refused later, at its token reservation, keeps its charge: the gateway read
  and parsed its body (OpenAI counts failed requests against the limit too).
- tokens per minute `T`: `n` tokens cost `n * 60 s / T` (rounded). An admission first
  checks that some budget is left (`tat - now < 60 s`; refused: retry after
  `tat - now - 60 s` plus 1 us), before the request's body is read. Once the body is
  parsed, the request *reserves* what it may use (`reserve`: its prompt estimate and
  completion limit, at most `T`): it fits while `max(tat, now) + cost - now <= 60 s`,
  then `tat = max(tat, now) + cost`; refused: retry after the excess. So a burst is
  admitted only as far as its reservations fit the minute's budget. When the request
  ends, `settle` replaces the reservation by the tokens charged: the difference
  `delta = cost(used) - cost(reserved)` moves `tat` back (a refund: `max(tat + delta,
  now)`) or on (`max(tat, now) + delta`). The debt is capped at `MAX_DEBT_US` (30
  days): usage is what a backend reports, and the cap keeps every time an exact double
  in Lua and every expiry within what Redis accepts.
- concurrent `C`: admitted while fewer than `C` are held.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gateway.state.types import LimitName, RateLimited, TenantLimits, TenantUse

__all__ = [
    "CONCURRENCY_RETRY_S",
    "MAX_DEBT_US",
    "WINDOW_US",
    "Ledger",
    "request_interval_us",
    "request_wait_us",
    "reservation_wait_us",
    "settled_tat",
    "tokens_cost_us",
    "tokens_wait_us",
]

WINDOW_US = 60_000_000
# A slot frees whenever some request of the tenant ends; nothing better to promise.
CONCURRENCY_RETRY_S = 1.0
# The furthest a tenant's token budget may run ahead of the clock (30 days), whatever
# usage a backend reports.
MAX_DEBT_US = 30 * 24 * 3600 * 1_000_000


def request_interval_us(per_minute: int) -> int:
    return max(1, (WINDOW_US + per_minute // 2) // per_minute)  # rounded half up, as in Lua


def request_wait_us(tat: int, now: int, per_minute: int) -> int:
    """Microseconds until one more request fits (0: it fits now)."""
    interval = request_interval_us(per_minute)
    return max(0, max(tat, now) - now - (per_minute - 1) * interval)


def tokens_cost_us(tokens: int, per_minute: int) -> int:
    return (tokens * WINDOW_US + per_minute // 2) // per_minute


def tokens_wait_us(tat: int, now: int) -> int:
    """Microseconds until some token budget is left (0: there is some now)."""
    over = tat - now - WINDOW_US
    return 0 if over < 0 else over + 1


def reservation_wait_us(tat: int, now: int, cost: int) -> int:
    """Microseconds until a reservation costing `cost` fits (0: it fits now)."""
    return max(0, max(tat, now) + cost - now - WINDOW_US)


def settled_tat(tat: int, now: int, delta: int) -> int:
    """The token budget's `tat` once a reservation is replaced by what was charged
    (`delta`: cost of the tokens used less cost of the tokens reserved). A refund moves
    it back, never before `now` (a full budget); an extra charge moves it on from now at
    the earliest, at most `MAX_DEBT_US` ahead."""
    if delta < 0:
        return max(tat + delta, now)
    return min(max(tat, now) + delta, now + MAX_DEBT_US)


def _charged(tat: int, now: int, per_minute: int) -> int:
    """A requests budget's `tat` once one more request is counted, capped at a full
    bucket."""
    interval = request_interval_us(per_minute)
    return min(max(tat, now) + interval, now + per_minute * interval)


def _pending_tat(tat: int, now: int, pending: int, per_minute: int) -> int:
    """A tokens budget's `tat` with `pending` tokens counted as reserved."""
    return tat if pending <= 0 else max(tat, now) + tokens_cost_us(pending, per_minute)


def _at_whole(cost: int, per_minute: int, whole: TenantLimits | None) -> int | None:
    """A tokens cost charged at a share's `per_minute`, at the whole limit's (None
    without one): as many tokens, each worth less budget time."""
    if whole is None or whole.tokens_per_minute is None:
        return None
    return cost * per_minute // whole.tokens_per_minute


@dataclass(slots=True)
class _Account:
    requests_tat: int = 0
    tokens_tat: int = 0
    spent_tat: int = 0  # requests counted at the whole limit's interval (`count_request`)
    spent_tokens_tat: int = 0  # tokens charged, at the whole limit (`reserve`, `settle`)
    held: int = 0
    reserved: int = 0  # tokens reserved by requests not yet settled


class Ledger:
    """The accounts of every tenant seen by this process (one event loop, no threads).

    `clock` returns seconds (monotonic); it is read as whole microseconds."""

    def __init__(self, clock: Callable[[], float], *, spent: bool = False) -> None:
        self._clock = clock
        self._accounts: dict[str, _Account] = {}
        # `spent`: every tenant's requests and tokens budgets start used up as of now
        # (a restarted worker: `MemoryState`'s `restarted`), refilling from here
        self._spent_at = self._now() if spent else None

    def _now(self) -> int:
        return round(self._clock() * 1_000_000)

    def _account(self, tenant: str) -> _Account:
        account = self._accounts.get(tenant)
        if account is None:
            account = self._accounts[tenant] = _Account()
            if self._spent_at is not None:  # a whole window used at `_spent_at`
                account.requests_tat = account.tokens_tat = self._spent_at + WINDOW_US
        return account

    def check(
        self, tenant: str, limits: TenantLimits, pending: tuple[int, int] = (0, 0)
    ) -> RateLimited | None:
        """The refusal an admission would get now, or None; changes nothing. `pending`:
        requests and tokens another decides (Redis) whose outcome is not known yet,
        counted as charged."""
        account = self._account(tenant)
        now = self._now()
        waits: list[tuple[float, LimitName, int]] = []
        if limits.concurrent is not None and account.held >= limits.concurrent:
            waits.append((CONCURRENCY_RETRY_S, "concurrent", limits.concurrent))
        rpm = limits.requests_per_minute
        if rpm is not None:
            tat = account.requests_tat
            if pending[0] > 0:
                tat = max(tat, now) + pending[0] * request_interval_us(rpm)
            wait = request_wait_us(tat, now, rpm)
            if wait > 0:
                waits.append((wait / 1e6, "requests_per_minute", rpm))
        tpm = limits.tokens_per_minute
        if tpm is not None:
            wait = tokens_wait_us(_pending_tat(account.tokens_tat, now, pending[1], tpm), now)
            if wait > 0:
                waits.append((wait / 1e6, "tokens_per_minute", tpm))
        if not waits:
            return None
        wait_s, name, value = max(waits)
        return RateLimited(tenant, name, value, wait_s)

    def admit(self, tenant: str, limits: TenantLimits) -> bool:
        """Admit one request or raise `RateLimited`; True when it holds a slot."""
        refusal = self.check(tenant, limits)
        if refusal is not None:
            raise refusal
        self.count_request(tenant, limits)
        if limits.concurrent is None:
            return False
        self.hold(tenant)
        return True

    def count_request(
        self, tenant: str, limits: TenantLimits, whole: TenantLimits | None = None
    ) -> None:
        """Charge one request to the requests budget without checking it. The debt is
        capped at a full bucket, so admissions decided elsewhere (Redis) never make a
        later local decision wait longer than one request's interval. With `whole` (the
        global limits `limits` are a share of), also count it at the whole limit's
        interval, capped at its full bucket: what this replica admitted, for a restore
        (`backlog_us`; the share's capped debt would lose all beyond one share)."""
        rpm = limits.requests_per_minute
        if rpm is None:
            return
        account = self._account(tenant)
        now = self._now()
        account.requests_tat = _charged(account.requests_tat, now, rpm)
        if whole is not None and whole.requests_per_minute is not None:
            account.spent_tat = _charged(account.spent_tat, now, whole.requests_per_minute)

    def reserve(
        self,
        tenant: str,
        limits: TenantLimits,
        tokens: int,
        *,
        check: bool,
        whole: TenantLimits | None = None,
        pending: int = 0,
    ) -> int:
        """Reserve `tokens` (at most the whole budget: more could never fit) of the
        tenant's tokens budget; returns the tokens reserved. With `check`, raise
        `RateLimited` when they do not fit now (`pending` tokens, whose reservation
        another decides, counted as reserved); without, reserve them anyway (a
        reservation Redis made, mirrored here). With `whole` (the global limits `limits`
        are a share of), the cost is also counted at the whole limit, for a restore."""
        tpm = limits.tokens_per_minute
        if tpm is None or tokens <= 0:
            return 0
        tokens = min(tokens, tpm)
        account = self._account(tenant)
        now = self._now()
        cost = tokens_cost_us(tokens, tpm)
        wait = reservation_wait_us(_pending_tat(account.tokens_tat, now, pending, tpm), now, cost)
        if check and wait > 0:
            raise RateLimited(tenant, "tokens_per_minute", tpm, wait / 1e6)
        account.tokens_tat = min(max(account.tokens_tat, now) + cost, now + MAX_DEBT_US)
        account.reserved += tokens
        spent = _at_whole(cost, tpm, whole)
        if spent is not None:
            account.spent_tokens_tat = min(
                max(account.spent_tokens_tat, now) + spent, now + MAX_DEBT_US
            )
        return tokens

    def settle(
        self,
        tenant: str,
        limits: TenantLimits,
        reserved: int,
        used: int,
        whole: TenantLimits | None = None,
    ) -> None:
        """Replace a reservation of `reserved` tokens by the `used` tokens charged (with
        `whole`, at the whole limit too: `reserve`)."""
        tpm = limits.tokens_per_minute
        if tpm is None or (reserved <= 0 and used <= 0):
            return
        account = self._account(tenant)
        account.reserved = max(0, account.reserved - reserved)
        delta = tokens_cost_us(max(0, used), tpm) - tokens_cost_us(max(0, reserved), tpm)
        if delta != 0:
            now = self._now()
            account.tokens_tat = settled_tat(account.tokens_tat, now, delta)
            spent = _at_whole(delta, tpm, whole)
            if spent is not None:
                account.spent_tokens_tat = settled_tat(account.spent_tokens_tat, now, spent)

    def hold(self, tenant: str) -> None:
        self._account(tenant).held += 1

    def unhold(self, tenant: str) -> None:
        account = self._account(tenant)
        account.held = max(0, account.held - 1)

    def held(self, tenant: str) -> int:
        account = self._accounts.get(tenant)
        return 0 if account is None else account.held

    def use(self, tenant: str, limits: TenantLimits) -> TenantUse:
        """What `tenant` uses of `limits` now, as the GCRA state holds it: requests and
        tokens not yet replenished (the use within the last minute's window) and slots
        held, tokens reserved by requests in flight; None for a limit that is not set (no
        use is kept of it)."""
        account = self._accounts.get(tenant, _Account())
        now = self._now()
        rpm, tpm = limits.requests_per_minute, limits.tokens_per_minute
        requests = None
        if rpm is not None:
            interval = request_interval_us(rpm)
            requests = -(-max(0, account.requests_tat - now) // interval)  # ceiling
        tokens = None
        if tpm is not None:
            tokens = max(0, account.tokens_tat - now) * tpm // WINDOW_US
        inflight = None if limits.concurrent is None else account.held
        reserved = None if tpm is None else account.reserved
        return TenantUse(inflight=inflight, requests=requests, tokens=tokens, reserved=reserved)

    def backlog_us(self, tenant: str) -> tuple[int, int]:
        """How far `tenant`'s requests and tokens budgets run ahead of now (us, 0 when
        whole), as counted at the whole limits (`count_request`'s, `reserve`'s and
        `settle`'s `whole`): what a restore puts back."""
        account = self._accounts.get(tenant)
        if account is None:
            return 0, 0
        now = self._now()
        return max(0, account.spent_tat - now), max(0, account.spent_tokens_tat - now)

    def held_by_tenant(self) -> dict[str, int]:
        """Tenants holding slots now, with their counts."""
        return {t: a.held for t, a in self._accounts.items() if a.held > 0}
