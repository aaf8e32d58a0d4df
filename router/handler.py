"""The completion request path, stage by stage:

    tenant -> body -> tier -> limits and budget -> admission -> pick -> upstream -> relay -> bill

Every refusal is a RouterError, turned into the OpenAI error envelope once, at the end. Every
request that got as far as a tier (a tenant, a readable body, a model and tier it may use) is
written to the ledger, whatever its outcome; earlier refusals (a bad key or body, a model not
served, a tier not allowed) cost nothing and are counted in `tiergate_requests_total` only.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from tiergate.router.admission import Admission, AdmissionEvents, Saturation
from tiergate.router.base.asgi import (
    ClientGone,
    Receive,
    Scope,
    Send,
    header_map,
    read_body,
    send_error,
)
from tiergate.router.base.errors import RouterError
from tiergate.router.base.metrics import RequestMetrics
from tiergate.router.base.tiers import Priority, Tier, TierChoice, openai_service_tier
from tiergate.router.config import RouterSettings
from tiergate.router.discovery.view import PoolView, RoutedPool
from tiergate.router.endpoints.hosted import HostedApi
from tiergate.router.endpoints.state import EndpointState, RequestContext
from tiergate.router.ledger.store import LedgerStore
from tiergate.router.policy import NoEndpointFits, Pipeline, PolicyConfig, prefix_hashes
from tiergate.router.policy.latency import LatencyPredictor
from tiergate.router.request.accounting import Accountant, ledger_unavailable
from tiergate.router.request.body import (
    CompletionRequest,
    cap_output,
    hosted_body,
    parse_completion,
    parse_slo,
    upstream_body,
)
from tiergate.router.request.cascade import cascade_plan, serve_first_tier
from tiergate.router.request.exchange import Exchange
from tiergate.router.request.ids import new_request_id
from tiergate.router.request.media_urls import check_media_urls
from tiergate.router.request.progress import Progress
from tiergate.router.request.relay import (
    FirstToken,
    bad_reply,
    first_token,
    relay_stream,
    relay_whole,
)
from tiergate.router.request.spill import spill_over
from tiergate.router.request.tier_choice import (
    budget_cap,
    choose_tier,
    most_it_may_cost,
    tiers_to_try,
)
from tiergate.router.request.tool_check import ToolCallChecker
from tiergate.router.tenants.guards import Budgets, Limits
from tiergate.router.tenants.registry import TenantRegistry
from tiergate.router.upstream.disconnect import DisconnectGuard
from tiergate.router.upstream.proxy import (
    Upstream,
    UpstreamError,
    UpstreamUnavailable,
    WholeReplyTimeout,
)
from tiergate.router.upstream.reply import Opener, Reply

log = logging.getLogger("tiergate.router")

#: Request headers passed on to the serving node (never Authorization: keys stay here).
FORWARDED = ("x-tiergate-timing",)
#: The sim nodes' fault injection: passed on only when the settings say so (fault drills).
FAULT_HEADER = "x-tiergate-fault"


@dataclass
class Router:
    """Everything the request path needs; built by the app, one per process."""

    view: Callable[[], PoolView]
    tenants: TenantRegistry
    limiter: Limits
    budgets: Budgets
    ledger: LedgerStore
    upstream: Upstream
    metrics: RequestMetrics
    settings: RouterSettings
    #: The routing policy now (a reloaded file's is applied with its view).
    policy: Callable[[], PolicyConfig]
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    #: Refreshed by the scraper after each round (see build.py); read per request.
    saturation: Saturation = field(default_factory=Saturation)
    #: Cascade tool-call checks, in worker processes with a deadline, shared fairly between
    #: tenants (router/request/tool_check.py).
    tool_checker: ToolCallChecker = field(default_factory=ToolCallChecker)
    _pipeline: Pipeline | None = None
    _pipeline_view: PoolView | None = None
    _pipeline_policy: PolicyConfig | None = None
    accountant: Accountant = field(init=False)
    admission: Admission = field(init=False)
    #: Latency predictions for spill-over (the pools' perf models, as the pipeline's).
    predictor: LatencyPredictor = field(init=False)

    def __post_init__(self) -> None:
        self.accountant = Accountant(
            self.ledger, self.budgets, self.limiter, self.metrics, self.clock, self.wall
        )
        metrics = self.metrics
        self.admission = Admission(
            self.saturation,
            AdmissionEvents(
                shed=lambda tier, priority: metrics.shed.labels(tier, priority).inc(),
                waited=lambda tier, who, s: metrics.admission_wait.labels(tier, who).observe(s),
                served=lambda tier, who, n: metrics.attained.labels(tier, who).inc(n),
            ),
            order=self.settings.admission_order,
            headroom_per_pool=self.settings.headroom_per_pool,
        )
        self.predictor = LatencyPredictor(self.view)

    def swap_tenants(self, registry: TenantRegistry) -> None:
        """Serve `registry`'s tenants from now on (a reload), and forget the rate limits and
        queue counters of the tenants it no longer has."""
        self.tenants = registry
        self.limiter.prune(registry.tenants)
        self.admission.prune(registry.tenants)

    # -- per-view derived state ------------------------------------------------------------

    def pipeline(self, view: PoolView) -> Pipeline:
        """The routing pipeline for `view`.

        Built once, and again only when the policy changed, which is looked at when the view
        changes (a reloaded file brings both). A new view with the same policy keeps the
        pipeline, which reads the pools' shapes from the current view itself, so prefix
        affinity and the pickers' seeded randomness survive hot reloads of the pools; a new
        policy starts them afresh.
        """
        if self._pipeline_view is view and self._pipeline is not None:
            return self._pipeline
        policy = self.policy()
        if self._pipeline is None or policy != self._pipeline_policy:
            if self._pipeline is not None:
                log.info("event=routing_policy_changed %s", policy.summary())
            self._pipeline = Pipeline.from_config(policy, pools=self.view, rng=random.Random(0))
            self._pipeline_policy = policy
        self.admission.resize(view)
        self._pipeline_view = view
        return self._pipeline

    def current(self) -> tuple[PoolView, Pipeline]:
        """The view now, and its pipeline: what a request that waited for a slot serves on
        (the endpoints may have changed meanwhile: new pods, pods gone)."""
        view = self.view()
        return view, self.pipeline(view)

    # -- the request path ------------------------------------------------------------------

    async def completion(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        *,
        chat: bool,
        upstream: Opener | None = None,
        request_id: str | None = None,
    ) -> None:
        """Serve one completion request, whose reply goes out through `send`. `upstream`: the
        way to its endpoint when another proxy carries the request (the endpoint picker's
        gateway, router/epp); the router's own proxy otherwise. `request_id`: the request's,
        when the caller named it already (a new one otherwise)."""
        ex = Exchange(
            request_id or new_request_id(), self.clock(), header_map(scope), receive, send
        )
        ex.upstream = upstream
        try:
            await self._handle(ex, chat)
        except RouterError as error:
            done = ex.done
            done.status = error.status
            if error.code in ("tier_saturated", "slo_unattainable", "provider_at_limit"):
                done.outcome = "shed"  # refused by admission: served late or not at all
            elif error.status >= 502:
                done.outcome = "upstream_error"
            else:
                done.outcome = "rejected"
            try:
                await self.accountant.settle(ex)  # recorded before the client has the refusal
            except RouterError:
                pass  # a refusal costs nothing: it goes out even when its row cannot be kept
            await self._refuse(send, error, ex.request_id)
        except ClientGone:
            refusal = upstream.refusal if upstream is not None else None
            if refusal is None:
                ex.done.outcome, ex.done.status = "client_disconnect", 499
            else:  # the gateway's client was answered in its stead (a pick not made in time)
                ex.done.outcome, ex.done.status = "shed", refusal.status
        except Exception:
            await self.accountant.settle(ex)  # the app's 500 goes out after the record
            raise
        finally:
            if ex.guard is not None:
                ex.guard.stop()
            self.accountant.account(ex, ex.done)
            self.accountant.release(ex)  # its actual cost is counted now

    async def _handle(self, ex: Exchange, chat: bool) -> None:
        """The request's stages, in order (the module docstring); each fills in `ex`."""
        headers = ex.headers
        tenant = ex.tenant = self.tenants.authenticate(headers.get("authorization"))
        if self.ledger.refusing:  # no durable place for another reply's record
            self.metrics.ledger_refusals.inc()
            raise ledger_unavailable()
        request = ex.request = parse_completion(
            await read_body(ex.receive, headers, self.settings.max_body_bytes), chat=chat
        )
        request.slo = parse_slo(headers)
        check_media_urls(request, self.settings.allowed_media_domains)
        guard = ex.guard = DisconnectGuard(ex.receive)
        view = self.view()
        pipeline = self.pipeline(view)
        plan = cascade_plan(headers, request, view, tenant)
        if plan is not None and ex.upstream is not None:
            raise _no_cascade_through_gateway()
        # A gateway reaches the pods alone: never a tier that only hosted pools serve.
        hosted = ex.upstream is None
        if plan is None:
            choice, tier = choose_tier(headers, request, view, tenant, hosted=hosted)
        else:
            choice = TierChoice(plan.cascade.first, "cascade", "standard", False)
            tier = choice.tier
        ex.choice = choice
        tiers = tiers_to_try(
            view, request.model, choice, tier, tenant, hosted=hosted,
            context=request.context_needed,
        )  # fmt: skip
        spill = spill_over(
            self.admission, view, self.predictor, headers, request, tenant, tier,
            choice.priority, self.clock(), cascade=plan is not None,
            usable=self.opener(ex).usable,
        )  # fmt: skip
        if spill is not None:  # its target had a free slot: it is tried first
            tiers = [spill.to, *tiers]
        budgets, limiter, now_s = self.budgets, self.limiter, self.wall()
        hold_usd = most_it_may_cost(view, request, plan, tiers, tenant)
        if budgets.needs_lease(tenant, hold_usd, now_s):  # shared budgets: a round trip
            await budgets.lease(tenant, hold_usd, now_s)
        # A request that sets no output cap gets what its tenant's budget pays for.
        room_usd = budgets.room_usd(tenant, now_s) if request.max_tokens is None else None
        if room_usd is not None:
            cap = budget_cap(view, request, plan, tiers, tenant, room_usd)
            if cap is not None:
                cap_output(request, cap)
                hold_usd = most_it_may_cost(view, request, plan, tiers, tenant)
        ex.hold_usd = budgets.check(tenant, now_s, hold_usd)
        estimate = request.tokens_expected
        if limiter.needs_lease(tenant, estimate):
            await limiter.lease(tenant, estimate)
        limiter.check(tenant, ex.started_s, estimate)
        ex.done.estimated_tokens = estimate
        if plan is not None:
            if await serve_first_tier(self, ex, view, pipeline, plan):
                return
            request, choice = ex.request, ex.choice
            assert request is not None and choice is not None
            tiers = [choice.tier]
        with guard.cancellable():
            grant = await self.admission.admit(
                view, request.model, choice.priority, tiers, tenant, estimate
            )
        if spill is not None and grant.tier == spill.to:
            ex.spill = spill
            self.metrics.spills.labels(spill.origin, spill.to, spill.reason).inc()
        try:
            await self._serve(ex, *self.current(), grant.tier)
        finally:
            done = ex.done
            self.admission.release(grant, done.prompt_tokens + done.completion_tokens)

    async def _serve(self, ex: Exchange, view: PoolView, pipeline: Pipeline, tier: Tier) -> None:
        """Open the request upstream on an endpoint of `tier` and relay its reply."""
        request, choice, done, guard = ex.request, ex.choice, ex.done, ex.guard
        assert request is not None and choice is not None and guard is not None
        extra = {h: ex.headers[h] for h in FORWARDED if h in ex.headers}
        if self.settings.forward_fault_header and FAULT_HEADER in ex.headers:
            extra[FAULT_HEADER] = ex.headers[FAULT_HEADER]
        start_s = self.clock()
        with guard.cancellable():
            opened, pool, first = await self._open_stream(
                ex, view, pipeline, tier, extra, choice.priority
            )
        # The tier that served: a gateway's own retry may have gone past the pick (router/epp).
        tier = pool.spec.tier
        service_tier = openai_service_tier(tier, choice.priority)
        reply_headers = {
            "x-tiergate-tier": tier,
            "x-tiergate-tier-requested": choice.tier,
            "x-tiergate-pool": pool.spec.name,
            "x-tiergate-request-id": ex.request_id,
        }
        if ex.spill is not None:
            reply_headers["x-tiergate-spilled-from"] = ex.spill.origin
            reply_headers["x-tiergate-spill-reason"] = ex.spill.reason
        elif tier != choice.tier:
            reply_headers["x-tiergate-fallback"] = "true"
        if done.escalated:
            reply_headers["x-tiergate-escalated"] = "true"

        async def settle() -> None:
            await self.accountant.settle(ex)

        try:
            if first is not None:
                guard.stop()  # the stream watches its client itself
                await relay_stream(
                    ex.receive, ex.send, first, request, reply_headers, done, settle=settle,
                    bill_so_far=lambda: self.accountant.bill_so_far(ex), clock=self.clock,
                    metrics=self.metrics, start_s=start_s,
                )  # fmt: skip
            else:
                await relay_whole(
                    ex.send, opened, pool, reply_headers, done,
                    service_tier=service_tier, settle=settle, guard=guard, request=request,
                    model=request.model if pool.spec.endpoint is not None else None,
                )  # fmt: skip
        finally:
            await opened.close()

    async def _open_stream(
        self,
        ex: Exchange,
        view: PoolView,
        pipeline: Pipeline,
        tier: Tier,
        extra: dict[str, str],
        priority: Priority,
    ) -> tuple[Reply, RoutedPool, FirstToken | None]:
        """`open`, and for a stream, read up to its first token: a node that fails before it
        (killed while the request waited or prefilled) is the endpoint's failure, and the
        request goes to another endpoint, the client having seen nothing yet. Whole replies
        and refusals come back with no first token read."""
        request = ex.request
        assert request is not None
        upstream = self.opener(ex)
        failed: set[str] = set()
        while True:
            try:
                opened, pool = await self.open(
                    ex, view, pipeline, request, tier, ex.done, extra, skip=failed
                )
            except RouterError as error:  # no endpoint left to try, or none that answered
                if not failed or error.status != 503:
                    raise
                raise _dropped_before_first_token(tier, len(failed)) from None
            if not (request.stream and opened.status == 200):
                return opened, pool, None
            try:
                if not opened.content_type.startswith("text/event-stream"):
                    raise bad_reply("the serving node answered a stream request without a stream")
                service_tier = openai_service_tier(pool.spec.tier, priority)
                first = await first_token(
                    opened, pool, request, service_tier=service_tier, clock=self.clock
                )
                return opened, pool, first
            except UpstreamError as exc:
                await opened.close()
                upstream.failed(opened.endpoint)
                failed.add(_attempted(opened.endpoint))
                log.warning(
                    "event=stream_failed_before_first_token request_id=%s pool=%s endpoint=%s "
                    "error=%s", ex.request_id, pool.spec.name, opened.endpoint.url, exc,
                )  # fmt: skip
                if len(failed) >= upstream.attempts:
                    raise _dropped_before_first_token(tier, len(failed)) from None
                self.metrics.retries.inc()
            except BaseException:
                await opened.close()
                raise

    async def open(
        self,
        ex: Exchange,
        view: PoolView,
        pipeline: Pipeline,
        request: CompletionRequest,
        tier: Tier,
        done: Progress,
        extra_headers: dict[str, str] | None = None,
        skip: Collection[str] = (),
    ) -> tuple[Reply, RoutedPool]:
        """Pick endpoints of `tier` (but those `skip` rules out: `_attempted`) and open the
        upstream request on the first that answers."""
        ttft_slo, tpot_slo = request.slo or (None, None)
        ctx = RequestContext(
            request.model,
            tier,
            request.prompt_tokens_estimate,
            request.output_tokens_expected,
            prefix_hashes(request.prefix_text),
            ttft_slo,
            tpot_slo,
            request.context_needed,
        )
        opener = self.opener(ex)
        offered = view.candidates(request.model, tier)
        candidates = opener.usable(offered)
        # The router's own way leaves out only providers at their limit, and returns the set
        # itself when none is (a gateway's leaves out every provider, and more).
        at_limit = ex.upstream is None and candidates is not offered
        try:
            order = pipeline.pick(ctx, candidates, self.clock())
        except NoEndpointFits as refusal:
            if at_limit:  # one of them might have served it: later
                raise _at_providers_limit(tier) from None
            raise RouterError(
                503,
                refusal.message,
                type="server_error",
                code=refusal.code,
                headers={"Retry-After": "1"},
            ) from None
        if skip:
            order = [endpoint for endpoint in order if _attempted(endpoint) not in skip]
        if not order:
            if at_limit and not skip:
                raise _at_providers_limit(tier)
            raise RouterError(
                503,
                f"no endpoint of the {tier} tier is available for {request.model!r}",
                type="server_error",
                code="no_capacity",
                headers={"Retry-After": "1"},
            )
        headers = {
            "content-type": "application/json",
            "x-tiergate-request-id": ex.request_id,
            **(extra_headers or {}),
        }
        path = "/v1/chat/completions" if request.chat else "/v1/completions"
        try:
            opened = await opener.open(
                order, path, upstream_body(request), headers, _hosted_bodies(request),
                whole=not request.stream,
            )  # fmt: skip
        except (UpstreamUnavailable, WholeReplyTimeout) as exc:
            self.metrics.retries.inc(max(exc.attempts - 1, 0))
            raise
        self.metrics.retries.inc(opened.attempts - 1)
        pipeline.observe(ctx, opened.endpoint)
        # The gateway's own retry may have reached a pool newer than `view` (router/epp).
        pool = view.pools.get(opened.endpoint.pool) or self.view().pools[opened.endpoint.pool]
        done.tier_served, done.pool, done.endpoint = pool.spec.tier, pool, opened.endpoint.url
        return opened, pool

    def opener(self, ex: Exchange) -> Opener:
        """The way to `ex`'s endpoints: the gateway's that carries it, or the router's own."""
        return ex.upstream if ex.upstream is not None else self.upstream

    async def _refuse(self, send: Send, error: RouterError, request_id: str) -> None:
        try:
            await send_error(send, error, {"x-tiergate-request-id": request_id})
        except (OSError, RuntimeError):
            pass  # the response had started, or the client is gone: nothing more to say


