"""Where spill-over moves a request (router/request/spill.py), decided over a pool view, the
tiers' admission queues and the latency predictor, with no node and no I/O: the targets a
policy allows, cheapest first, and the one a request goes to when its tier is saturated or
predicted to miss its SLO."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from tiergate.router.admission import Admission, Grant, Saturation
from tiergate.router.base.tiers import TIERS, Tier
from tiergate.router.config import parse_config
from tiergate.router.discovery.view import PoolView, build_view
from tiergate.router.epp.pick import GatewayOpener
from tiergate.router.policy.latency import LatencyPredictor
from tiergate.router.request.body import CompletionRequest, parse_completion
from tiergate.router.request.spill import Spill, choose_spill, spill_targets
from tiergate.router.tenants.spill_policy import SpillPolicy
from tiergate.router.upstream.proxy import Upstream
from tiergate.sim_nodes.catalogs import default_catalog

TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
EVERYWHERE = SpillPolicy(to=TIERS)
#: The router's clock at every decision here.
NOW_S = 100.0


def pool(name: str, tier: Tier, accelerator: str, price: float, endpoints: int = 1) -> str:
    urls = ", ".join(f"http://10.0.{len(name)}.{i}:8000" for i in range(endpoints))
    return (
        f"  - {{name: {name}, tier: {tier}, model: llama-3.1-8b, accelerator: {accelerator},"
        f" servedModelName: coder, batching: {{maxNumSeqs: 2}}, endpoints: [{urls}],"
        f" billing: {{outputPerMillionUsd: {price}}}}}\n"
    )


def view_of(*pools: str) -> PoolView:
    config = parse_config("router: {}\npools:\n" + "".join(pools))
    return build_view(config.pools, default_catalog())


#: batched on slow GPUs at $1, wafer-scale at $10 and premium at $20 (both on wafer chips).
VIEW_POOLS = (
    pool("b", "batched", "a100-40gb", 1),
    pool("pp", "premium", "wse-3", 20),
    pool("www", "wafer-scale", "wse-3", 10),
)


def request(*, slo_ms: float | None = None, tools: bool = False) -> CompletionRequest:
    body: dict[str, object] = {
        "model": "coder",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 16,
    }
    if tools:
        body["tools"] = [TOOL]
    parsed = parse_completion(json.dumps(body).encode(), chat=True)
    parsed.slo = None if slo_ms is None else (slo_ms / 1000, None)
    return parsed


class Decision:
    """A view, its tiers' queues and the predictor the router would build for it."""

    def __init__(self, *pools: str) -> None:
        self.view = view_of(*(pools or VIEW_POOLS))
        self.admission = Admission(Saturation())
        self.admission.resize(self.view)
        self.predictor = LatencyPredictor(lambda: self.view)

    def targets(
        self,
        policy: SpillPolicy = EVERYWHERE,
        asked: Tier = "batched",
        allowed: tuple[Tier, ...] = TIERS,
        req: CompletionRequest | None = None,
    ) -> tuple[Tier, ...]:
        return spill_targets(self.view, req or request(), asked, allowed, policy)

    def choose(
        self,
        req: CompletionRequest | None = None,
        asked: Tier = "batched",
        targets: tuple[Tier, ...] = ("wafer-scale", "premium"),
    ) -> Spill | None:
        return choose_spill(
            self.admission, self.view, self.predictor, req or request(), asked, targets, NOW_S
        )

    @asynccontextmanager
    async def full(self, tier: Tier) -> AsyncIterator[list[Grant]]:
        """Every router slot of `tier` taken by another tenant (nobody waiting)."""
        queue = self.admission.queues[tier]
        grants = [await queue.acquire("standard", "other") for _ in range(queue.capacity)]
        assert not self.admission.has_room(tier, "coder")
        try:
            yield grants
        finally:
            for grant in grants:
                self.admission.release(grant)

    def queued_at_nodes(self, tier: Tier, waiting: float) -> None:
        """Every endpoint of `tier` reports `waiting` queued requests (a scrape round)."""
        for endpoint in self.view.candidates("coder", tier):
            endpoint.waiting = waiting
        self.admission.saturation.refresh(self.view)


