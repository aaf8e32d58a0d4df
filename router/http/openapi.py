"""`GET /openapi.json`: the router's API, described from pydantic models of what it reads.

The request schemas list the fields the router itself reads (routing, billing) with the
constraints `router/request/body.py` enforces (its limits are imported from there, and a test
generates bodies from this document that the router must accept); everything else OpenAI
defines is passed to the serving node, so the schemas allow additional fields.
"""

from __future__ import annotations

import functools
from itertools import permutations
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tiergate import __version__
from tiergate.common.tiers import DEFAULT_TIER, DEFINITIONS
from tiergate.router.base.tiers import TIER_HEADER, TIERS, Tier
from tiergate.router.request.body import (
    MAX_SEQUENCES,
    MAX_SLO_MS,
    MAX_TOKENS_LIMIT,
    SLO_TPOT_HEADER,
    SLO_TTFT_HEADER,
)
from tiergate.router.request.cascade import CASCADE_HEADER
from tiergate.router.tenants.spill_policy import SPILL_PRICE_HEADER, SPILL_TO_HEADER


class _Open(BaseModel):
    # Strict: the router takes JSON's own types only (no "yes" for true, no "5" for 5).
    model_config = ConfigDict(extra="allow", strict=True)


class StreamOptions(_Open):
    include_usage: bool = Field(default=False, description="Send a final usage chunk.")
    continuous_usage_stats: bool = Field(
        default=False,
        description="With include_usage: the usage so far on every chunk too (as vLLM does).",
    )


class _Common(_Open):
    model: str = Field(min_length=1, description="A served model name (see GET /v1/models).")
    stream: bool = Field(default=False, description="Stream server-sent events.")
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(
        default=None, ge=1, le=MAX_TOKENS_LIMIT, description="Output token limit."
    )
    max_completion_tokens: int | None = Field(
        default=None,
        ge=1,
        le=MAX_TOKENS_LIMIT,
        description="Same, newer name; wins over max_tokens when both are set.",
    )
    n: int | None = Field(
        default=None, ge=1, le=MAX_SEQUENCES, description="Choices to generate per prompt."
    )
    service_tier: Literal["auto", "default", "flex", "priority"] | None = Field(
        default=None,
        description="; ".join(
            f"{d.openai_service_tier} -> {d.name}"
            for d in DEFINITIONS.values()
            if d.openai_service_tier
        )
        + f"; flex -> {DEFAULT_TIER} at lowest priority; auto may be served by another tier "
        "when its own is saturated.",
    )
    speed: Literal["fast", "standard"] | None = Field(
        default=None,
        description="Anthropic style: "
        + "; ".join(f"fast -> {d.name}" for d in DEFINITIONS.values() if d.speed_fast)
        + ".",
    )


class ChatCompletionRequest(_Common):
    messages: list[dict[str, Any]] = Field(min_length=1, description="The conversation.")
    tools: list[dict[str, Any]] | None = Field(default=None, description="Tools (functions).")


class CompletionRequest(_Common):
    best_of: int | None = Field(
        default=None, ge=1, le=MAX_SEQUENCES, description="Sequences generated per prompt."
    )
    prompt: (
        str
        | Annotated[list[str], Field(min_length=1)]
        | Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
        | Annotated[
            list[Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]],
            Field(min_length=1),
        ]
    ) = Field(description="The prompt: text, texts, token ids, or arrays of token ids.")


class ErrorBody(BaseModel):
    message: str
    type: str
    code: str | None
    param: str | None


class ErrorEnvelope(BaseModel):
    error: ErrorBody


class ModelEntry(BaseModel):
    id: str
    object: Literal["model"]
    owned_by: str
    tiers: list[Tier] = Field(description="Tiers with a pool serving this model.")


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelEntry]


_ERRORS = {
    "400": "Bad request (invalid body, unknown tier, model not served in the tier, a bad "
    "cascade or SLO header, a media URL whose host the gateway does not allow).",
    "401": "Missing or invalid API key.",
    "403": "The tenant may not use the resolved tier.",
    "404": "Model not served here (the message lists the served models).",
    "405": "Method not allowed (see the Allow header).",
    "413": "Body too large.",
    "429": "Rate limit, budget, a saturated tier or the tenant's maxQueued; see Retry-After.",
    "500": "A router bug (logged, counted in tiergate_internal_errors_total).",
    "502": "The serving node's reply was malformed or cut short (bad_upstream_reply).",
    "503": "No endpoint could serve the request (no_capacity, upstream_unavailable), or the "
    "SLO headers cannot be met on any candidate (slo_unattainable); see Retry-After.",
    "504": "A whole (not streamed) reply the serving node or provider did not finish within "
    "the router's wholeReplyTimeoutS (upstream_timeout); ask for a stream to receive a long "
    "reply.",
}
#: Errors that carry Retry-After (seconds; a spent budget of period `total` has none).
_RETRY_AFTER = ("429", "503")

_REPLY_HEADERS = {
    "x-tiergate-tier": "The tier that served the request.",
    "x-tiergate-tier-requested": "The tier the request resolved to.",
    "x-tiergate-pool": "The pool that served the request.",
    "x-tiergate-request-id": "The router's id of the request (also in the ledger).",
    "x-tiergate-cost-usd": "Cost billed (non-streaming replies; streams put it in usage).",
    "x-tiergate-fallback": "true when service_tier auto moved the request to another tier.",
    "x-tiergate-escalated": "With a cascade: true when the first tier's reply was not usable "
    "and the second tier's is returned (both attempts are billed).",
    "x-tiergate-spilled-from": "The tier the request asked for, when spill-over moved it to "
    "the tier that served it (and billed it).",
    "x-tiergate-spill-reason": "Why it moved: saturated (its tier had no free slot, or every "
    "endpoint queued) or slo (its tier was predicted to miss the SLO headers).",
}

