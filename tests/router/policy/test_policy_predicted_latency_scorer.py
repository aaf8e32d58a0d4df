"""predicted-latency-scorer and the LatencyPredictor under it (perf model on live load)."""

from collections.abc import Mapping

import pytest
from policy_helpers import endpoint, request

from tiergate.router.policy import FixedPools, LatencyPredictor, PluginContext
from tiergate.router.policy.latency import _grid
from tiergate.router.policy.predicted_latency_scorer import (
    PredictedLatencyParameters,
    PredictedLatencyScorer,
)
from tiergate.sim_nodes.catalogs import default_catalog
from tiergate.sim_nodes.perf import Deployment, ServingSpec, build_deployment, step_terms

CATALOG = default_catalog()


def deployment(model: str = "llama-3.1-8b", accelerator: str = "h100-sxm") -> Deployment:
    return build_deployment(ServingSpec(model=model, accelerator=accelerator), CATALOG)


H100 = deployment()
B200 = deployment(accelerator="b200")


def scorer(deployments: Mapping[str, Deployment] | None = None) -> PredictedLatencyScorer:
    context = PluginContext(pools=FixedPools(deployments or {}).now)
    return PredictedLatencyScorer("lat", PredictedLatencyParameters(), context)


def test_idle_prediction_matches_the_perf_model() -> None:
    predictor = LatencyPredictor(FixedPools({"p0": H100}).now)
    estimate = predictor.predict("p0", 0.0, prompt_tokens=1000, output_tokens=100)
    assert estimate is not None
    context = _grid(1000 + 50)
    decode = step_terms(H100, decode_seqs=1, decode_context_tokens=context).total_s
    prefill = step_terms(
        H100, prefill_tokens=_grid(1000), prefill_attended_positions=_grid(1000) * 1001 / 2
    ).total_s
    assert estimate.tpot_s == pytest.approx(decode)
    assert estimate.ttft_s == pytest.approx(prefill, rel=0.01)
    assert estimate.total_s == pytest.approx(estimate.ttft_s + 99 * estimate.tpot_s)
    assert predictor.predict("unknown", 0.0, 1000, 100) is None


def test_load_and_queueing_slow_the_prediction() -> None:
    predictor = LatencyPredictor(FixedPools({"p0": H100}, {"p0": 8}).now)
    totals = [predictor.predict("p0", load, 1000, 100) for load in (0, 4, 7, 15)]
    assert all(t is not None for t in totals)
    ttfts = [t.ttft_s for t in totals if t is not None]
    tpots = [t.tpot_s for t in totals if t is not None]
    assert tpots[0] < tpots[1] < tpots[2] == tpots[3]  # the batch stops growing at the cap
    assert ttfts[3] > 1.5 * ttfts[2]  # 8 requests queued ahead: wait about one request


def test_fastest_scores_one_and_the_rest_by_ratio() -> None:
    s = scorer(deployments={"h100": H100, "b200": B200})
    candidates = [
        endpoint("http://a", pool="h100", running=0.0, waiting=0.0),
        endpoint("http://b", pool="h100", running=60.0, waiting=0.0),
        endpoint("http://c", pool="b200", running=0.0, waiting=0.0),
    ]
    scores = s.score(request(), candidates, 0.0)
    assert scores[2] == 1.0  # same load on faster hardware
    assert 0 < scores[1] < scores[0] < 1


def test_router_inflight_counts_when_higher_than_the_scrape() -> None:
    s = scorer(deployments={"p0": H100})
    stale = endpoint("http://a", running=0.0, waiting=0.0, inflight=50)
    idle = endpoint("http://b", running=0.0, waiting=0.0)
    scores = s.score(request(), [stale, idle], 0.0)
    assert scores[1] == 1.0 and scores[0] < 1.0


def test_unknown_pools_and_missing_metrics() -> None:
    s = scorer(deployments={"p0": H100})
    fresh = endpoint("http://a")  # no scrape yet: idle as far as we know
    alien = endpoint("http://b", pool="elsewhere")
    assert s.score(request(), [fresh, alien], 0.0) == [1.0, 0.5]
    assert s.score(request(), [alien], 0.0) == [0.5]
    assert scorer().score(request(), [fresh, alien], 0.0) == [0.5, 0.5]


def test_the_predictor_reads_the_pools_now_and_its_cache_follows_a_replaced_deployment() -> None:
    """The router hands the predictor its current view: a reload is seen at the next call."""
    current = FixedPools({"p0": H100})
    predictor = LatencyPredictor(lambda: current)
    before = predictor.predict("p0", 0.0, 1000, 100)
    current = FixedPools({"p0": B200})  # hot reload swapped the pool's hardware
    after = predictor.predict("p0", 0.0, 1000, 100)
    assert before is not None and after is not None and after.total_s < before.total_s
    current = FixedPools({"p0": B200}, {"p0": 1})  # and its batch cap: a request now queues
    capped = predictor.predict("p0", 4.0, 1000, 100)
    assert capped is not None and capped.ttft_s > 2 * after.ttft_s


def test_cache_keeps_an_equal_deployment_and_forgets_pools_that_are_gone() -> None:
    current = FixedPools({"p0": H100, "p1": B200})
    predictor = LatencyPredictor(lambda: current)
    predictor.predict("p0", 0.0, 1000, 100)
    predictor.predict("p1", 0.0, 1000, 100)
    cached = predictor._pools["p0"].times
    assert cached
    # A new view: new objects for the same hardware, and p1 deleted.
    current = FixedPools({"p0": deployment()})
    predictor.predict("p0", 0.0, 1000, 100)
    assert predictor._pools["p0"].times is cached
    assert predictor._pools["p0"].deployment is current.deployments["p0"]
    assert set(predictor._pools) == {"p0"}
    assert predictor.predict("p1", 0.0, 1000, 100) is None


def test_grid_rounds_up_to_four_significant_bits() -> None:
    assert [_grid(n) for n in (0, 1, 15, 16, 17, 31, 33, 1000)] == [0, 1, 15, 16, 18, 32, 36, 1024]
    assert _grid(14.2) == 15
