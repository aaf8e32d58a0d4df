"""Cascade: answer on the fast distilled tier first, escalate malformed tool calls.

`x-tiergate-cascade: wafer-scale>premium` asks the router to serve a tool-calling request on
the first tier (a distilled model: fast, cheaper, sloppier) and to check the reply's tool
call: arguments that are not JSON, or that do not match the tool's JSON schema, send the
request to the second tier (the full model), whose reply is returned instead. Both attempts
are billed and recorded. The first attempt is read whole (it is the fast one); a client that
asked for a stream gets the kept reply as server-sent events. The check is
router/request/tool_calls.py, run in a worker process with a deadline by
router/request/tool_check.py.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, replace
from typing import Any, Protocol

from tiergate.router.admission import Admission
from tiergate.router.base.asgi import encode_headers, send_bytes
from tiergate.router.base.errors import RouterError
from tiergate.router.base.metrics import CascadeMetrics
from tiergate.router.base.tiers import TIERS, Tier, TierChoice, openai_service_tier
from tiergate.router.discovery.view import PoolView, RoutedPool
from tiergate.router.policy import Pipeline
from tiergate.router.request.accounting import Accountant
from tiergate.router.request.body import CompletionRequest
from tiergate.router.request.exchange import Exchange
from tiergate.router.request.progress import Progress
from tiergate.router.request.refusal import hosted_refusal, node_refusal
from tiergate.router.request.relay import bad_reply, bill
from tiergate.router.request.tool_check import ToolCallChecker
from tiergate.router.tenants.registry import Tenant, authorize_tier
from tiergate.router.upstream.proxy import ReplyTooLarge, UpstreamError, WholeReplyTimeout
from tiergate.router.upstream.reply import Reply

log = logging.getLogger("tiergate.router")

CASCADE_HEADER = "x-tiergate-cascade"


@dataclass(frozen=True, slots=True)
class Cascade:
    first: Tier
    then: Tier


@dataclass(frozen=True, slots=True)
class CascadePlan:
    """A cascade with the served model to use on each of its tiers."""

    cascade: Cascade
    first_model: str
    then_model: str


def parse_cascade(value: str) -> Cascade:
    """`first>then`, two different tier names; RouterError(400) otherwise."""
    parts = [p.strip().lower() for p in value.split(">")]
    if len(parts) != 2 or parts[0] == parts[1] or not all(p in TIERS for p in parts):
        raise RouterError(
            400,
            f"{CASCADE_HEADER} must be two different tiers as first>then, "
            f"e.g. wafer-scale>premium; tiers: {', '.join(TIERS)}",
            code="invalid_cascade",
            param=CASCADE_HEADER,
        )
    return Cascade(parts[0], parts[1])  # type: ignore[arg-type]


def as_event_stream(
    reply: dict[str, Any], *, include_usage: bool, continuous_usage: bool = False
) -> bytes:
    """A whole chat completion as the SSE a streaming client expects: one chunk with the
    message (with the usage too if asked for on every chunk), one with usage if asked, then
    [DONE]."""
    choices = []
    for choice in reply.get("choices") or []:
        message = dict(choice.get("message") or {})
        if message.get("tool_calls"):
            message["tool_calls"] = [
                {"index": i, **call} for i, call in enumerate(message["tool_calls"])
            ]
        choices.append(
            {
                "index": choice.get("index", 0),
                "delta": message,
                "finish_reason": choice.get("finish_reason"),
            }
        )
    base: dict[str, Any] = {
        k: reply[k] for k in ("id", "created", "model", "service_tier") if k in reply
    }
    chunk: dict[str, Any] = {**base, "object": "chat.completion.chunk", "choices": choices}
    if continuous_usage and "usage" in reply:
        chunk["usage"] = reply["usage"]
    out = [b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"]
    if include_usage and "usage" in reply:
        usage: dict[str, Any] = {
            **base,
            "object": "chat.completion.chunk",
            "choices": [],
            "usage": reply["usage"],
        }
        out.append(b"data: " + json.dumps(usage, separators=(",", ":")).encode() + b"\n\n")
    out.append(b"data: [DONE]\n\n")
    return b"".join(out)


def cascade_plan(
    headers: dict[str, str], request: CompletionRequest, view: PoolView, tenant: Tenant
) -> CascadePlan | None:
    """The cascade a request asks for, with the model to use on each tier; None if it asks
    for none or has no tools to check (then it is served as usual)."""
    value = headers.get(CASCADE_HEADER)
    if value is None:
        return None
    cascade = parse_cascade(value)
    if not (request.chat and request.body.get("tools")):
        return None
    for tier in (cascade.first, cascade.then):
        authorize_tier(tenant, tier)
    family: set[str] = set()
    for pool in view.pools.values():
        if request.model in pool.spec.names:
            model = pool.model
            if model is not None:
                family |= {model.name, *([model.distilled_from] if model.distilled_from else [])}
    models = []
    for tier in (cascade.first, cascade.then):
        # The first name of a related pool that an endpoint of the tier answers to (the view's
        # index): during a rollout that renames the model, the pods of the previous spec
        # answer to the previous names only.
        match = next(
            (
                name
                for p in view.pools.values()
                if p.spec.tier == tier
                and p.model is not None
                and (p.model.name in family or p.model.distilled_from in family)
                for name in p.spec.names
                if view.candidates(name, tier)
            ),
            None,
        )
        if match is None:
            raise RouterError(
                400,
                f"cascade: no model related to {request.model!r} is served in the {tier} tier",
                code="invalid_cascade",
                param=CASCADE_HEADER,
            )
        models.append(match)
    return CascadePlan(cascade, models[0], models[1])


class CascadeStages(Protocol):
    """What serving a cascade's first tier needs of the router (router/handler.py)."""

    accountant: Accountant
    admission: Admission
    tool_checker: ToolCallChecker

    @property
    def metrics(self) -> CascadeMetrics: ...

    def current(self) -> tuple[PoolView, Pipeline]: ...

    async def open(
        self,
        ex: Exchange,
        view: PoolView,
        pipeline: Pipeline,
        request: CompletionRequest,
        tier: Tier,
        done: Progress,
    ) -> tuple[Reply, RoutedPool]: ...


