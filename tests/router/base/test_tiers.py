"""Tier resolution follows ARCHITECTURE.md's order; unknown tiers are a 400."""

from typing import Any

import pytest

from tiergate.router.base.errors import RouterError
from tiergate.router.base.tiers import Priority, Tier, openai_service_tier, resolve_tier

BOTH = ("batched", "premium")


@pytest.mark.parametrize(
    ("headers", "body", "serving", "tier", "source"),
    [
        ({"x-tiergate-tier": "premium"}, {"service_tier": "flex"}, BOTH, "premium", "header"),
        ({"x-tiergate-tier": " Wafer-Scale "}, {}, ("wafer-scale",), "wafer-scale", "header"),
        ({}, {"speed": "fast", "service_tier": "flex"}, BOTH, "premium", "speed"),
        ({}, {"service_tier": "priority"}, BOTH, "premium", "service_tier"),
        ({}, {"service_tier": "flex"}, BOTH, "batched", "service_tier"),
        ({}, {"service_tier": "default"}, BOTH, "batched", "default"),
        ({}, {"service_tier": "auto"}, BOTH, "batched", "default"),
        ({}, {}, BOTH, "batched", "default"),
        ({}, {"speed": "standard"}, BOTH, "batched", "default"),
        ({}, {}, ("wafer-scale",), "wafer-scale", "model"),
        ({}, {}, ("wafer-scale", "batched"), "batched", "default"),
        ({}, {"service_tier": "priority"}, ("wafer-scale",), "premium", "service_tier"),
    ],
)
def test_first_match_wins(
    headers: dict[str, str], body: dict[str, Any], serving: tuple[str, ...], tier: str, source: str
) -> None:
    choice = resolve_tier(headers, body, serving)  # type: ignore[arg-type]
    assert (choice.tier, choice.source) == (tier, source)


def test_priorities_and_fallback() -> None:
    assert resolve_tier({}, {"service_tier": "flex"}, BOTH).priority == "flex"
    assert resolve_tier({}, {"speed": "fast"}, BOTH).priority == "premium"
    assert resolve_tier({}, {}, BOTH).priority == "standard"
    assert resolve_tier({}, {"service_tier": "auto"}, BOTH).may_fall_back
    assert not resolve_tier({}, {}, BOTH).may_fall_back


@pytest.mark.parametrize(
    ("headers", "body", "param"),
    [
        ({"x-tiergate-tier": "turbo"}, {}, "x-tiergate-tier"),
        ({}, {"speed": "ludicrous"}, "speed"),
        ({}, {"service_tier": "scale"}, "service_tier"),
        ({}, {"service_tier": 3}, "service_tier"),
    ],
)
def test_unknown_tiers_are_400_naming_the_choices(
    headers: dict[str, str], body: dict[str, Any], param: str
) -> None:
    with pytest.raises(RouterError) as caught:
        resolve_tier(headers, body, BOTH)
    err = caught.value
    assert err.status == 400 and err.param == param and "choose one of" in err.message
    assert err.envelope()["error"]["code"] == "unknown_tier"


@pytest.mark.parametrize(
    ("tier", "priority", "service_tier"),
    [
        ("premium", "premium", "priority"),
        ("batched", "standard", "default"),
        ("batched", "flex", "flex"),
        ("wafer-scale", "standard", "default"),
    ],
)
def test_a_reply_s_service_tier_is_openai_s_word_for_the_tier(
    tier: Tier, priority: Priority, service_tier: str
) -> None:
    assert openai_service_tier(tier, priority) == service_tier
