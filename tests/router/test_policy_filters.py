"""model-filter, tier-filter and ejected-filter."""

from policy_helpers import endpoint, endpoints, request

from tiergate.router.policy import NoParameters, PluginContext
from tiergate.router.policy.ejected_filter import EjectedFilter
from tiergate.router.policy.model_filter import ModelFilter
from tiergate.router.policy.tier_filter import TierFilter

CONTEXT = PluginContext()


def test_model_filter_keeps_endpoints_serving_the_name_under_any_alias() -> None:
    a = endpoint("http://a", served_names=("frontier", "frontier-latest"))
    b = endpoint("http://b", served_names=("frontier-spark",))
    f = ModelFilter("m", NoParameters(), CONTEXT)
    assert list(f.filter(request(model="frontier-latest"), [a, b], 0.0)) == [a]
    assert list(f.filter(request(model="frontier"), [a, b], 0.0)) == [a]
    assert list(f.filter(request(model="unknown"), [a, b], 0.0)) == []


def test_model_filter_returns_the_input_itself_when_all_match() -> None:
    candidates = endpoints(3)
    assert ModelFilter("m", NoParameters(), CONTEXT).filter(request(), candidates, 0.0) is (
        candidates
    )


def test_tier_filter_keeps_the_requested_tier_only() -> None:
    batched = endpoint("http://a", tier="batched")
    premium = endpoint("http://b", tier="premium")
    f = TierFilter("t", NoParameters(), CONTEXT)
    assert list(f.filter(request(tier="premium"), [batched, premium], 0.0)) == [premium]
    assert list(f.filter(request(tier="wafer-scale"), [batched, premium], 0.0)) == []
    both = [batched, endpoint("http://c", tier="batched")]
    assert f.filter(request(tier="batched"), both, 0.0) is both


def test_ejected_filter_drops_endpoints_ejected_now() -> None:
    healthy, ejected = endpoint("http://a"), endpoint("http://b", ejected_until_s=10.0)
    f = EjectedFilter("e", NoParameters(), CONTEXT)
    assert list(f.filter(request(), [healthy, ejected], 5.0)) == [healthy]
    # The ejection has run out by t=10.
    assert list(f.filter(request(), [healthy, ejected], 10.0)) == [healthy, ejected]


def test_ejected_filter_keeps_everything_when_all_are_ejected() -> None:
    candidates = endpoints(3, ejected_until_s=10.0)
    f = EjectedFilter("e", NoParameters(), CONTEXT)
    assert list(f.filter(request(), candidates, 5.0)) == candidates
    assert list(f.filter(request(), [], 5.0)) == []
