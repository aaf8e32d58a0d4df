"""Which tier serves a request (router/request/tier_choice.py), decided over a pool view with no
node and no I/O: a request a gateway carries reaches pods alone, so a tier or model that only
hosted pools serve is none of its own, while the router's own port serves them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tiergate.router.base.errors import RouterError
from tiergate.router.config import parse_config
from tiergate.router.discovery.view import PoolView, build_view
from tiergate.router.request.body import CompletionRequest, parse_completion
from tiergate.router.request.tier_choice import choose_tier, tiers_to_try
from tiergate.router.tenants.registry import Tenant
from tiergate.sim_nodes.catalogs import default_catalog

ANYONE = Tenant("anyone")


def view_of(key: Path) -> PoolView:
    """`coder` on pods in batched and premium and on a provider in wafer-scale; `solo` on the
    provider alone."""
    key.write_text("provider-key\n")
    hosted = (
        f"model: llama-3.1-8b, billing: {{outputPerMillionUsd: 2}}, "
        f"endpoint: {{url: 'https://api.example.com/v1', model: m, apiKeyFile: '{key}'}}"
    )

    def pods(i: int) -> str:
        return (
            "model: llama-3.1-8b, accelerator: h100-sxm, batching: {maxNumSeqs: 8}, "
            f"endpoints: ['http://10.0.0.{i}:8000']"
        )

    config = parse_config(
        "router: {}\npools:\n"
        f"  - {{name: b, tier: batched, servedModelName: coder, {pods(1)}}}\n"
        f"  - {{name: p, tier: premium, servedModelName: coder, {pods(2)}}}\n"
        f"  - {{name: w, tier: wafer-scale, servedModelName: coder, {hosted}}}\n"
        f"  - {{name: s, tier: batched, servedModelName: solo, {hosted}}}\n"
    )
    return build_view(config.pools, default_catalog())


def request(model: str = "coder", **fields: object) -> CompletionRequest:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], **fields}
    return parse_completion(json.dumps(body).encode(), chat=True)


WAFER = {"x-tiergate-tier": "wafer-scale"}


def test_the_router_s_own_port_serves_every_tier_and_model(tmp_path: Path) -> None:
    view = view_of(tmp_path / "key")
    assert choose_tier(WAFER, request(), view, ANYONE)[1] == "wafer-scale"
    assert choose_tier({}, request("solo"), view, ANYONE)[1] == "batched"
    assert view.tiers_serving("coder") == ("batched", "premium", "wafer-scale")


def test_a_gateway_s_request_for_a_tier_only_hosted_pools_serve_is_a_400_saying_why(
    tmp_path: Path,
) -> None:
    view = view_of(tmp_path / "key")
    with pytest.raises(RouterError) as refused:
        choose_tier(WAFER, request(), view, ANYONE, hosted=False)
    assert (refused.value.status, refused.value.code) == (400, "tier_not_served")
    assert "only by hosted pools" in str(refused.value)
    assert "through the gateway: batched, premium" in str(refused.value)


def test_a_gateway_s_auto_request_falls_back_to_and_tries_only_tiers_with_pods(
    tmp_path: Path,
) -> None:
    view = view_of(tmp_path / "key")
    choice, tier = choose_tier(WAFER, request(service_tier="auto"), view, ANYONE, hosted=False)
    assert tier == "batched"
    assert tiers_to_try(view, "coder", choice, tier, ANYONE, hosted=False) == [
        "batched",
        "premium",
    ]
    assert tiers_to_try(view, "coder", choice, tier, ANYONE) == [
        "batched",
        "premium",
        "wafer-scale",
    ]


def test_a_gateway_s_request_for_a_model_only_hosted_pools_serve_is_a_404_saying_why(
    tmp_path: Path,
) -> None:
    with pytest.raises(RouterError) as refused:
        choose_tier({}, request("solo"), view_of(tmp_path / "key"), ANYONE, hosted=False)
    assert (refused.value.status, refused.value.code) == (404, "model_not_found")
    assert "only by hosted pools" in str(refused.value) and "own port" in str(refused.value)


def test_auto_tries_only_the_other_tiers_whose_context_holds_the_request(tmp_path: Path) -> None:
    """A request longer than every pool of a tier serves would be refused there."""
    view = view_of(tmp_path / "key")
    choice, tier = choose_tier({}, request(service_tier="auto"), view, ANYONE)
    assert tiers_to_try(view, "coder", choice, tier, ANYONE, context=131_072) == [
        "batched", "premium", "wafer-scale"]  # fmt: skip
    assert tiers_to_try(view, "coder", choice, tier, ANYONE, context=131_073) == ["batched"]


def test_a_batch_needs_the_context_of_its_longest_prompt() -> None:
    batch = parse_completion(
        json.dumps({"model": "coder", "prompt": [[1] * 10, [1] * 3000, [1] * 20],
                    "max_tokens": 5}).encode(),
        chat=False,
    )  # fmt: skip
    assert (batch.prompts, batch.prompt_tokens_estimate) == (3, 3030)
    assert batch.context_needed == 3000 + 5
    text = parse_completion(
        json.dumps({"model": "coder", "prompt": ["hi", "word " * 4000]}).encode(), chat=False
    )
    assert text.context_needed == len("word " * 4000) // 4 + 1
