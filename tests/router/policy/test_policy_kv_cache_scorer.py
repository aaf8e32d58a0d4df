"""kv-cache-utilization-scorer: 1 - usage, unknown -> 0.5 (configurable)."""

import pytest
from policy_helpers import endpoint, request

from tiergate.router.policy import PluginContext
from tiergate.router.policy.kv_cache_scorer import (
    KvCacheUtilizationParameters,
    KvCacheUtilizationScorer,
)


def scorer(**parameters: float) -> KvCacheUtilizationScorer:
    params = KvCacheUtilizationParameters(**parameters)
    return KvCacheUtilizationScorer("kv", params, PluginContext())


def test_free_cache_scores_higher() -> None:
    candidates = [endpoint("http://a", kv_usage=0.0), endpoint("http://b", kv_usage=0.9)]
    assert scorer().score(request(), candidates, 0.0) == pytest.approx([1.0, 0.1])


def test_unknown_usage_is_neutral() -> None:
    candidates = [endpoint("http://a"), endpoint("http://b", kv_usage=1.0)]
    assert scorer().score(request(), candidates, 0.0) == [0.5, 0.0]
    assert scorer(unknown_score=0.8).score(request(), candidates[:1], 0.0) == [0.8]
