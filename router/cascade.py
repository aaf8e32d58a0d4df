"""Cascade: answer on the fast distilled tier first, escalate malformed tool calls.

`x-tiergate-cascade: wafer-scale>premium` asks the router to serve a tool-calling request on
the first tier (a distilled model: fast, cheaper, sloppier) and to check the reply's tool
call: arguments that are not JSON, or that do not match the tool's JSON schema, send the
request to the second tier (the full model), whose reply is returned instead. Both attempts
are billed and recorded. The first attempt is read whole (it is the fast one); a client that
asked for a stream gets the kept reply as server-sent events. The check is
router/tool_calls.py, run in a worker process with a deadline by router/tool_check.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .discovery import PoolView
from .errors import RouterError
from .request import CompletionRequest
from .tenants import Tenant, authorize_tier
from .tiers import TIERS, Tier

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


def as_event_stream(reply: dict[str, Any], *, include_usage: bool) -> bytes:
    """A whole chat completion as the SSE a streaming client expects: one chunk with the
    message, one with usage if asked, then [DONE]."""
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
            model = pool.deployment.model
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
                and (
                    p.deployment.model.name in family or p.deployment.model.distilled_from in family
                )
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
