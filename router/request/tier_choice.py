"""Which tiers may serve a request, given the pools that serve its model and its tenant, and
the most it may cost there (its budget hold)."""

from __future__ import annotations

from tiergate.router.base.errors import RouterError
from tiergate.router.base.tiers import Tier, TierChoice, resolve_tier
from tiergate.router.discovery.view import PoolView
from tiergate.router.request.body import CompletionRequest
from tiergate.router.request.cascade import CascadePlan
from tiergate.router.tenants.registry import Tenant, authorize_tier

__all__ = ["budget_cap", "choose_tier", "most_it_may_cost", "tiers_to_try"]


def most_it_may_cost(
    view: PoolView,
    request: CompletionRequest,
    plan: CascadePlan | None,
    tiers: list[Tier],
    tenant: Tenant,
) -> float:
    """The budget hold of a request: the most it may cost at the dearest pool that may
    serve it (any of the `tiers` admission may try; both tiers of a cascade, which may bill
    both); see `PoolView.most_cost_usd`."""
    if tenant.budget_usd is None:
        return 0.0
    bounds = (request.prompt_tokens_most, request.max_tokens, request.sequences, request.prompts)
    if plan is None:
        return max(view.most_cost_usd(request.model, tier, *bounds) for tier in tiers)
    first, then = plan.cascade.first, plan.cascade.then
    return view.most_cost_usd(plan.first_model, first, *bounds) + (
        view.most_cost_usd(plan.then_model, then, *bounds)
    )


def budget_cap(
    view: PoolView,
    request: CompletionRequest,
    plan: CascadePlan | None,
    tiers: list[Tier],
    tenant: Tenant,
    room_usd: float,
) -> int | None:
    """The output cap that keeps a request that sets none within `room_usd`, what its
    tenant's budget has left (at least 1 token); None when it needs no cap (it sets one, or
    the budget covers all the node may produce)."""
    if (
        request.max_tokens is not None
        or most_it_may_cost(view, request, plan, tiers, tenant) <= room_usd
    ):
        return None
    request.max_tokens = 0  # the cost is linear in the cap: its fixed part, then per token
    try:
        fixed = most_it_may_cost(view, request, plan, tiers, tenant)
        request.max_tokens = 1
        per_token = most_it_may_cost(view, request, plan, tiers, tenant) - fixed
    finally:
        request.max_tokens = None
    if per_token <= 0:
        return None
    # A hair over the quotient: $0.001 at $10 a million is 100 tokens, not 99.99999999999999.
    return max(1, int((room_usd - fixed) / per_token * (1 + 1e-9)))


#: Why a request a gateway carries is not served by hosted pools.
_GATEWAY_CANNOT = "which a gateway cannot reach (they have no pods): send it to tiergate's own port"


def choose_tier(
    headers: dict[str, str],
    request: CompletionRequest,
    view: PoolView,
    tenant: Tenant,
    *,
    hosted: bool = True,
) -> tuple[TierChoice, Tier]:
    """The request's tier choice (`resolve_tier`) and the tier it is served in: the chosen one,
    or for `service_tier: auto` one the tenant may use when the chosen one does not serve the
    model. 404 for a model nobody serves, 403 for a tier the tenant may not use, 400 for a
    tier that does not serve the model. `hosted=False`: the request's way reaches no hosted
    pool (a gateway carries it), so tiers served by hosted pools alone do not serve it."""
    model = request.model
    serving = view.tiers_serving(model, hosted=hosted)
    if not serving:
        if view.tiers_serving(model):
            raise RouterError(
                404,
                f"model {model!r} is served here only by hosted pools, {_GATEWAY_CANNOT}",
                code="model_not_found",
                param="model",
            )
        served = ", ".join(sorted(view.models_served(hosted=hosted))) or "none"
        raise RouterError(
            404,
            f"model {model!r} is not served here; served models: {served}",
            code="model_not_found",
            param="model",
        )
    choice = resolve_tier(headers, request.body, serving)
    authorize_tier(tenant, choice.tier)
    if choice.tier in serving:
        return choice, choice.tier
    allowed = [t for t in serving if t in tenant.allowed_tiers]
    if choice.may_fall_back and allowed:
        return choice, allowed[0]
    if choice.tier in view.tiers_serving(model):
        raise RouterError(
            400,
            f"model {model!r} is served in the {choice.tier} tier only by hosted pools, "
            f"{_GATEWAY_CANNOT}; tiers serving it through the gateway: {', '.join(serving)}",
            code="tier_not_served",
            param="model",
        )
    raise RouterError(
        400,
        f"model {model!r} is not served in the {choice.tier} tier; "
        f"tiers serving it: {', '.join(serving)}",
        code="tier_not_served",
        param="model",
    )


def tiers_to_try(
    view: PoolView,
    model: str,
    choice: TierChoice,
    tier: Tier,
    tenant: Tenant,
    *,
    hosted: bool = True,
    context: int = 0,
) -> list[Tier]:
    """`tier`, then for `service_tier: auto` the other tiers serving the model that the
    tenant may use (`hosted=False`: by pools of pods) with a pool whose context holds the
    request's `context` tokens, in the order admission tries them."""
    if not choice.may_fall_back:
        return [tier]
    others = view.tiers_serving(model, hosted=hosted)
    return [tier, *(t for t in others if t != tier and t in tenant.allowed_tiers
                    and view.longest_context(model, t) >= context)]  # fmt: skip