# -- spill_targets -----------------------------------------------------------------------------


def test_targets_are_cheapest_first_and_never_the_asked_tier() -> None:
    decision = Decision()
    assert decision.targets() == ("wafer-scale", "premium")
    assert decision.targets(asked="wafer-scale") == ("batched", "premium")


def test_no_policy_no_targets() -> None:
    assert Decision().targets(SpillPolicy()) == ()


@pytest.mark.parametrize(
    ("cap", "targets"),
    [(None, ("wafer-scale", "premium")), (100, ("wafer-scale", "premium")),
     (20, ("wafer-scale", "premium")), (19.99, ("wafer-scale",)), (10, ("wafer-scale",)),
     (9.99, ()), (0, ())],
)  # fmt: skip
def test_the_price_cap_keeps_the_tiers_at_or_below_it(
    cap: float | None, targets: tuple[Tier, ...]
) -> None:
    assert Decision().targets(SpillPolicy(TIERS, cap)) == targets


@pytest.mark.parametrize("price", [7.7, 0.97, 3.83, 15.3])
def test_a_cap_equal_to_the_tier_s_price_takes_it(price: float) -> None:
    """The price a tenant reads in the pool file is within a cap of the same figure (a price
    per token times a million is a few ulps over it for many prices)."""
    decision = Decision(pool("b", "batched", "a100-40gb", 1), pool("pp", "premium", "wse-3", price))
    assert decision.targets(SpillPolicy(("premium",), price)) == ("premium",)
    assert decision.view.output_usd_per_million("coder", "premium") == price


def test_the_dearest_pool_of_a_tier_is_its_price() -> None:
    decision = Decision(*VIEW_POOLS, pool("pcheap", "premium", "wse-3", 2))
    assert decision.targets(SpillPolicy(TIERS, 15)) == ("wafer-scale",)


def test_tools_exclude_the_not_for_tools_tiers() -> None:
    policy = SpillPolicy(TIERS, None, not_for_tools=("wafer-scale",))
    decision = Decision()
    assert decision.targets(policy, req=request(tools=True)) == ("premium",)
    assert decision.targets(policy, req=request()) == ("wafer-scale", "premium")


def test_only_tiers_the_tenant_may_use() -> None:
    assert Decision().targets(allowed=("batched", "premium")) == ("premium",)


def test_only_tiers_serving_the_model() -> None:
    decision = Decision(pool("b", "batched", "a100-40gb", 1), pool("pp", "premium", "wse-3", 20))
    assert decision.targets() == ("premium",)


async def test_never_a_tier_without_endpoints() -> None:
    """A pool scaled to zero still names its model; its tier has a router slot (every queue has
    one) and no node to report it saturated: a request moved there would be refused 503."""
    decision = Decision(pool("b", "batched", "a100-40gb", 1), pool("pp", "premium", "wse-3", 20, 0))
    assert decision.targets() == ()
    async with decision.full("batched"):
        assert decision.choose(targets=decision.targets()) is None


def hosted_pool(name: str, tier: Tier, price: float, key: Path) -> str:
    """A pool of `tier` on a provider's API: no pod, so no gateway reaches it."""
    key.write_text("provider-key\n")
    return (
        f"  - {{name: {name}, tier: {tier}, model: llama-3.1-8b, servedModelName: coder,"
        f" endpoint: {{url: 'https://api.example.com/v1', model: m, apiKeyFile: '{key}'}},"
        f" billing: {{outputPerMillionUsd: {price}}}}}\n"
    )


async def test_a_gateway_s_request_never_moves_to_a_tier_only_hosted_pools_serve(
    tmp_path: Path,
) -> None:
    """The gateway reaches pods alone: moved to the provider's tier, the request would find no
    endpoint there and be refused 503. The router's own port does move it there."""
    decision = Decision(
        pool("b", "batched", "a100-40gb", 1),
        pool("pp", "premium", "wse-3", 20),
        hosted_pool("www", "wafer-scale", 10, tmp_path / "key"),
    )
    gateway = GatewayOpener(_NoSubset()).usable
    request_ = request()
    assert decision.targets() == ("wafer-scale", "premium")
    targets = spill_targets(decision.view, request_, "batched", TIERS, EVERYWHERE, gateway)
    assert targets == ("premium",)
    async with decision.full("batched"):
        args = (decision.admission, decision.view, decision.predictor, request_, "batched")
        assert choose_spill(*args, ("wafer-scale", "premium"), NOW_S) == Spill(
            "batched", "wafer-scale", "saturated"
        )
        assert choose_spill(*args, ("wafer-scale", "premium"), NOW_S, gateway) == Spill(
            "batched", "premium", "saturated"
        )


