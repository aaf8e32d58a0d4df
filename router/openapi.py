"""`GET /openapi.json`: the router's API, described from pydantic models of what it reads.

The request schemas list the fields the router itself reads (routing, billing); everything
else OpenAI defines is passed to the serving node, so the schemas allow additional fields.
"""

from __future__ import annotations

import functools
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tiergate import __version__

from .tiers import TIER_HEADER, TIERS

Tier = Literal["batched", "premium", "wafer-scale"]


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class StreamOptions(_Open):
    include_usage: bool = Field(default=False, description="Send a final usage chunk.")


class _Common(_Open):
    model: str = Field(description="A served model name (see GET /v1/models).")
    stream: bool = Field(default=False, description="Stream server-sent events.")
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1, description="Output token limit.")
    max_completion_tokens: int | None = Field(default=None, ge=1, description="Same, newer name.")
    service_tier: Literal["auto", "default", "flex", "priority"] | None = Field(
        default=None,
        description="priority -> premium; flex -> batched at lowest priority; auto may be "
        "served by another tier when its own is saturated.",
    )
    speed: Literal["fast", "standard"] | None = Field(
        default=None, description="Anthropic style: fast -> premium."
    )


class ChatCompletionRequest(_Common):
    messages: list[dict[str, Any]] = Field(min_length=1, description="The conversation.")
    tools: list[dict[str, Any]] | None = Field(default=None, description="Tools (functions).")


class CompletionRequest(_Common):
    prompt: str | list[str] = Field(description="The prompt.")


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
    "400": "Bad request (invalid body, unknown tier, model not served in the tier).",
    "401": "Missing or invalid API key.",
    "403": "The tenant may not use the resolved tier.",
    "404": "Model not served here (the message lists the served models).",
    "413": "Body too large.",
    "429": "Rate limit, budget or a saturated tier; see Retry-After.",
    "503": "No endpoint could serve the request.",
}

_REPLY_HEADERS = {
    "x-tiergate-tier": "The tier that served the request.",
    "x-tiergate-tier-requested": "The tier the request resolved to.",
    "x-tiergate-pool": "The pool that served the request.",
    "x-tiergate-request-id": "The router's id of the request (also in the ledger).",
    "x-tiergate-cost-usd": "Cost billed (non-streaming replies; streams put it in usage).",
    "x-tiergate-fallback": "true when service_tier auto moved the request to another tier.",
}


def _completion_op(summary: str, schema: str) -> dict[str, Any]:
    return {
        "summary": summary,
        "security": [{"bearer": []}],
        "parameters": [
            {
                "name": TIER_HEADER,
                "in": "header",
                "required": False,
                "schema": {"type": "string", "enum": list(TIERS)},
                "description": "Ask for a tier explicitly (first rule of tier resolution).",
            }
        ],
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}},
        },
        "responses": {
            "200": {
                "description": "The completion (JSON), or server-sent events when stream is true.",
                "headers": {
                    k: {"description": v, "schema": {"type": "string"}}
                    for k, v in _REPLY_HEADERS.items()
                },
                "content": {
                    "application/json": {"schema": {"type": "object"}},
                    "text/event-stream": {"schema": {"type": "string"}},
                },
            },
            **{code: _error(text) for code, text in _ERRORS.items()},
        },
    }


def _error(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorEnvelope"}}},
    }


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
                    "responses": {"200": {"description": "Usage"}, "401": _error("No or bad key.")},
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
            "/metrics": {
                "get": {
                    "summary": "Prometheus metrics",
                    "responses": {"200": {"description": "Metrics"}},
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
