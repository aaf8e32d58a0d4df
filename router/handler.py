"""The completion request path, stage by stage (ARCHITECTURE.md):

    tenant -> body -> tier -> limits and budget -> admission -> pick -> upstream -> relay -> bill

Every refusal is a RouterError, turned into the OpenAI error envelope once, at the end. Every
request that got as far as a tier (a tenant, a readable body, a model and tier it may use) is
written to the ledger, whatever its outcome; earlier refusals (a bad key or body, a model not
served, a tier not allowed) cost nothing and are counted in `tiergate_requests_total` only.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field, replace
from typing import Any

from tiergate.sim_nodes.perf import Deployment

from .admission import Saturation, Shed, TierQueue, shed_error
from .asgi import (
    ClientGone,
    Receive,
    Scope,
    Send,
    encode_headers,
    header_map,
    read_body,
    send_bytes,
    send_error,
)
from .budgets import BudgetGuard
from .cascade import CascadePlan, as_event_stream, cascade_plan
from .config import RouterSettings
from .disconnect import DisconnectGuard
from .discovery import PoolView, RoutedPool
from .errors import RouterError
from .ledger import Ledger, UsageRecord
from .metrics import RouterMetrics
from .policy import (
    LatencyEstimate,
    LatencyPredictor,
    Pipeline,
    PolicyConfig,
    endpoint_load,
    prefix_hashes,
)
from .progress import Progress
from .proxy import Opened, Upstream, UpstreamError, UpstreamUnavailable
from .ratelimit import RateLimiter
from .relay import FirstToken, bad_reply, bill, first_token, relay_stream, relay_whole
from .request import CompletionRequest, parse_completion, parse_slo, upstream_body
from .request_ids import new_request_id
from .state import EndpointState, RequestContext
from .tenants import Tenant, TenantRegistry, authorize_tier
from .tiers import TIERS, Tier, TierChoice, openai_service_tier, resolve_tier
from .tool_check import ToolCallChecker

log = logging.getLogger("tiergate.router")

#: Request headers passed on to the serving node (never Authorization: keys stay here).
FORWARDED = ("x-tiergate-timing",)
#: The sim nodes' fault injection: passed on only when the settings say so (fault drills).
FAULT_HEADER = "x-tiergate-fault"
#: Router-side in-flight headroom over the endpoints' batch caps (keeps their queues fed).
HEADROOM = 1.5


@dataclass
class Router:
    """Everything the request path needs; built by the app, one per process."""

    view: Callable[[], PoolView]
    tenants: TenantRegistry
    limiter: RateLimiter
    budgets: BudgetGuard
    ledger: Ledger
    upstream: Upstream
    metrics: RouterMetrics
    settings: RouterSettings
    #: The routing policy now (a reloaded file's is applied with its view).
    policy: Callable[[], PolicyConfig]
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    #: Refreshed by the scraper after each round (see build.py); read per request.
    saturation: Saturation = field(default_factory=Saturation)
    #: Cascade tool-call checks, in worker processes with a deadline, shared fairly between
    #: tenants (router/tool_check.py).
    tool_checker: ToolCallChecker = field(default_factory=ToolCallChecker)
    _pipeline: Pipeline | None = None
    _pipeline_view: PoolView | None = None
    _pipeline_policy: PolicyConfig | None = None
    _deployments: dict[str, Deployment] = field(default_factory=dict)
    _batch_caps: dict[str, int] = field(default_factory=dict)
    _queues: dict[Tier, TierQueue] = field(default_factory=dict)
    _predictor: LatencyPredictor | None = None

    # -- per-view derived state ------------------------------------------------------------

    @property
    def predictor(self) -> LatencyPredictor:
        """The perf model's latency predictions for SLO checks (reads the live pool maps)."""
        if self._predictor is None:
            self._predictor = LatencyPredictor(self._deployments, self._batch_caps)
        return self._predictor

    def pipeline(self, view: PoolView) -> Pipeline:
        """The routing pipeline for `view`.

        Built once, and again only when the policy changed, which is looked at when the view
        changes (a reloaded file brings both). A new view with the same policy only refreshes
        the pools the pipeline reads, so prefix affinity and the pickers' seeded randomness
        survive hot reloads of the pools; a new policy starts them afresh.
        """
        if self._pipeline_view is view and self._pipeline is not None:
            return self._pipeline
        policy = self.policy()
        if self._pipeline is None or policy != self._pipeline_policy:
            if self._pipeline is not None:
                log.info("event=routing_policy_changed %s", policy.summary())
            self._pipeline = Pipeline.from_config(
                policy,
                deployments=self._deployments,
                batch_caps=self._batch_caps,
                rng=random.Random(0),
            )
            self._pipeline_policy = policy
        self._deployments.clear()
        self._deployments.update({n: p.deployment for n, p in view.pools.items()})
        self._batch_caps.clear()
        self._batch_caps.update({n: p.spec.batching.max_num_seqs for n, p in view.pools.items()})
        self._resize_queues(view)
        self._pipeline_view = view
        return self._pipeline

    def _resize_queues(self, view: PoolView) -> None:
        caps: dict[Tier, int] = dict.fromkeys(TIERS, 0)
        for pool in view.pools.values():
            caps[pool.spec.tier] += len(pool.endpoints) * pool.spec.batching.max_num_seqs
        for tier, cap in caps.items():
            capacity = max(1, int(cap * HEADROOM))
            queue = self._queues.get(tier)
            if queue is None:
                self._queues[tier] = TierQueue(tier, capacity, max_waiting=max(16, capacity))
            else:
                queue.resize(capacity, max_waiting=max(16, capacity))

    # -- the request path ------------------------------------------------------------------

    async def completion(self, scope: Scope, receive: Receive, send: Send, *, chat: bool) -> None:
        started = self.clock()
        request_id = new_request_id()
        headers = header_map(scope)
        done = Progress()
        tenant: Tenant | None = None
        choice: TierChoice | None = None
        settled = False
        guard: DisconnectGuard | None = None
        hold_usd: float | None = None  # held against the tenant's budget while in flight

        def account() -> None:
            """Account for the request, once (by `settle`, or at the end for requests that
            ended otherwise)."""
            nonlocal settled
            if settled:
                return
            settled = True
            self._account(done, tenant, choice, request_id, started)

        async def settle() -> None:
            """Account for the request and wait for its ledger record to be committed: awaited
            before the reply's last bytes go out, so a reply the client has whole is in the
            ledger, even if the router is killed right after."""
            account()
            await self.ledger.committed()

        try:
            tenant = self.tenants.authenticate(headers.get("authorization"))
            request = parse_completion(
                await read_body(receive, headers, self.settings.max_body_bytes), chat=chat
            )
            request.slo = parse_slo(headers)
            guard = DisconnectGuard(receive)
            view = self.view()
            pipeline = self.pipeline(view)
            plan = cascade_plan(headers, request, view, tenant)
            if plan is None:
                choice, tier = self._tier(headers, request, view, tenant)
            else:
                choice = TierChoice(plan.cascade.first, "cascade", "standard", False)
            hold_usd = self.budgets.check(
                tenant, self.wall(), self._most_it_may_cost(view, request, plan, choice, tenant)
            )
            estimate = request.tokens_expected
            self.limiter.check(tenant, started, estimate)
            done.estimated_tokens = estimate
            if plan is not None:
                request, choice = await self._first_attempt(
                    send, view, pipeline, request, plan, tenant, request_id, started, done,
                    settle, guard,
                )  # fmt: skip
                if not done.escalated:
                    return
            with guard.cancellable():
                tier = await self._admit(
                    view, request, choice, choice.tier if plan else tier, tenant
                )
            try:
                await self._serve(
                    headers, receive, send, view, pipeline, request, choice, tier, request_id,
                    done, settle, guard,
                )  # fmt: skip
            finally:
                self._queues[tier].release()
        except RouterError as error:
            done.status = error.status
            if error.code in ("tier_saturated", "slo_unattainable"):
                done.outcome = "shed"  # refused by admission: served late or not at all
            elif error.status >= 502:
                done.outcome = "upstream_error"
            else:
                done.outcome = "rejected"
            await settle()  # recorded before the client has the refusal, as a reply is
            await self._refuse(send, error, request_id)
        except ClientGone:
            done.outcome, done.status = "client_disconnect", 499
        except Exception:
            await settle()  # the 500 the app sends next goes out after the record, as a reply's
            raise
        finally:
            if guard is not None:
                guard.stop()
            account()
            if hold_usd is not None and tenant is not None:
                self.budgets.release(tenant, hold_usd)  # its actual cost is counted now

    def _most_it_may_cost(
        self,
        view: PoolView,
        request: CompletionRequest,
        plan: CascadePlan | None,
        choice: TierChoice,
        tenant: Tenant,
    ) -> float:
        """The budget hold of a request: the most it may cost at the dearest pool that may
        serve it (both tiers of a cascade, which may bill both); see `PoolView.most_cost_usd`."""
        if tenant.budget_usd is None:
            return 0.0
        bounds = (request.prompt_tokens_most, request.max_tokens, request.sequences)
        if plan is None:
            return max(
                view.most_cost_usd(request.model, tier, *bounds)
                for tier in self._tiers_to_try(view, request, choice, choice.tier, tenant)
            )
        first, then = plan.cascade.first, plan.cascade.then
        return view.most_cost_usd(plan.first_model, first, *bounds) + (
            view.most_cost_usd(plan.then_model, then, *bounds)
        )

    async def _first_attempt(
        self,
        send: Send,
        view: PoolView,
        pipeline: Pipeline,
        request: CompletionRequest,
        plan: CascadePlan,
        tenant: Tenant,
        request_id: str,
        started: float,
        done: Progress,
        settle: Callable[[], Awaitable[None]],
        guard: DisconnectGuard,
    ) -> tuple[CompletionRequest, TierChoice]:
        """Serve on the cascade's first tier, whole. A usable reply goes to the client and
        `done` describes it; otherwise attempt 1 is billed here, `done` is reset for attempt 2
        and the request and tier for attempt 2 are returned."""
        first, then = plan.cascade.first, plan.cascade.then
        # A whole reply: the client's stream_options stay out (vLLM refuses them without
        # `stream`, which would escalate every streamed cascade).
        fields = {k: v for k, v in request.body.items() if k != "stream_options"}
        attempt = replace(
            request,
            body={**fields, "model": plan.first_model, "stream": False},
            model=plan.first_model,
            stream=False,
            raw=None,
        )
        choice = TierChoice(first, "cascade", "standard", False)
        problem: str | None = "no reply"
        reply: dict[str, Any] | None = None
        refusal: bytes | None = None  # the node refused the request itself
        one = Progress(estimated_tokens=done.estimated_tokens)
        with guard.cancellable():
            await self._admit(view, attempt, choice, first, tenant)
        try:
            with guard.cancellable():
                opened, pool = await self._open(view, pipeline, attempt, first, request_id, one)
            try:
                with guard.cancellable():
                    body = await opened.read()
                one.status = opened.status
            except UpstreamError as exc:
                raise bad_reply(f"the serving node's reply was cut short ({exc})") from None
            finally:
                await opened.close()
            if one.status == 200:
                try:
                    reply = json.loads(body)
                    bill(one, pool, reply)
                    problem = None  # unless the tool-call check below finds one
                except (ValueError, TypeError, AttributeError):
                    problem = "a malformed reply"
            elif _the_request_s_fault(one.status, body):
                refusal = body
        except RouterError as error:
            one.status, problem = error.status, error.message
        finally:
            self._queues[first].release()
        # What the client is told when the first tier's answer is the one it gets.
        headers = {
            "x-tiergate-tier": first,
            "x-tiergate-tier-requested": first,
            "x-tiergate-pool": one.pool.spec.name if one.pool else "",
            "x-tiergate-request-id": request_id,
            "x-tiergate-escalated": "false",
        }
        if refusal is not None:
            # The full model would refuse it too: the client gets the refusal, not a premium
            # attempt billed for nothing.
            one.outcome = "rejected"
            done.__dict__.update(one.__dict__)
            await settle()
            await send_bytes(send, one.status, refusal, encode_headers(headers))
            return request, choice
        if problem is None and reply is not None:
            # After the slot is free: the check may take up to its deadline.
            problem = await self.tool_checker.problem(reply, request.body, tenant.name)
        if problem is None and reply is not None:
            one.outcome = "ok"
            reply["service_tier"] = openai_service_tier(first, choice.priority)
            headers["x-tiergate-cost-usd"] = f"{one.cost_usd:.10f}"
            if request.stream:
                payload = as_event_stream(reply, include_usage=request.include_usage)
                kind = (b"content-type", b"text/event-stream")
            else:
                payload = json.dumps(reply, separators=(",", ":")).encode()
                kind = (b"content-type", b"application/json")
            done.__dict__.update(one.__dict__)
            await settle()
            await send_bytes(send, 200, payload, encode_headers(headers), content_type=kind)
            return request, choice
        # Escalate: attempt 1 is billed as it was; attempt 2 gets the full model.
        one.outcome = "error" if one.status == 200 else "upstream_error"
        one.escalated = True
        self._account(one, tenant, choice, request_id, started)
        self.metrics.escalations.labels(first, then).inc()
        log.info("event=cascade_escalated request_id=%s from=%s to=%s reason=%r",
                 request_id, first, then, problem)  # fmt: skip
        done.attempt, done.escalated, done.estimated_tokens = 2, True, 0
        second = replace(
            request,
            body={**request.body, "model": plan.then_model},
            model=plan.then_model,
            raw=None,
        )
        return second, TierChoice(then, "cascade", "standard", False)

    def _within_slo(
        self, order: list[EndpointState], request: CompletionRequest
    ) -> list[EndpointState]:
        """The endpoints the perf model expects to meet the request's SLO; 503 when none is:
        better to say so now than to serve late."""
        assert request.slo is not None
        ttft_slo, tpot_slo = request.slo
        best: LatencyEstimate | None = None
        kept = []
        for endpoint in order:
            estimate = self.predictor.predict(
                endpoint.pool,
                endpoint_load(endpoint),
                request.prompt_tokens_estimate,
                request.output_tokens_expected,
            )
            if estimate is None:
                kept.append(endpoint)  # unknown to the model: give it the benefit of the doubt
                continue
            if (ttft_slo is None or estimate.ttft_s <= ttft_slo) and (
                tpot_slo is None or estimate.tpot_s <= tpot_slo
            ):
                kept.append(endpoint)
            elif best is None or estimate.total_s < best.total_s:
                best = estimate
        if kept:
            return kept
        detail = (
            f" (best predicted: TTFT {best.ttft_s * 1000:.0f} ms, TPOT {best.tpot_s * 1000:.1f} ms)"
            if best is not None
            else ""
        )
        raise RouterError(
            503,
            f"no endpoint is predicted to meet the requested SLO{detail}",
            type="server_error",
            code="slo_unattainable",
            headers={"Retry-After": "1"},
        )

    def _tier(
        self, headers: dict[str, str], request: CompletionRequest, view: PoolView, tenant: Tenant
    ) -> tuple[TierChoice, Tier]:
        serving = view.tiers_serving(request.model)
        if not serving:
            served = ", ".join(sorted(view.served_models)) or "none"
            raise RouterError(
                404,
                f"model {request.model!r} is not served here; served models: {served}",
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
        raise RouterError(
            400,
            f"model {request.model!r} is not served in the {choice.tier} tier; "
            f"tiers serving it: {', '.join(serving)}",
            code="tier_not_served",
            param="model",
        )

    @staticmethod
    def _tiers_to_try(
        view: PoolView, request: CompletionRequest, choice: TierChoice, tier: Tier, tenant: Tenant
    ) -> list[Tier]:
        """`tier`, then for `service_tier: auto` the other tiers serving the model that the
        tenant may use, in the order admission tries them."""
        if not choice.may_fall_back:
            return [tier]
        others = view.tiers_serving(request.model)
        return [tier, *(t for t in others if t != tier and t in tenant.allowed_tiers)]

    async def _admit(
        self,
        view: PoolView,
        request: CompletionRequest,
        choice: TierChoice,
        tier: Tier,
        tenant: Tenant,
    ) -> Tier:
        """A slot in `tier`'s queue; `service_tier: auto` may move to a quieter tier."""
        tiers = self._tiers_to_try(view, request, choice, tier, tenant)
        for i, candidate in enumerate(tiers):
            last = i == len(tiers) - 1
            busy = self.saturation.is_saturated(view, request.model, candidate)
            queue = self._queues[candidate]
            if busy and (choice.priority == "flex" or not last):
                if last:
                    self.metrics.shed.labels(candidate, choice.priority).inc()
                    raise shed_error(candidate, 2)
                continue
            if not last and queue.active >= queue.capacity:
                continue  # full here: an auto request tries the next tier before waiting
            try:
                await queue.acquire(choice.priority)
            except Shed:
                self.metrics.shed.labels(candidate, choice.priority).inc()
                if last:
                    raise shed_error(candidate, 1) from None
                continue
            return candidate
        raise shed_error(tier, 1)  # unreachable: the last tier either admits or raises

    async def _serve(
        self,
        headers: dict[str, str],
        receive: Receive,
        send: Send,
        view: PoolView,
        pipeline: Pipeline,
        request: CompletionRequest,
        choice: TierChoice,
        tier: Tier,
        request_id: str,
        done: Progress,
        settle: Callable[[], Awaitable[None]],
        guard: DisconnectGuard,
    ) -> None:
        extra = {h: headers[h] for h in FORWARDED if h in headers}
        if self.settings.forward_fault_header and FAULT_HEADER in headers:
            extra[FAULT_HEADER] = headers[FAULT_HEADER]
        start_s = self.clock()
        service_tier = openai_service_tier(tier, choice.priority)
        with guard.cancellable():
            opened, pool, first = await self._open_stream(
                view, pipeline, request, tier, request_id, done, extra, service_tier
            )
        reply_headers = {
            "x-tiergate-tier": tier,
            "x-tiergate-tier-requested": choice.tier,
            "x-tiergate-pool": pool.spec.name,
            "x-tiergate-request-id": request_id,
        }
        if tier != choice.tier:
            reply_headers["x-tiergate-fallback"] = "true"
        if done.escalated:
            reply_headers["x-tiergate-escalated"] = "true"
        try:
            if first is not None:
                guard.stop()  # the stream watches its client itself
                await relay_stream(
                    receive, send, first, request, reply_headers, done, settle=settle,
                    clock=self.clock, metrics=self.metrics, start_s=start_s,
                )  # fmt: skip
            else:
                await relay_whole(
                    send, opened, pool, reply_headers, done,
                    service_tier=service_tier, settle=settle, guard=guard,
                )  # fmt: skip
        finally:
            await opened.close()

    async def _open_stream(
        self,
        view: PoolView,
        pipeline: Pipeline,
        request: CompletionRequest,
        tier: Tier,
        request_id: str,
        done: Progress,
        extra: dict[str, str],
        service_tier: str,
    ) -> tuple[Opened, RoutedPool, FirstToken | None]:
        """`_open`, and for a stream, read up to its first token: a node that fails before it
        (killed while the request waited or prefilled) is the endpoint's failure, and the
        request goes to another endpoint, the client having seen nothing yet. Whole replies
        and refusals come back with no first token read."""
        failed: set[str] = set()
        while True:
            try:
                opened, pool = await self._open(
                    view, pipeline, request, tier, request_id, done, extra, skip=failed
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
                first = await first_token(
                    opened, pool, request, service_tier=service_tier, clock=self.clock
                )
                return opened, pool, first
            except UpstreamError as exc:
                await opened.close()
                self.upstream.failed(opened.endpoint)
                failed.add(opened.endpoint.url)
                log.warning(
                    "event=stream_failed_before_first_token request_id=%s pool=%s endpoint=%s "
                    "error=%s", request_id, pool.spec.name, opened.endpoint.url, exc,
                )  # fmt: skip
                if len(failed) >= self.upstream.attempts:
                    raise _dropped_before_first_token(tier, len(failed)) from None
                self.metrics.retries.inc()
            except BaseException:
                await opened.close()
                raise

    async def _open(
        self,
        view: PoolView,
        pipeline: Pipeline,
        request: CompletionRequest,
        tier: Tier,
        request_id: str,
        done: Progress,
        extra_headers: dict[str, str] | None = None,
        skip: Collection[str] = (),
    ) -> tuple[Opened, RoutedPool]:
        """Pick endpoints of `tier` (but those whose URLs are in `skip`) and open the upstream
        request on the first that answers."""
        ctx = RequestContext(
            request.model,
            tier,
            request.prompt_tokens_estimate,
            request.output_tokens_expected,
            prefix_hashes(request.prefix_text),
        )
        order = pipeline.pick(ctx, view.candidates(request.model, tier), self.clock())
        if skip:
            order = [endpoint for endpoint in order if endpoint.url not in skip]
        if not order:
            raise RouterError(
                503,
                f"no endpoint of the {tier} tier is available for {request.model!r}",
                type="server_error",
                code="no_capacity",
                headers={"Retry-After": "1"},
            )
        if request.slo is not None:
            order = self._within_slo(order, request)
        headers = {
            "content-type": "application/json",
            "x-tiergate-request-id": request_id,
            **(extra_headers or {}),
        }
        path = "/v1/chat/completions" if request.chat else "/v1/completions"
        try:
            opened = await self.upstream.open(order, path, upstream_body(request), headers)
        except UpstreamUnavailable as exc:
            self.metrics.retries.inc(max(exc.attempts - 1, 0))
            raise
        self.metrics.retries.inc(opened.attempts - 1)
        pipeline.observe(ctx, opened.endpoint)
        pool = view.pools[opened.endpoint.pool]
        done.tier_served, done.pool, done.endpoint = tier, pool, opened.endpoint.url
        return opened, pool

    async def _refuse(self, send: Send, error: RouterError, request_id: str) -> None:
        try:
            await send_error(send, error, {"x-tiergate-request-id": request_id})
        except (OSError, RuntimeError):
            pass  # the response had started, or the client is gone: nothing more to say

    def _account(
        self,
        done: Progress,
        tenant: Tenant | None,
        choice: TierChoice | None,
        request_id: str,
        started: float,
    ) -> None:
        """Count and bill one attempt. A billing failure must be loud (a metric, a log line), not
        fatal to the reply or to a cascade's second attempt."""
        try:
            requested = choice.tier if choice is not None else "batched"
            served = done.tier_served or "none"
            self.metrics.requests.labels(requested, served, done.outcome).inc()
            if done.tier_served is not None:
                tier = done.tier_served
                if done.ttft_s is not None:
                    self.metrics.ttft.labels(tier).observe(done.ttft_s)
                self.metrics.cost.labels(tier).inc(done.cost_usd)
                self.metrics.tokens.labels(tier, "prompt").inc(done.prompt_tokens)
                self.metrics.tokens.labels(tier, "completion").inc(done.completion_tokens)
            if tenant is None or choice is None:
                return  # unauthenticated or unparsable: no tenant to bill
            now = self.clock()
            actual = done.prompt_tokens + done.completion_tokens
            self.limiter.settle(tenant, now, actual - done.estimated_tokens)
            try:
                self.ledger.add(
                    UsageRecord(
                        request_id=request_id,
                        time_s=self.wall(),
                        tenant=tenant.name,
                        tier_requested=choice.tier,
                        tier_served=done.tier_served,
                        pool=done.pool.spec.name if done.pool else None,
                        endpoint=done.endpoint,
                        prompt_tokens=done.prompt_tokens,
                        completion_tokens=done.completion_tokens,
                        latency_s=now - started,
                        ttft_s=done.ttft_s,
                        cost_usd=done.cost_usd,
                        http_status=done.status,
                        outcome=done.outcome,
                        escalated=done.escalated,
                        attempt=done.attempt,
                    )
                )
            finally:
                # After the ledger (with no await between: the guard may re-read it), and
                # even when it refused the record: a ledger failure must not lift a budget.
                if done.cost_usd:
                    self.budgets.add(tenant, done.cost_usd, self.wall())
        except Exception:
            self.metrics.accounting_errors.inc()
            log.exception("event=accounting_failed request_id=%s", request_id)


def _the_request_s_fault(status: int, body: bytes) -> bool:
    """Whether a cascade's first tier refused the request for what it asks (a bad field), which
    the second tier would refuse too, rather than for what it is (its context, its load)."""
    if not 400 <= status < 500 or status in (404, 408, 429):
        return False
    code: object
    try:
        code = json.loads(body)["error"]["code"]
    except (ValueError, TypeError, KeyError):
        code = None
    # The distilled model's context may be shorter than the full model's.
    return code != "context_length_exceeded"


def _dropped_before_first_token(tier: Tier, attempts: int) -> RouterError:
    return bad_reply(
        f"the serving nodes of the {tier} tier failed before the first token "
        f"({attempts} attempt(s))"
    )
