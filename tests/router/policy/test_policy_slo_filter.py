"""slo-filter: the endpoints the perf model expects to meet a request's SLO, or a refusal."""

import pytest
from policy_helpers import endpoint, request

from tiergate.router.policy import (
    FixedPools,
    LatencyPredictor,
    NoEndpointFits,
    NoParameters,
    PluginContext,
)
from tiergate.router.policy.slo_filter import SloFilter
from tiergate.sim_nodes.catalogs import default_catalog
from tiergate.sim_nodes.perf import ServingSpec, build_deployment

CATALOG = default_catalog()
H100 = build_deployment(ServingSpec(model="llama-3.1-8b", accelerator="h100-sxm"), CATALOG)
WAFER = build_deployment(ServingSpec(model="llama-3.1-8b", accelerator="wse-3"), CATALOG)
CONTEXT = PluginContext(pools=FixedPools({"gpu": H100, "wafer": WAFER}, {"gpu": 8}).now)


def slo_filter() -> SloFilter:
    return SloFilter("slo", NoParameters(), CONTEXT)


def predicted_tpot_s(pool: str, load: float) -> float:
    estimate = LatencyPredictor(CONTEXT.pools).predict(pool, load, 1000, 200)
    assert estimate is not None
    return estimate.tpot_s


def test_without_an_slo_every_candidate_stays() -> None:
    candidates = [endpoint("http://g", pool="gpu", running=50.0)]
    assert slo_filter().filter(request(), candidates, 0.0) is candidates


def test_it_keeps_those_predicted_to_meet_the_slo_and_unknown_pools() -> None:
    idle = endpoint("http://idle", pool="gpu", running=0.0)
    busy = endpoint("http://busy", pool="gpu", running=8.0, waiting=30.0)
    unknown = endpoint("http://unknown", pool="not-modelled")
    tpot_slo = predicted_tpot_s("gpu", 0.0) * 1.01  # the idle one just meets it
    assert predicted_tpot_s("gpu", 38.0) > tpot_slo  # the busy one does not
    kept = slo_filter().filter(request(slo_tpot_s=tpot_slo), [busy, idle, unknown], 0.0)
    assert list(kept) == [idle, unknown]


def test_none_meeting_it_is_a_refusal_naming_the_best_prediction() -> None:
    gpu = endpoint("http://g", pool="gpu", running=0.0)
    wafer = endpoint("http://w", pool="wafer", running=0.0)
    best_ms = predicted_tpot_s("wafer", 0.0) * 1000
    with pytest.raises(NoEndpointFits) as refusal:
        slo_filter().filter(request(slo_tpot_s=best_ms / 2000), [gpu, wafer], 0.0)
    assert refusal.value.code == "slo_unattainable"
    assert f"TPOT {best_ms:.1f} ms" in refusal.value.message
