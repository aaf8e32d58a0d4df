"""Rate limits: token buckets per tenant for requests and tokens, on a driven clock."""

import pytest

from tiergate.router.base.errors import RouterError
from tiergate.router.tenants.ratelimit import RateLimiter
from tiergate.router.tenants.registry import ANONYMOUS, Tenant

REQUESTS = Tenant("req", requests_per_minute=60)
TOKENS = Tenant("tok", tokens_per_minute=1000)


def _refused(limiter: RateLimiter, tenant: Tenant, now_s: float, tokens: int = 0) -> RouterError:
    with pytest.raises(RouterError) as caught:
        limiter.check(tenant, now_s, tokens)
    error = caught.value
    assert (error.status, error.type, error.code) == (
        429,
        "rate_limit_error",
        "rate_limit_exceeded",
    )
    return error


def test_requests_per_minute_burst_then_steady_rate() -> None:
    limiter = RateLimiter()
    for _ in range(60):
        limiter.check(REQUESTS, 0.0)
    error = _refused(limiter, REQUESTS, 0.0)
    assert error.headers == {"Retry-After": "1"}
    assert "60 requests per minute" in error.message
    limiter.check(REQUESTS, 1.0)  # one request per second refills
    _refused(limiter, REQUESTS, 1.5)


def test_retry_after_is_an_integer_of_at_least_one_second() -> None:
    limiter = RateLimiter()
    slow = Tenant("slow", requests_per_minute=2)
    limiter.check(slow, 0.0)
    limiter.check(slow, 0.0)
    assert _refused(limiter, slow, 0.0).headers["Retry-After"] == "30"
    assert _refused(limiter, slow, 29.9).headers["Retry-After"] == "1"
    limiter.check(slow, 30.0)


def test_tokens_are_settled_against_actual_usage() -> None:
    limiter = RateLimiter()
    limiter.check(TOKENS, 0.0, 600)
    # 400 left; 600 more need 200, at 1000/60 per second: 12 s.
    assert _refused(limiter, TOKENS, 0.0, 600).headers["Retry-After"] == "12"
    limiter.settle(TOKENS, 0.0, 100 - 600)  # it used only 100
    limiter.check(TOKENS, 0.0, 600)
    limiter.settle(TOKENS, 0.0, 1300 - 600)  # this one used 1300: 300 - 700 = 400 in debt
    assert _refused(limiter, TOKENS, 0.0, 1).headers["Retry-After"] == "25"  # 401 tokens


def test_refusal_takes_nothing() -> None:
    limiter = RateLimiter()
    both = Tenant("both", requests_per_minute=2, tokens_per_minute=1000)
    limiter.check(both, 0.0, 1000)
    _refused(limiter, both, 0.0, 1000)
    _refused(limiter, both, 0.0, 1000)
    limiter.settle(both, 0.0, -1000)  # never served: give the tokens back
    limiter.check(both, 0.0, 1000)  # the second request slot was not spent by the refusals


def test_estimate_above_the_allowance_is_admitted_from_a_full_bucket() -> None:
    limiter = RateLimiter()
    limiter.check(TOKENS, 0.0, 5000)
    error = _refused(limiter, TOKENS, 60.0, 10)  # 4000 in debt, refilled 1000 of it
    assert error.headers["Retry-After"] == "181"
    _refused(limiter, TOKENS, 299.0, 5000)  # waits for a full bucket: 5000 tokens, 300 s
    limiter.check(TOKENS, 300.0, 5000)


def test_settle_never_overfills() -> None:
    limiter = RateLimiter()
    limiter.check(TOKENS, 0.0, 10)
    limiter.settle(TOKENS, 0.0, -10_000)
    limiter.check(TOKENS, 0.0, 1000)
    _refused(limiter, TOKENS, 0.0, 1)


def test_unlimited_tenants_keep_no_state() -> None:
    limiter = RateLimiter()
    for _ in range(10_000):
        limiter.check(ANONYMOUS, 0.0, 10**9)
    limiter.settle(ANONYMOUS, 0.0, 10**9)
    assert not limiter._tenants


def test_injected_clock_and_prune() -> None:
    now = [100.0]
    limiter = RateLimiter(clock=lambda: now[0])
    one = Tenant("one", requests_per_minute=1)
    limiter.check(one)
    with pytest.raises(RouterError):
        limiter.check(one)
    now[0] += 60.0
    limiter.check(one)
    limiter.prune(keep={"someone-else"})
    assert not limiter._tenants
    limiter.check(one)  # forgotten: starts with a full bucket


def test_a_reload_that_lowers_the_limit_caps_the_bucket() -> None:
    limiter = RateLimiter()
    limiter.check(Tenant("t", requests_per_minute=100), 0.0)
    lowered = Tenant("t", requests_per_minute=1)
    limiter.check(lowered, 1.0)
    _refused(limiter, lowered, 1.0)
