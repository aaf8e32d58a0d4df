"""model-filter, tier-filter, context-filter and ejected-filter (random-sample has a file of
its own)."""

from collections.abc import Sequence

from policy_helpers import MODEL, endpoint, endpoints, request

from tiergate.router.config import parse_config
from tiergate.router.discovery.view import PoolView, build_view
from tiergate.router.endpoints.state import CandidateSet, EndpointState, RequestContext
from tiergate.router.policy import NoParameters, PluginContext
from tiergate.router.policy.context_filter import ContextFilter
from tiergate.router.policy.ejected_filter import EjectedFilter
from tiergate.router.policy.model_filter import ModelFilter
from tiergate.router.policy.tier_filter import TierFilter
from tiergate.sim_nodes.catalogs import default_catalog

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


def _two_contexts() -> PoolView:
    """`coder` in the batched tier from two pools: one serving 4,096 tokens, one the model's
    131,072."""

    def pool(name: str, host: int, more: str) -> str:
        return (
            f"  - {{name: {name}, tier: batched, model: llama-3.1-8b, accelerator: h100-sxm, "
            f"servedModelName: coder, endpoints: ['http://10.0.0.{host}:8000']{more}}}\n"
        )

    config = parse_config(
        "router: {}\npools:\n" + pool("short", 1, ", maxContextTokens: 4096") + pool("whole", 2, "")
    )
    return build_view(config.pools, default_catalog())


def test_context_filter_keeps_the_pools_whose_context_holds_the_request() -> None:
    view = _two_contexts()
    f = ContextFilter("c", NoParameters(), PluginContext(pools=lambda: view))
    candidates = view.candidates("coder", "batched")
    assert len(candidates) == 2
    (whole,) = (e for e in candidates if e.pool == "whole")

    def ask(tokens: int) -> Sequence[EndpointState]:
        ctx = RequestContext("coder", "batched", tokens - 100, 100, context_tokens=tokens)
        return f.filter(ctx, candidates, 0.0)

    assert ask(4096) is candidates  # both serve it: no look at each
    assert list(ask(4097)) == [whole]
    assert ask(131_073) is candidates  # none does: the engine's 400 says the limit


def test_context_filter_keeps_none_when_only_a_provider_at_its_limit_holds_the_request() -> None:
    # The long pool's endpoint stands for a provider the router left out of the candidates
    # for now (at its pool's maxConcurrentRequests): the request waits for it (429, retried)
    # rather than going to the short pool, whose engine would refuse it for good.
    view = _two_contexts()
    f = ContextFilter("c", NoParameters(), PluginContext(pools=lambda: view))
    offered = view.candidates("coder", "batched")
    (short,) = (e for e in offered if e.pool == "short")
    (whole,) = (e for e in offered if e.pool == "whole")
    ctx = RequestContext("coder", "batched", 4000, 100, context_tokens=4100)
    assert (
        list(f.filter(ctx, CandidateSet([short], "coder", "batched", at_limit=[whole]), 0.0)) == []
    )
    # Left out, it would not hold a request longer than its own context either: the engine's
    # 400 answers that one.
    longest = RequestContext("coder", "batched", 131_000, 100, context_tokens=131_100)
    left = CandidateSet([short], "coder", "batched", at_limit=[whole])
    assert f.filter(longest, left, 0.0) is left
    # Nothing left out: the short pool's engine says the limit, as before.
    alone = CandidateSet([short], "coder", "batched")
    assert f.filter(ctx, alone, 0.0) is alone
