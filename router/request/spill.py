"""Spill-over: move a request from its tier to another the tenant allows and will pay for,
when its own tier cannot serve it well.

A request moves only under a spill policy (router/tenants/spill_policy.py), and only when
its tier is

- `saturated`: no free slot at the router (requests are waiting, or every slot is taken),
  or every endpoint reports queued requests (the admission saturation flags); or
- predicted to miss its SLO (`slo`): the request sent `x-slo-ttft-ms` / `x-slo-tpot-ms` and
  the best endpoint of its tier is predicted to miss them, with the tier's own waiting
  requests counted ahead of it (router/policy/latency.py).

It moves to the cheapest of the policy's tiers (by output price per million tokens) that
serves its model, is within the price cap, is not excluded for a request with tools, has a
free slot now and an endpoint whose pool's context holds the request, that its way reaches
(not a provider at its limit) and that is not ejected, and is predicted to meet its SLO. When
none does, it stays and waits or is shed in its own tier as any other request. A flex request
(it asked to be served late and cheap) and a cascade never move. The decision is made once,
on arrival, before the budget holds the request's most possible cost: at the target's price
only when it is moving there. The reply
says where it was served (`x-tiergate-tier`, `x-tiergate-spilled-from`, the body's
`service_tier`) and it is billed at the pool that served it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from tiergate.router.admission import Admission
from tiergate.router.base.tiers import Priority, Tier
from tiergate.router.discovery.view import PoolView
from tiergate.router.endpoints.state import EndpointState
from tiergate.router.policy.base import holding
from tiergate.router.policy.latency import LatencyEstimate, LatencyPredictor, endpoint_load
from tiergate.router.request.body import CompletionRequest
from tiergate.router.tenants.registry import Tenant
from tiergate.router.tenants.spill_policy import SpillPolicy, parse_spill_headers

__all__ = ["Spill", "SpillReason", "choose_spill", "spill_over", "spill_targets"]

SpillReason = Literal["saturated", "slo"]
#: Of a tier's endpoints, those the request's way can send it to (`Opener.usable`).
Usable = Callable[[Sequence[EndpointState]], Sequence[EndpointState]]


def _all(endpoints: Sequence[EndpointState]) -> Sequence[EndpointState]:
    return endpoints


@dataclass(frozen=True, slots=True)
class Spill:
    """A request moved from `origin` to `to`, and why."""

    origin: Tier
    to: Tier
    reason: SpillReason


def spill_over(
    admission: Admission,
    view: PoolView,
    predictor: LatencyPredictor,
    headers: Mapping[str, str],
    request: CompletionRequest,
    tenant: Tenant,
    asked: Tier,
    priority: Priority,
    now_s: float,
    *,
    cascade: bool,
    usable: Usable = _all,
) -> Spill | None:
    """Where `request` moves from `asked`, under its tenant's policy and its own spill
    headers (checked on every request: a bad one is a 400 even where nothing may move), or
    None to stay. A flex request (it asked to wait, not to pay more) and a cascade never
    move. `usable`: the endpoints the request's way can send it to (a gateway's: no hosted
    pool's), of those a tier has."""
    policy = parse_spill_headers(headers, tenant.spill, tenant.allowed_tiers, tenant.name)
    if cascade or priority == "flex":
        return None
    targets = spill_targets(view, request, asked, tenant.allowed_tiers, policy, usable)
    return choose_spill(admission, view, predictor, request, asked, targets, now_s, usable)


def spill_targets(
    view: PoolView,
    request: CompletionRequest,
    asked: Tier,
    allowed: Sequence[Tier],
    policy: SpillPolicy,
    usable: Usable = _all,
) -> tuple[Tier, ...]:
    """The tiers `request` may move to from `asked`, cheapest first: the policy's (less those
    excluded for a request with tools), with a `usable` endpoint serving its model whose
    pool's context holds it (a pool scaled to zero still names the model, a provider at its
    limit is not usable), allowed to its tenant, and no dearer per million output tokens than
    the policy's cap."""
    if not policy.to:
        return ()
    model, cap = request.model, policy.max_output_usd_per_million
    priced = [
        (view.output_usd_per_million(model, tier), tier)
        for tier in policy.tiers_for(bool(request.body.get("tools")))
        if tier != asked and tier in allowed and _holding(view, request, tier, usable)
    ]
    return tuple(tier for price, tier in sorted(priced) if cap is None or price <= cap)


def choose_spill(
    admission: Admission,
    view: PoolView,
    predictor: LatencyPredictor,
    request: CompletionRequest,
    asked: Tier,
    targets: Sequence[Tier],
    now_s: float,
    usable: Usable = _all,
) -> Spill | None:
    """Where `request` moves from `asked`, or None to stay (the module docstring). `now_s`
    is the router's clock, for endpoint ejections; `usable` as `spill_over`'s."""
    if not targets:
        return None
    model = request.model

    def free(tier: Tier) -> bool:
        return admission.has_room(tier, model) and not admission.saturation.is_saturated(
            view, model, tier
        )

    def meets_slo(tier: Tier) -> bool:
        if request.slo is None:
            return True
        estimate = _predict(admission, view, predictor, request, tier, now_s, usable)
        return _meets(request, estimate)

    def reachable(tier: Tier) -> bool:
        return any(not e.is_ejected(now_s) for e in _holding(view, request, tier, usable))

    reason: SpillReason
    if not free(asked):
        reason = "saturated"
    elif not meets_slo(asked):
        reason = "slo"
    else:
        return None
    for tier in targets:
        if free(tier) and reachable(tier) and meets_slo(tier):
            return Spill(asked, tier, reason)
    return None


def _predict(
    admission: Admission,
    view: PoolView,
    predictor: LatencyPredictor,
    request: CompletionRequest,
    tier: Tier,
    now_s: float,
    usable: Usable,
) -> LatencyEstimate | None:
    """The best latency an endpoint of `tier` that holds `request` and is not ejected is
    predicted to give it, counting the requests waiting at the router for the tier as spread
    over those endpoints (None: no such endpoint, or the perf model knows none of their
    pools)."""
    offered = _holding(view, request, tier, usable)
    endpoints = [e for e in offered if not e.is_ejected(now_s)]
    if not endpoints:
        return None
    queued = admission.queue_for(request.model, tier).waiting / len(endpoints)
    best: LatencyEstimate | None = None
    for endpoint in endpoints:
        estimate = predictor.predict(
            endpoint.pool,
            endpoint_load(endpoint) + queued,
            request.prompt_tokens_estimate,
            request.output_tokens_expected,
        )
        if estimate is not None and (best is None or estimate.total_s < best.total_s):
            best = estimate
    return best


def _holding(
    view: PoolView, request: CompletionRequest, tier: Tier, usable: Usable
) -> Sequence[EndpointState]:
    """The endpoints of `tier` serving `request`'s model that its way can send it to and
    whose pool's context holds it: a short pool's engine would refuse it for good, and the
    context-filter sheds a request that only a provider at its limit holds."""
    offered = usable(view.candidates(request.model, tier))
    return holding(view, offered, request.model, tier, request.context_needed)


def _meets(request: CompletionRequest, estimate: LatencyEstimate | None) -> bool:
    """Whether `estimate` meets the request's SLO (an unknown estimate gets the benefit of
    the doubt, as in the slo-filter)."""
    if estimate is None or request.slo is None:
        return True
    ttft_slo, tpot_slo = request.slo
    return (ttft_slo is None or estimate.ttft_s <= ttft_slo) and (
        tpot_slo is None or estimate.tpot_s <= tpot_slo
    )
