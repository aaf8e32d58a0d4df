"""Per-tenant rate limits: requests per minute and tokens per minute, as token buckets.

Each limited tenant has up to two buckets holding at most one minute's allowance and refilling
continuously at limit/60 per second, so a tenant may burst its full per-minute allowance and then
proceeds at the steady rate. A request costs one request-token and its *estimated* tokens
(prompt + max output) at `check`; after the response, `settle` corrects the token bucket by the
difference between actual and estimated usage, so accounting follows real usage. A request whose
estimate exceeds the whole per-minute allowance is admitted once the bucket is full and leaves the
bucket in debt, rather than being refused forever.

Time comes from an injected monotonic clock (`time.monotonic` by default), or `now_s` passed to
each call. Every operation is O(1); state is one small record per tenant that has limits, so
memory is bounded by the number of tenants (`prune` drops tenants removed by a reload). Not
thread-safe: used from the event loop thread only.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

from tiergate.router.base.errors import RouterError
from tiergate.router.tenants.registry import Tenant

__all__ = ["RateLimiter", "rate_limited"]

_WINDOW_S = 60.0


@dataclass(slots=True)
class _Bucket:
    level: float  # may go negative: debt from usage beyond the estimate
    updated_s: float

    def refill(self, capacity: float, now_s: float) -> None:
        # A clock that steps backwards refills nothing rather than draining the bucket.
        elapsed_s = max(0.0, now_s - self.updated_s)
        self.level = min(capacity, self.level + elapsed_s * capacity / _WINDOW_S)
        self.updated_s = max(self.updated_s, now_s)

    def wait_s(self, capacity: float, needed: float) -> float:
        """Seconds until the bucket holds `needed` (0 if it already does)."""
        deficit = needed - self.level
        return deficit * _WINDOW_S / capacity if deficit > 0 else 0.0


@dataclass(slots=True)
class _TenantBuckets:
    requests: _Bucket | None = None
    tokens: _Bucket | None = None


class RateLimiter:
    """Requests/min and tokens/min per tenant; a tenant with no limits costs nothing."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._tenants: dict[str, _TenantBuckets] = {}

    def check(self, tenant: Tenant, now_s: float | None = None, estimated_tokens: int = 0) -> None:
        """Admit one request or raise RouterError(429) with an integer `Retry-After` >= 1.

        On success the request and its estimated tokens are taken from the buckets; on refusal
        nothing is taken.
        """
        rpm, tpm = tenant.requests_per_minute, tenant.tokens_per_minute
        if rpm is None and tpm is None:
            return
        now = self._clock() if now_s is None else now_s
        buckets = self._buckets(tenant.name)
        wait_s = 0.0
        reasons = []
        if rpm is not None:
            buckets.requests = _refilled(buckets.requests, rpm, now)
            request_wait_s = buckets.requests.wait_s(rpm, 1.0)
            if request_wait_s > 0:
                wait_s = max(wait_s, request_wait_s)
                reasons.append(f"{rpm} requests per minute")
        if tpm is not None:
            buckets.tokens = _refilled(buckets.tokens, tpm, now)
            # Capped at capacity so an estimate above the whole allowance is still admissible.
            token_wait_s = buckets.tokens.wait_s(tpm, min(float(estimated_tokens), tpm))
            if token_wait_s > 0:
                wait_s = max(wait_s, token_wait_s)
                reasons.append(f"{tpm} tokens per minute")
        if reasons:
            raise rate_limited(tenant, reasons, wait_s)
        if buckets.requests is not None:
            buckets.requests.level -= 1.0
        if buckets.tokens is not None:
            buckets.tokens.level -= estimated_tokens

    def needs_lease(self, tenant: Tenant, estimated_tokens: int) -> bool:
        """Never: one process's buckets need no database round trip."""
        return False

    async def lease(self, tenant: Tenant, estimated_tokens: int) -> None:
        return None

    def settle(self, tenant: Tenant, now_s: float | None = None, token_delta: int = 0) -> None:
        """Correct the token bucket by `actual_tokens - estimated_tokens` after a request.

        A negative delta (the request used less than estimated, or was never served) gives
        tokens back; a positive one takes more, possibly into debt.
        """
        tpm = tenant.tokens_per_minute
        if tpm is None or token_delta == 0:
            return
        now = self._clock() if now_s is None else now_s
        buckets = self._buckets(tenant.name)
        buckets.tokens = _refilled(buckets.tokens, tpm, now)
        buckets.tokens.level = min(float(tpm), buckets.tokens.level - token_delta)

    def prune(self, keep: Collection[str]) -> None:
        """Forget tenants not in `keep` (after a reload removed them)."""
        for name in [name for name in self._tenants if name not in keep]:
            del self._tenants[name]

    def _buckets(self, name: str) -> _TenantBuckets:
        buckets = self._tenants.get(name)
        if buckets is None:
            buckets = self._tenants[name] = _TenantBuckets()
        return buckets


def rate_limited(tenant: Tenant, reasons: list[str], wait_s: float) -> RouterError:
    """The 429 for a request the tenant's `reasons` (e.g. "60 requests per minute") refuse,
    with an integer `Retry-After` >= 1 from `wait_s`."""
    retry_after_s = max(1, math.ceil(wait_s))
    return RouterError(
        429,
        f"rate limit exceeded for tenant {tenant.name!r}: {' and '.join(reasons)}; "
        f"retry after {retry_after_s} s",
        type="rate_limit_error",
        code="rate_limit_exceeded",
        headers={"Retry-After": str(retry_after_s)},
    )


def _refilled(bucket: _Bucket | None, capacity: int, now_s: float) -> _Bucket:
    # A new bucket (or a limit just added by a reload) starts full.
    if bucket is None:
        return _Bucket(level=float(capacity), updated_s=now_s)
    bucket.refill(float(capacity), now_s)
    return bucket