async def serve_first_tier(
    stages: CascadeStages, ex: Exchange, view: PoolView, pipeline: Pipeline, plan: CascadePlan
) -> bool:
    """Serve `ex` on the cascade's first tier, whole. True when the client got that tier's
    reply (or its refusal of the request itself); False when the request escalates: attempt 1
    is accounted for, and `ex` holds the request, choice and a fresh attempt for the second
    tier."""
    assert ex.request is not None and ex.tenant is not None and ex.guard is not None
    request = ex.request
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
    one = Progress(estimated_tokens=ex.done.estimated_tokens)
    reply, problem, refusal = await _first_reply(stages, ex, view, pipeline, attempt, choice, one)
    # What the client is told when the first tier's answer is the one it gets.
    headers = {
        "x-tiergate-tier": first,
        "x-tiergate-tier-requested": first,
        "x-tiergate-pool": one.pool.spec.name if one.pool else "",
        "x-tiergate-request-id": ex.request_id,
        "x-tiergate-escalated": "false",
    }
    if refusal is not None:
        # The full model would refuse it too: the client gets the refusal, not a premium
        # attempt billed for nothing.
        one.outcome = "rejected"
        ex.done = one
        await stages.accountant.settle(ex)
        await send_bytes(ex.send, one.status, refusal, encode_headers(headers))
        return True
    if problem is None and reply is not None:
        # After the slot is free: the check may take up to its deadline.
        problem = await stages.tool_checker.problem(reply, request.body, ex.tenant.name)
    if problem is None and reply is not None:
        reply["service_tier"] = openai_service_tier(first, choice.priority)
        await _send_reply(stages, ex, one, reply, headers)
        return True
    # Escalate: attempt 1 is billed as it was; attempt 2 gets the full model.
    one.outcome = "error" if one.status == 200 else "upstream_error"
    one.escalated = True
    stages.accountant.account(ex, one)
    stages.metrics.escalations.labels(first, then).inc()
    log.info("event=cascade_escalated request_id=%s from=%s to=%s reason=%r",
             ex.request_id, first, then, problem)  # fmt: skip
    ex.done = Progress(attempt=2, escalated=True)
    ex.request = replace(
        request, body={**request.body, "model": plan.then_model}, model=plan.then_model, raw=None
    )
    ex.choice = TierChoice(then, "cascade", "standard", False)
    return False


