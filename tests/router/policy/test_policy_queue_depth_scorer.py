"""queue-depth-scorer: waiting + in-flight, min-max normalised across candidates."""

import pytest
from policy_helpers import endpoint, endpoints, request

from tiergate.router.policy import NoParameters, PluginContext
from tiergate.router.policy.queue_depth_scorer import QueueDepthScorer, queue_load

SCORER = QueueDepthScorer("q", NoParameters(), PluginContext())


def test_least_loaded_scores_one_and_most_loaded_zero() -> None:
    candidates = [
        endpoint("http://a", waiting=0.0, inflight=0),
        endpoint("http://b", waiting=2.0, inflight=2),
        endpoint("http://c", waiting=8.0, inflight=0),
    ]
    assert SCORER.score(request(), candidates, 0.0) == pytest.approx([1.0, 0.5, 0.0])


def test_inflight_counts_before_the_first_scrape() -> None:
    fresh = endpoint("http://a", inflight=3)
    assert queue_load(fresh) == 3.0
    idle = endpoint("http://b")
    assert SCORER.score(request(), [fresh, idle], 0.0) == [0.0, 1.0]


@pytest.mark.parametrize("n", [1, 4])
def test_equal_loads_all_score_one(n: int) -> None:
    assert SCORER.score(request(), endpoints(n), 0.0) == [1.0] * n
