"""A request's spill headers over its tenant's spill policy (router/tenants/spill_policy.py):
what they replace, and the refusals of headers the router cannot read or may not follow."""

from __future__ import annotations

import pytest

from tiergate.router.base.errors import RouterError
from tiergate.router.base.tiers import TIERS, Tier
from tiergate.router.tenants.spill_policy import (
    NO_SPILL,
    SPILL_PRICE_HEADER,
    SPILL_TO_HEADER,
    SpillPolicy,
    parse_spill_headers,
)

POLICY = SpillPolicy(
    to=("premium",), max_output_usd_per_million=25.0, not_for_tools=("wafer-scale",)
)
ALL: tuple[Tier, ...] = TIERS


def parsed(headers: dict[str, str], allowed: tuple[Tier, ...] = ALL) -> SpillPolicy:
    return parse_spill_headers(headers, POLICY, allowed, "team-a")


def refused(headers: dict[str, str], allowed: tuple[Tier, ...] = ALL) -> RouterError:
    with pytest.raises(RouterError) as caught:
        parsed(headers, allowed)
    return caught.value


def test_no_header_keeps_the_tenant_s_policy() -> None:
    assert parsed({}) is POLICY
    assert parsed({"x-other": "1"}) is POLICY


@pytest.mark.parametrize(
    ("value", "to"),
    [
        ("none", ()),
        (" None ", ()),
        ("wafer-scale", ("wafer-scale",)),
        ("wafer-scale, premium", ("premium", "wafer-scale")),  # TIERS order
        ("PREMIUM,premium,", ("premium",)),
    ],
)
def test_the_to_header_replaces_only_the_tiers(value: str, to: tuple[Tier, ...]) -> None:
    policy = parsed({SPILL_TO_HEADER: value})
    assert policy == SpillPolicy(to, POLICY.max_output_usd_per_million, POLICY.not_for_tools)


@pytest.mark.parametrize(("value", "price"), [("12.5", 12.5), (" 0 ", 0.0), ("1e3", 1000.0)])
def test_the_price_header_replaces_only_the_cap(value: str, price: float) -> None:
    policy = parsed({SPILL_PRICE_HEADER: value})
    assert policy == SpillPolicy(POLICY.to, price, POLICY.not_for_tools)


def test_both_headers_replace_both_and_not_for_tools_still_holds() -> None:
    policy = parsed({SPILL_TO_HEADER: "premium,wafer-scale", SPILL_PRICE_HEADER: "100"})
    assert policy.to == ("premium", "wafer-scale")
    assert policy.max_output_usd_per_million == 100.0
    assert policy.tiers_for(has_tools=True) == ("premium",)  # the tenant's notForTools
    assert policy.tiers_for(has_tools=False) == ("premium", "wafer-scale")


@pytest.mark.parametrize(
    "headers",
    [
        {SPILL_TO_HEADER: "premium"},
        {SPILL_TO_HEADER: "premium,wafer-scale", SPILL_PRICE_HEADER: "1e9"},
        {SPILL_PRICE_HEADER: "100"},
        {SPILL_TO_HEADER: "none"},
    ],
)
def test_headers_never_move_a_request_of_a_tenant_without_a_policy(
    headers: dict[str, str],
) -> None:
    """The tenants file says whether a tenant's requests may move at all; its clients don't."""
    assert parse_spill_headers(headers, NO_SPILL, ALL, "team-b") == NO_SPILL


@pytest.mark.parametrize(
    ("headers", "status"),
    [({SPILL_TO_HEADER: "fast"}, 400), ({SPILL_PRICE_HEADER: "cheap"}, 400),
     ({SPILL_TO_HEADER: "wafer-scale"}, 403)],
)  # fmt: skip
def test_headers_are_checked_for_a_tenant_without_a_policy_too(
    headers: dict[str, str], status: int
) -> None:
    with pytest.raises(RouterError) as caught:
        parse_spill_headers(headers, NO_SPILL, ("batched", "premium"), "team-b")
    assert caught.value.status == status


@pytest.mark.parametrize("value", ["fast", "premium,fast", "", " , ", "none,premium", "all"])
def test_an_unknown_tier_is_400_invalid_spill_policy(value: str) -> None:
    error = refused({SPILL_TO_HEADER: value})
    assert (error.status, error.type, error.code) == (
        400,
        "invalid_request_error",
        "invalid_spill_policy",
    )
    assert error.param == SPILL_TO_HEADER and "batched, premium, wafer-scale" in error.message


def test_a_tier_the_tenant_may_not_use_is_403() -> None:
    error = refused({SPILL_TO_HEADER: "premium,wafer-scale"}, allowed=("batched", "premium"))
    assert (error.status, error.type, error.code) == (403, "permission_error", "tier_not_allowed")
    assert "'wafer-scale'" in error.message and "team-a" in error.message
    assert "batched, premium" in error.message


def test_an_unknown_tier_is_refused_before_a_forbidden_one() -> None:
    error = refused({SPILL_TO_HEADER: "wafer-scale,fast"}, allowed=("batched",))
    assert (error.status, error.code) == (400, "invalid_spill_policy")


@pytest.mark.parametrize("value", ["cheap", "", "-1", "-0.01", "nan", "NaN", "inf", "-inf",
                                   "1e400", "0x10", "12 USD"])  # fmt: skip
def test_a_bad_price_is_400_invalid_spill_policy(value: str) -> None:
    error = refused({SPILL_PRICE_HEADER: value})
    assert (error.status, error.code, error.param) == (
        400,
        "invalid_spill_policy",
        SPILL_PRICE_HEADER,
    )
    assert "a number >= 0" in error.message


def test_a_refusal_quotes_at_most_a_little_of_the_header() -> None:
    error = refused({SPILL_TO_HEADER: "x" * 10_000})
    assert len(error.message) < 300
    error = refused({SPILL_PRICE_HEADER: "9" * 400 + "x"})
    assert len(error.message) < 300
