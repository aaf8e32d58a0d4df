"""The bench's workload: --mix parsing, seeded draws, prompt size, request bodies."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from tiergate.bench.errors import BenchError
from tiergate.bench.workload import (
    DEFAULT_MIX,
    TOOL_MIN_MAX_TOKENS,
    TOOL_NAME,
    Workload,
    parse_max_tokens,
    parse_mix,
    synthetic_prompt,
)
from tiergate.sim_nodes.commands.common import CliError
from tiergate.sim_nodes.server.tokenizer import count_chat_tokens
from tiergate.sim_nodes.tiers import DEFINITIONS


def workload(**overrides: object) -> Workload:
    fields: dict[str, object] = {
        "mix": {"batched": 0.6, "premium": 0.3, "wafer-scale": 0.1},
        "input_tokens": 200,
        "max_tokens": 16,
        "tools_fraction": 0.25,
        "seed": 7,
    }
    fields.update(overrides)
    return Workload(**fields)  # type: ignore[arg-type]


def test_mix_parses_relative_weights_and_drops_zero_ones() -> None:
    assert parse_mix("batched=.6, premium=0.3,wafer-scale=.1") == {
        "batched": 0.6,
        "premium": 0.3,
        "wafer-scale": 0.1,
    }
    assert parse_mix("premium=3,batched=0") == {"premium": 3.0}


def test_the_default_mix_is_each_tier_s_traffic_share() -> None:
    assert parse_mix(DEFAULT_MIX) == {
        d.name: d.traffic_share for d in DEFINITIONS.values() if d.traffic_share > 0
    }
    assert DEFAULT_MIX == "batched=.6,premium=.3,wafer-scale=.1"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("turbo=1", "unknown tier 'turbo'"),
        ("batched=-0.5", "must be a finite number >= 0"),
        ("batched=nan", "must be a finite number >= 0"),
        ("batched=inf", "must be a finite number >= 0"),
        ("batched=0,premium=0", "add up to 0"),
        ("batched", "expected tier=weight"),
        ("batched=", "expected tier=weight"),
        ("batched=.5,,premium=.5", "expected tier=weight"),
        ("batched=lots", "not a number"),
        ("batched=1,batched=2", "given twice"),
    ],
)
def test_bad_mix_is_a_cli_error(text: str, message: str) -> None:
    with pytest.raises(CliError, match=message) as caught:
        parse_mix(text)
    assert isinstance(caught.value, BenchError) and "\n" not in str(caught.value)


def test_plan_is_reproducible_from_the_seed() -> None:
    assert workload().plan(50) == workload().plan(50)
    assert workload().plan(50) != workload(seed=8).plan(50)


def test_draws_follow_the_mix_and_the_tools_fraction() -> None:
    plan = workload().plan(4000)
    tiers = Counter(r.tier for r in plan)
    assert tiers["batched"] / 4000 == pytest.approx(0.6, abs=0.03)
    assert tiers["premium"] / 4000 == pytest.approx(0.3, abs=0.03)
    assert tiers["wafer-scale"] / 4000 == pytest.approx(0.1, abs=0.02)
    assert sum(r.with_tools for r in plan) / 4000 == pytest.approx(0.25, abs=0.03)
    assert [r.index for r in plan] == list(range(4000))
    assert len({r.seed for r in plan}) > 3990  # each request gets its own seed


def test_only_tiers_with_weight_are_drawn() -> None:
    plan = workload(mix={"premium": 1.0}, tools_fraction=0.0).plan(100)
    assert {r.tier for r in plan} == {"premium"} and not any(r.with_tools for r in plan)


@pytest.mark.parametrize("tokens", [1, 10, 512, 4000])
def test_prompt_is_about_the_requested_size(tokens: int) -> None:
    prompt = synthetic_prompt(tokens, random.Random(1))
    counted = count_chat_tokens([(None, [prompt])])
    assert counted == max(tokens, 7)


def test_body_is_a_streaming_chat_with_usage_and_a_forced_tool() -> None:
    w = workload(tools_fraction=1.0)
    request = w.plan(1)[0]
    body = w.body(request, "m")
    assert body["model"] == "m" and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["seed"] == request.seed
    assert body["messages"] == [{"role": "user", "content": request.prompt}]
    assert body["tools"][0]["function"]["name"] == TOOL_NAME
    assert body["tool_choice"]["function"]["name"] == TOOL_NAME
    # A tool call must not be cut off by a tiny cap and then blamed on the model.
    assert body["max_tokens"] == TOOL_MIN_MAX_TOKENS

    plain = workload(tools_fraction=0.0)
    body = plain.body(plain.plan(1)[0], "m")
    assert "tools" not in body and body["max_tokens"] == 16


def test_a_range_of_caps_draws_each_request_s_from_it_and_leaves_other_draws_alone() -> None:
    ranged = workload(min_max_tokens=8, max_tokens=24, tools_fraction=0.0)
    plan = ranged.plan(400)
    caps = Counter(ranged.body(r, "m")["max_tokens"] for r in plan)
    assert set(caps) == set(range(8, 25))  # every cap of the range, none outside it
    assert plan == ranged.plan(400)  # seeded
    fixed = workload(tools_fraction=0.0).plan(400)
    assert [(r.tier, r.seed, r.prompt) for r in plan] == [(r.tier, r.seed, r.prompt) for r in fixed]
    assert {r.max_tokens for r in fixed} == {None}


@pytest.mark.parametrize(
    ("text", "parsed"), [("128", (None, 128)), ("8-24", (8, 24)), (" 5-5 ", (5, 5))]
)
def test_max_tokens_is_a_number_or_a_range(text: str, parsed: tuple[int | None, int]) -> None:
    assert parse_max_tokens(text) == parsed


@pytest.mark.parametrize("text", ["0", "24-8", "0-4", "8-", "-8", "lots", "1.5"])
def test_a_bad_max_tokens_is_a_cli_error(text: str) -> None:
    with pytest.raises(BenchError, match="--max-tokens: expected"):
        parse_max_tokens(text)