def _attempted(endpoint: EndpointState) -> str:
    """What a stream that failed on `endpoint` rules out for the request's next attempts: the
    server at its URL (a node, whichever pools list it), or a provider's pool (another pool
    at the same base URL is another model, or another account)."""
    return endpoint.url if endpoint.hosted is None else f"{endpoint.url} {endpoint.pool}"


def _at_providers_limit(tier: Tier) -> RouterError:
    """No endpoint of `tier` but a provider that has its pool's `maxConcurrentRequests` open
    could serve the request: shed, to be retried shortly (a tier's admission normally keeps
    its requests within those limits; this is the rest, e.g. a tier's queue shared with pools
    of other names)."""
    return RouterError(
        429,
        f"the {tier} tier's hosted pools have as many requests open as they allow "
        "(maxConcurrentRequests) and nothing else in the tier can serve the request; retry "
        "shortly",
        type="rate_limit_error",
        code="provider_at_limit",
        headers={"Retry-After": "1"},
    )


def _hosted_bodies(request: CompletionRequest) -> Callable[[HostedApi], bytes]:
    """The request's body for a hosted API (its model name and cap field), made once per
    provider model and field."""
    made: dict[tuple[str, str], bytes] = {}

    def body(api: HostedApi) -> bytes:
        key = (api.model, api.cap_field)
        if key not in made:
            made[key] = hosted_body(request, api.model, api.cap_field)
        return made[key]

    return body


def _no_cascade_through_gateway() -> RouterError:
    return RouterError(
        400,
        "a cascade (x-tiergate-cascade) needs a second attempt on another tier, which a "
        "gateway's single upstream request cannot make: send it to tiergate's own port",
        code="cascade_not_supported",
        param="x-tiergate-cascade",
    )


def _dropped_before_first_token(tier: Tier, attempts: int) -> RouterError:
    return bad_reply(
        f"the serving nodes of the {tier} tier failed before the first token "
        f"({attempts} attempt(s))"
    )
