"""The pipeline: filters in order, weighted scores, picker; determinism; observe; sampling
(the bound on a request's work for a large pool: test_policy_request_cost.py)."""

import random
from collections.abc import Sequence

from policy_helpers import MODEL, endpoint, endpoints, request

from tiergate.router.endpoints.state import CandidateSet, EndpointState, RequestContext
from tiergate.router.policy import (
    FixedPools,
    NoParameters,
    Pipeline,
    PluginContext,
    PolicyConfig,
    Scorer,
    default_policy,
    prefix_hashes,
)
from tiergate.router.policy.max_score_picker import MaxScorePicker
from tiergate.router.policy.model_filter import ModelFilter
from tiergate.router.policy.random_sample import RandomSample, RandomSampleParameters
from tiergate.sim_nodes.catalogs import default_catalog
from tiergate.sim_nodes.perf import ServingSpec, build_deployment

DEPLOYMENT = build_deployment(ServingSpec(model=MODEL, accelerator="h100-sxm"), default_catalog())


class Fixed(Scorer):
    """Test scorer: fixed scores by URL."""

    def __init__(self, scores: dict[str, float]) -> None:
        super().__init__("fixed", NoParameters(), PluginContext())
        self.scores = scores
        self.seen: list[list[str]] = []

    def score(
        self, ctx: RequestContext, candidates: Sequence[EndpointState], now_s: float
    ) -> list[float]:
        self.seen.append([ep.url for ep in candidates])
        return [self.scores[ep.url] for ep in candidates]


def picker() -> MaxScorePicker:
    return MaxScorePicker("max", NoParameters(), PluginContext())


def test_weighted_sum_decides_the_order() -> None:
    a, b, c = endpoints(3)
    fast = Fixed({"http://e0": 1.0, "http://e1": 0.0, "http://e2": 0.5})
    light = Fixed({"http://e0": 0.0, "http://e1": 1.0, "http://e2": 0.5})
    assert Pipeline([], [(fast, 3.0), (light, 1.0)], picker()).pick(request(), [a, b, c], 0) == [
        a,
        c,
        b,
    ]
    assert Pipeline([], [(fast, 1.0), (light, 3.0)], picker()).pick(request(), [a, b, c], 0) == [
        b,
        c,
        a,
    ]


def test_filters_run_before_scorers_and_can_empty_the_list() -> None:
    keep = endpoint("http://keep")
    other = endpoint("http://other", served_names=("other-model",))
    scorer = Fixed({"http://keep": 1.0, "http://third": 0.0})
    third = endpoint("http://third")
    pipeline = Pipeline(
        [ModelFilter("m", NoParameters(), PluginContext())], [(scorer, 1.0)], picker()
    )
    assert pipeline.pick(request(), [keep, other, third], 0.0) == [keep, third]
    assert scorer.seen == [["http://keep", "http://third"]]
    assert pipeline.pick(request(model="nobody"), [keep, other], 0.0) == []
    # A single survivor is returned without scoring.
    assert pipeline.pick(request(), [keep, other], 0.0) == [keep]
    assert len(scorer.seen) == 1


def test_no_candidates_and_no_filters_is_no_pick_for_every_scorer() -> None:
    """A pool scaled to zero under a policy without filters: no scorer is asked (min() of no
    loads raised in the queue-depth scorer: a 500 where a 503 no_capacity belongs)."""
    scorers = default_policy().model_dump()["scorers"]
    for picker in ("max-score-picker", "weighted-random-picker"):
        policy = PolicyConfig.model_validate({"scorers": scorers, "picker": {"type": picker}})
        pipeline = Pipeline.from_config(policy, pools=FixedPools({"p0": DEPLOYMENT}).now)
        assert pipeline.pick(request(), [], 0.0) == []
        assert pipeline.pick(request(), CandidateSet([], MODEL, "batched"), 0.0) == []


