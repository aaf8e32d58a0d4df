"""model-filter, tier-filter and ejected-filter (random-sample has a file of its own)."""

from policy_helpers import MODEL, endpoint, endpoints, request

from tiergate.router.endpoints.state import CandidateSet
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


def test_model_and_tier_filters_keep_the_views_set_without_looking_inside() -> None:
    # A CandidateSet vouches for its members: these do not even claim the model or the tier,
    # so a filter that looked at them would drop them.
    members = [endpoint("http://a", served_names=("other",), tier="premium")]
    candidates = CandidateSet(members, MODEL, "batched")
    m, t = ModelFilter("m", NoParameters(), CONTEXT), TierFilter("t", NoParameters(), CONTEXT)
    assert m.filter(request(), candidates, 0.0) is candidates
    assert t.filter(request(), candidates, 0.0) is candidates
    # A set of another model or tier is filtered member by member, as any sequence is.
    assert list(m.filter(request(model="other"), candidates, 0.0)) == members
    assert list(t.filter(request(tier="premium"), candidates, 0.0)) == members
    assert list(m.filter(request(model="third"), candidates, 0.0)) == []