#: A comma-separated list of tier names, or `none`.
_SPILL_TO_PATTERN = rf"^\s*(none|({'|'.join(TIERS)})(\s*,\s*({'|'.join(TIERS)}))*)\s*$"

_REQUEST_HEADERS: list[tuple[str, dict[str, Any], str]] = [
    (TIER_HEADER, {"type": "string", "enum": list(TIERS)},
     "Ask for a tier explicitly (first rule of tier resolution)."),
    (CASCADE_HEADER, {"type": "string", "enum": [f"{a}>{b}" for a, b in permutations(TIERS, 2)]},
     "Serve on the first tier, and on the second when the first's tool call is malformed, "
     "e.g. wafer-scale>premium."),
    (SLO_TTFT_HEADER, {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": MAX_SLO_MS},
     "Time to first token the client needs (ms): refused early with 503 when no candidate "
     "is predicted to meet it."),
    (SLO_TPOT_HEADER, {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": MAX_SLO_MS},
     "Time per output token the client needs (ms), likewise."),
    (SPILL_TO_HEADER, {"type": "string", "pattern": _SPILL_TO_PATTERN},
     "Tiers this request may move to when its own is saturated or predicted to miss its SLO "
     "(comma-separated, or none), in place of the tenant's spillOver.to."),
    (SPILL_PRICE_HEADER, {"type": "number", "minimum": 0},
     "The most this request may cost per million output tokens where it moves, in place of "
     "the tenant's spillOver.maxOutputUsdPerMillion."),
]  # fmt: skip


def _reply_service_tiers() -> str:
    """`tier: service_tier` of every tier's replies, e.g. for the 200 reply's description."""
    return "; ".join(f"{d.name}: {d.reply_service_tier}" for d in DEFINITIONS.values())


def _completion_op(summary: str, schema: str) -> dict[str, Any]:
    return {
        "summary": summary,
        "security": [{"bearer": []}],
        "parameters": [
            {
                "name": name,
                "in": "header",
                "required": False,
                "schema": schema,
                "description": description,
            }
            for name, schema, description in _REQUEST_HEADERS
        ],  # fmt: skip
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}},
        },
        "responses": {
            "200": {
                "description": "The completion (JSON), or server-sent events when stream is "
                "true. Its service_tier field is OpenAI's word for the tier that served it "
                f"({_reply_service_tiers()}; flex instead on a tier of standard priority when "
                "the request asked for flex); the x-tiergate-tier header names the tier itself.",
                "headers": {
                    k: {"description": v, "schema": {"type": "string"}}
                    for k, v in _REPLY_HEADERS.items()
                },
                "content": {
                    "application/json": {"schema": {"type": "object"}},
                    "text/event-stream": {"schema": {"type": "string"}},
                },
            },
            **{
                code: _error(text, retry_after=code in _RETRY_AFTER)
                for code, text in _ERRORS.items()
            },
            "default": _error(
                "The serving node refused the request itself: its status and envelope, "
                "passed through."
            ),
        },
    }


def _error(description: str, *, retry_after: bool = False) -> dict[str, Any]:
    error: dict[str, Any] = {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorEnvelope"}}},
    }
    if retry_after:
        error["headers"] = {
            "Retry-After": {"description": "Seconds to wait.", "schema": {"type": "integer"}}
        }
    return error


@functools.cache
def openapi_document() -> dict[str, Any]:
    schemas: dict[str, Any] = {}
    for model in (ChatCompletionRequest, CompletionRequest, ErrorEnvelope, ModelList):
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    return {
        "openapi": "3.1.0",
        "info": {"title": "tiergate router", "version": __version__},
        "paths": {
            "/v1/chat/completions": {
                "post": _completion_op("Chat completion", "ChatCompletionRequest")
            },
            "/v1/completions": {"post": _completion_op("Text completion", "CompletionRequest")},
            "/v1/models": {
                "get": {
                    "summary": "Served models and the tiers serving them",
                    "responses": {
                        "200": {
                            "description": "Models",
                            "content": {
                                "application/json": {
                                    "schema": {"$ref": "#/components/schemas/ModelList"}
                                }
                            },
                        }
                    },
                }
            },
            "/v1/usage": {
                "get": {
                    "summary": "The calling tenant's own usage and budget",
                    "security": [{"bearer": []}],
                    "responses": {
                        "200": {"description": "Usage"},
                        "401": _error("No or bad key."),
                        "503": _error(
                            "The shared usage ledger cannot be read now (ledger_unavailable).",
                            retry_after=True,
                        ),
                    },
                }
            },
            "/healthz": {
                "get": {"summary": "Liveness", "responses": {"200": {"description": "Alive"}}}
            },
            "/readyz": {
                "get": {
                    "summary": "Readiness: started and synced (from a file: and an endpoint)",
                    "responses": {
                        "200": {"description": "Ready"},
                        "503": {"description": "Not ready"},
                    },
                }
            },
            "/openapi.json": {
                "get": {
                    "summary": "This document",
                    "responses": {"200": {"description": "OpenAPI"}},
                }
            },
        },
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