def test_a_tier_whose_providers_are_all_at_their_limit_is_no_target(tmp_path: Path) -> None:
    """The router's own port reaches a provider, but one with as many requests open as its
    pool allows would answer 429: its tier is no place to move a request to meanwhile."""
    decision = Decision(
        pool("b", "batched", "a100-40gb", 1),
        pool("pp", "premium", "wse-3", 20),
        hosted_pool("www", "wafer-scale", 10, tmp_path / "key"),
    )
    own = Upstream().usable
    request_ = request()
    assert spill_targets(decision.view, request_, "batched", TIERS, EVERYWHERE, own) == (
        "wafer-scale",
        "premium",
    )
    (provider,) = decision.view.candidates("coder", "wafer-scale")
    assert provider.hosted is not None
    provider.inflight = provider.hosted.max_concurrent
    assert spill_targets(decision.view, request_, "batched", TIERS, EVERYWHERE, own) == ("premium",)


class _NoSubset:
    """A gateway that names no subset of endpoints: it may send to any pod."""

    subset = None


def test_never_a_tier_whose_pools_are_all_shorter_than_the_request() -> None:
    """Its engines would refuse it (400 context_length_exceeded), where it waits or is shed
    in its own tier."""
    short = pool("pp", "premium", "wse-3", 20).replace(
        "billing:", "maxContextTokens: 4096, billing:"
    )
    decision = Decision(pool("b", "batched", "a100-40gb", 1), short, VIEW_POOLS[2])
    assert decision.targets() == ("wafer-scale", "premium")
    assert decision.targets(req=long_request()) == ("wafer-scale",)


def long_request() -> CompletionRequest:
    """About 6,000 tokens of prompt: longer than a 4,096-token context."""
    body = {"model": "coder", "messages": [{"role": "user", "content": "word " * 6000}],
            "max_tokens": 16}  # fmt: skip
    return parse_completion(json.dumps(body).encode(), chat=True)


async def test_a_long_request_moves_only_where_an_endpoint_that_holds_it_can_take_it(
    tmp_path: Path,
) -> None:
    """wafer-scale's pods serve 4,096 tokens, its provider the model's whole context. A long
    request may move there while the provider can take it; not while the provider is at its
    limit (the context-filter would shed it there with 429, where it could wait in its own
    tier) nor while it is ejected. The pods still count for a short request."""
    short = pool("www", "wafer-scale", "wse-3", 10).replace(
        "billing:", "maxContextTokens: 4096, billing:"
    )
    decision = Decision(
        pool("b", "batched", "a100-40gb", 1),
        pool("pp", "premium", "wse-3", 20),
        short,
        hosted_pool("wwh", "wafer-scale", 10, tmp_path / "key"),
    )
    own = Upstream().usable
    longer = long_request()

    def targets(req: CompletionRequest) -> tuple[Tier, ...]:
        return spill_targets(decision.view, req, "batched", TIERS, EVERYWHERE, own)

    assert targets(longer) == ("wafer-scale", "premium")
    (provider,) = [e for e in decision.view.candidates("coder", "wafer-scale") if e.hosted]
    assert provider.hosted is not None
    provider.inflight = provider.hosted.max_concurrent
    assert targets(longer) == ("premium",)
    assert targets(request()) == ("wafer-scale", "premium")
    provider.inflight = 0
    provider.ejected_until_s = NOW_S + 10
    async with decision.full("batched"):
        args = (decision.admission, decision.view, decision.predictor)
        chosen = choose_spill(*args, longer, "batched", targets(longer), NOW_S, own)
        assert chosen == Spill("batched", "premium", "saturated")
        chosen = choose_spill(*args, request(), "batched", targets(request()), NOW_S, own)
        assert chosen == Spill("batched", "wafer-scale", "saturated")