def test_default_policy_routes_to_the_idle_endpoint_of_the_right_tier() -> None:
    pipeline = Pipeline.from_config(default_policy(), pools=FixedPools({"p0": DEPLOYMENT}).now)
    busy = endpoint("http://busy", running=40.0, waiting=5.0, kv_usage=0.8)
    idle = endpoint("http://idle", running=1.0, waiting=0.0, kv_usage=0.1)
    premium = endpoint("http://premium", tier="premium", running=0.0, waiting=0.0)
    ejected = endpoint("http://ejected", running=0.0, waiting=0.0, ejected_until_s=100.0)
    order = pipeline.pick(request(), [busy, idle, premium, ejected], now_s=50.0)
    assert order == [idle, busy]


def test_prefix_affinity_through_observe() -> None:
    config = PolicyConfig.model_validate(
        {"scorers": [{"type": "prefix-affinity-scorer"}, {"type": "queue-depth-scorer"}]}
    )
    pipeline = Pipeline.from_config(config)
    a, b = endpoints(2)
    ctx = request(prefix_hashes=prefix_hashes("system prompt " * 100))
    pipeline.observe(ctx, b)
    assert pipeline.pick(ctx, [a, b], 0.0)[0] is b
    # A partial match (2 of 4 blocks) loses to a much shorter queue.
    longer = request(prefix_hashes=prefix_hashes("system prompt " * 100, max_blocks=4))
    pipeline = Pipeline.from_config(config)
    pipeline.observe(request(prefix_hashes=longer.prefix_hashes[:2]), b)
    b.waiting = 10.0
    assert pipeline.pick(longer, [a, b], 0.0)[0] is a


def test_same_seed_same_choices() -> None:
    config = PolicyConfig.model_validate(
        {"scorers": [{"type": "queue-depth-scorer"}], "picker": {"type": "weighted-random-picker"}}
    )
    candidates = [endpoint(f"http://e{i}", waiting=float(i % 3)) for i in range(8)]

    def run(seed: int) -> list[str]:
        pipeline = Pipeline.from_config(config, rng=random.Random(seed))
        return [pipeline.pick(request(), candidates, 0.0)[0].url for _ in range(50)]

    assert run(5) == run(5)
    assert run(5) != run(6)


def test_large_candidate_sets_are_sampled_down() -> None:
    config = PolicyConfig.model_validate(
        {
            "filters": [{"type": "random-sample", "parameters": {"size": 8}}],
            "scorers": [{"type": "queue-depth-scorer"}],
        }
    )
    pipeline = Pipeline.from_config(config)
    candidates = endpoints(100)
    order = pipeline.pick(request(), candidates, 0.0)
    assert len(order) == 8 and len({ep.url for ep in order}) == 8


def test_no_scorers_still_orders_every_candidate() -> None:
    pipeline = Pipeline.from_config(PolicyConfig())
    candidates = endpoints(3)
    assert sorted(ep.url for ep in pipeline.pick(request(), candidates, 0.0)) == [
        "http://e0",
        "http://e1",
        "http://e2",
    ]


class Favouring(Fixed):
    """Test scorer that names the endpoints it favours, as prefix affinity does."""

    def __init__(self, favoured: list[str]) -> None:
        super().__init__({})
        self.favoured = favoured

    def score(
        self, ctx: RequestContext, candidates: Sequence[EndpointState], now_s: float
    ) -> list[float]:
        self.seen.append([ep.url for ep in candidates])
        return [1.0 if ep.url in self.favoured else 0.0 for ep in candidates]

    def favoured_urls(self, ctx: RequestContext) -> list[str]:
        return self.favoured


def test_the_sampler_keeps_what_any_scorer_favours() -> None:
    sample = RandomSample("s", RandomSampleParameters(size=4), PluginContext())
    one, two = Favouring(["http://e10", "http://e20"]), Favouring(["http://e20", "http://e30"])
    pipeline = Pipeline([sample], [(one, 1.0), (two, 1.0)], picker())
    order = pipeline.pick(request(), CandidateSet(endpoints(100), MODEL, "batched"), 0.0)
    # 4 drawn + 3 favoured (e20 once), the favoured first since they score highest.
    assert len(order) == 7 and len({ep.url for ep in order}) == 7
    assert {ep.url for ep in order[:3]} == {"http://e10", "http://e20", "http://e30"}
    assert [len(seen) for seen in one.seen + two.seen] == [7, 7]