async def _first_reply(
    stages: CascadeStages,
    ex: Exchange,
    view: PoolView,
    pipeline: Pipeline,
    attempt: CompletionRequest,
    choice: TierChoice,
    one: Progress,
) -> tuple[dict[str, Any] | None, str | None, bytes | None]:
    """The first tier's reply to `attempt` read whole, billed into `one`: (reply, what is wrong
    with it, or the node's refusal of the request itself)."""
    assert ex.guard is not None and ex.tenant is not None
    tier = choice.tier
    with ex.guard.cancellable():
        grant = await stages.admission.admit(
            view, attempt.model, choice.priority, [tier], ex.tenant, attempt.tokens_expected
        )
    try:
        view, pipeline = stages.current()  # the endpoints now: it may have waited
        with ex.guard.cancellable():
            opened, pool = await stages.open(ex, view, pipeline, attempt, tier, one)
        try:
            with ex.guard.cancellable():
                body = await opened.read()
            one.status = opened.status
        except ReplyTooLarge as exc:
            raise bad_reply(f"the serving node's reply is {exc}") from None
        except UpstreamError as exc:
            raise bad_reply(f"the serving node's reply was cut short ({exc})") from None
        finally:
            await opened.close()
        if one.status != 200:
            if not the_request_s_fault(one.status, body):
                return None, "no reply", None
            hosted = opened.endpoint.hosted
            if hosted is not None:
                body = hosted_refusal(body, one.status, hosted.model, attempt.model)
            else:
                body = node_refusal(body, one.status)
            return None, "no reply", body
        try:
            reply = json.loads(body)
            bill(one, pool, reply, attempt)
            if opened.endpoint.hosted is not None:  # the provider's name for it is not the client's
                reply["model"] = attempt.model
        except (ValueError, TypeError, AttributeError):
            return None, "a malformed reply", None
        return reply, None, None
    except WholeReplyTimeout:
        raise  # the second tier would take as long again: the client has the 504
    except RouterError as error:
        one.status = error.status
        return None, error.message, None
    finally:
        stages.admission.release(grant, one.prompt_tokens + one.completion_tokens)


def the_request_s_fault(status: int, body: bytes) -> bool:
    """Whether a cascade's first tier refused the request for what it asks (a bad field), which
    the second tier would refuse too, rather than for what it is (its context, its load)."""
    if not 400 <= status < 500 or status in (404, 408, 429):
        return False
    try:  # SGLang's fields at the top level are read as the envelope they mean
        error = json.loads(node_refusal(body, status))["error"]
        code, message = error.get("code"), error.get("message")
    except (ValueError, TypeError, KeyError, AttributeError):
        return True
    # The distilled model's context may be shorter than the full model's. OpenAI and the sim
    # node say so by code; vLLM's code is the status (400) and SGLang's too: their messages
    # say it ("This model's maximum context length is ...", "... the model's context length").
    return code != "context_length_exceeded" and not (
        isinstance(message, str) and _CONTEXT_LENGTH.search(message) is not None
    )


_CONTEXT_LENGTH = re.compile(r"context length", re.IGNORECASE)


async def _send_reply(
    stages: CascadeStages,
    ex: Exchange,
    one: Progress,
    reply: dict[str, Any],
    headers: dict[str, str],
) -> None:
    """The first tier's usable reply, billed, to the client: whole, or as the stream it asked
    for."""
    assert ex.request is not None
    one.outcome = "ok"
    headers = {**headers, "x-tiergate-cost-usd": f"{one.cost_usd:.10f}"}
    if ex.request.stream:
        payload = as_event_stream(
            reply,
            include_usage=ex.request.include_usage,
            continuous_usage=ex.request.continuous_usage,
        )
        kind = (b"content-type", b"text/event-stream")
    else:
        payload = json.dumps(reply, separators=(",", ":")).encode()
        kind = (b"content-type", b"application/json")
    ex.done = one
    await stages.accountant.settle(ex)
    await send_bytes(ex.send, 200, payload, encode_headers(headers), content_type=kind)