async def test_a_long_request_s_slo_is_predicted_on_the_endpoints_that_hold_it() -> None:
    """premium, the cheapest target here, has fast pods serving 4,096 tokens and a slower pool
    on A100s serving the model's whole context: whether a long request moving there meets its
    SLO is what the A100s would give it, not what the pods that would refuse it would."""
    decision = Decision(
        pool("b", "batched", "a100-40gb", 1),
        pool("pp", "premium", "wse-3", 5).replace("billing:", "maxContextTokens: 4096, billing:"),
        pool("slow5", "premium", "a100-40gb", 5),
        pool("www", "wafer-scale", "wse-3", 10),
    )
    longer = long_request()
    assert decision.targets(req=longer) == ("premium", "wafer-scale")

    def ttft_s(pool_name: str) -> float:
        estimate = decision.predictor.predict(
            pool_name, 0, longer.prompt_tokens_estimate, longer.output_tokens_expected
        )
        assert estimate is not None
        return estimate.ttft_s

    fast, slow, wafer = ttft_s("pp"), ttft_s("slow5"), ttft_s("www")
    assert max(fast, wafer) < slow, (fast, slow, wafer)
    longer.slo = ((max(fast, wafer) * slow) ** 0.5, None)  # met on wafer chips, not on A100s
    async with decision.full("batched"):
        chosen = decision.choose(longer, targets=decision.targets(req=longer))
    assert chosen == Spill("batched", "wafer-scale", "saturated")


# -- choose_spill ------------------------------------------------------------------------------


def test_a_tier_with_room_keeps_its_request() -> None:
    assert Decision().choose() is None


async def test_no_targets_nothing_moves() -> None:
    decision = Decision()
    async with decision.full("batched"):
        assert decision.choose(targets=()) is None


async def test_a_full_tier_moves_its_request_to_the_cheapest_target_with_room() -> None:
    decision = Decision()
    async with decision.full("batched"):
        assert decision.choose() == Spill("batched", "wafer-scale", "saturated")
        async with decision.full("wafer-scale"):
            assert decision.choose() == Spill("batched", "premium", "saturated")
            async with decision.full("premium"):
                assert decision.choose() is None  # stays, and waits or is shed as any other


def test_a_tier_whose_nodes_all_queue_is_saturated() -> None:
    decision = Decision()
    decision.queued_at_nodes("batched", 8)
    assert decision.choose() == Spill("batched", "wafer-scale", "saturated")
    decision.queued_at_nodes("wafer-scale", 8)  # a saturated target is passed over
    assert decision.choose() == Spill("batched", "premium", "saturated")
    decision.queued_at_nodes("batched", 7)
    assert decision.choose() is None


async def test_an_slo_the_tier_is_predicted_to_miss_moves_the_request() -> None:
    decision = Decision()
    # Idle: a100 prefill takes ~14 ms; the wafer chips' ~0.6 ms.
    assert decision.choose(request(slo_ms=3)) == Spill("batched", "wafer-scale", "slo")
    assert decision.choose(request(slo_ms=1000)) is None  # met where it is
    assert decision.choose(request(slo_ms=0.01)) is None  # met nowhere: it stays
    async with decision.full("wafer-scale"):  # a target must have room too
        assert decision.choose(request(slo_ms=3)) == Spill("batched", "premium", "slo")


async def test_saturation_is_the_reason_when_both_hold() -> None:
    decision = Decision()
    async with decision.full("batched"):
        assert decision.choose(request(slo_ms=3)) == Spill("batched", "wafer-scale", "saturated")


async def test_a_tier_whose_endpoints_are_all_ejected_is_passed_over() -> None:
    decision = Decision()
    (wafer,) = decision.view.candidates("coder", "wafer-scale")
    wafer.ejected_until_s = NOW_S + 5  # failing: outlier detection ejected it
    async with decision.full("batched"):
        assert decision.choose() == Spill("batched", "premium", "saturated")
        wafer.ejected_until_s = NOW_S  # its ejection is over
        assert decision.choose() == Spill("batched", "wafer-scale", "saturated")
