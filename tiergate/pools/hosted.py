"""Hosted pools: a tier served by someone else's OpenAI-compatible API (`spec.endpoint`).

Such a pool has no pods and no hardware: the operator renders nothing for it, the router sends
its requests to the provider's URL with the provider's key, and bills at the pool's stated
price (`spec.billing`), since no performance model applies to another's hardware. The fields
that describe pods or hardware are refused beside `spec.endpoint`, and each rule has one
sentence, the same from a pool file and from `kubectl apply` (operator/crd.py `hosted_rules`).
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from tiergate.sim_nodes.catalogs import Catalog

from .base import Api

__all__ = [
    "DEFAULT_MAX_CONCURRENT_REQUESTS",
    "HOSTED_URL_PATTERN",
    "HOSTED_URL_PROBLEM",
    "POD_FIELDS",
    "SPEC",
    "Billing",
    "HostedEndpoint",
    "SecretKeyRef",
    "hosted_url_problem",
    "needs_accelerator_problem",
    "needs_billing_problem",
    "needs_context_problem",
    "needs_secret_problem",
    "pod_field_problem",
]

#: A hosted pool's concurrent requests when `maxConcurrentRequests` is not set.
DEFAULT_MAX_CONCURRENT_REQUESTS = 64

#: The spec's fields (camelCase) that describe pods or hardware: refused beside spec.endpoint.
POD_FIELDS = (
    "accelerator",
    "acceleratorProfile",
    "modelProfile",
    "chips",
    "tensorParallel",
    "weightDtype",
    "kvDtype",
    "batching",
    "speculativeDecoding",
    "pricing",
    "background",
    "maxContextTokens",
    "engine",
    "modelSource",
    "huggingFaceTokenSecretRef",
    "template",
    "rollout",
    "autoscaling",
    "slo",
    "workload",
)


class SecretKeyRef(Api):
    """One key of a Secret in the pool's namespace."""

    name: str = Field(min_length=1, description="The Secret's name.")
    key: str = Field(min_length=1, description="The key in the Secret.")


class Billing(Api):
    """What the router charges tenants per token the pool serves."""

    output_per_million_usd: float | None = Field(
        default=None,
        ge=0,
        allow_inf_nan=False,
        description="USD per million output tokens; none: the envelope's predicted cost "
        "(a hosted pool must state it).",
    )
    input_per_million_usd: float = Field(
        default=0.0, ge=0, allow_inf_nan=False, description="USD per million prompt tokens."
    )


class HostedEndpoint(Api):
    """An OpenAI-compatible API that serves the pool (OpenAI, a vendor's, another gateway)."""

    url: str = Field(
        description="The API's base URL, as OpenAI's SDKs take it (requests go to "
        "URL/chat/completions and URL/completions), e.g. https://api.openai.com/v1."
    )
    model: str = Field(
        min_length=1,
        description="The provider's name for the model; clients ask for the pool's names "
        "(spec.model, spec.servedModelName, spec.aliases) and replies say the name they asked.",
    )
    api_key_secret_ref: SecretKeyRef | None = Field(
        default=None,
        description="The Secret key holding the provider's API key (sent as a Bearer token; "
        "the router must be allowed to read that Secret).",
    )
    max_context_tokens: int | None = Field(
        default=None,
        ge=1,
        description="The model's context length, which caps what a request may cost "
        "(default: the catalog model's, when spec.model names one).",
    )
    timeout_s: float = Field(
        default=60.0,
        gt=0,
        le=3600,
        description="Seconds the router waits for a streamed reply's first part, and between "
        "two parts; past it the provider counts a failure and a stream not begun goes to "
        "another endpoint of the tier. A whole (not streamed) reply, which the provider sends "
        "once generated, is awaited up to the router's wholeReplyTimeoutS (600 s) and never "
        "sent again elsewhere.",
    )
    output_cap_field: Literal["max_completion_tokens", "max_tokens"] = Field(
        default="max_completion_tokens",
        description="The field a chat request's output cap goes to the provider in, alone: "
        "max_completion_tokens (OpenAI's, the only one its reasoning models take) or "
        "max_tokens (for a provider that reads only that one). Whichever the client wrote.",
    )
    max_concurrent_requests: int = Field(
        default=DEFAULT_MAX_CONCURRENT_REQUESTS,
        ge=1,
        description="Requests the router has open to the provider at once; while that many "
        "are open the tier's other pools serve its requests, and with none more wait in the "
        "tier's queue (each router process counts its own).",
    )

    @field_validator("url")
    @classmethod
    def _without_trailing_slash(cls, url: str) -> str:
        # Checked by the spec (`hosted_url_problem`), where the message names the field whole.
        return url.rstrip("/")


#: Where the pool's fields are: an InferencePool's under `spec.`; a router file's pool holds
#: them itself (the problems below name the fields as the reader wrote them: `prefix`).
SPEC = "spec."

#: The CEL rule's pattern and the pydantic check of spec.endpoint.url, and what both say.
HOSTED_URL_PATTERN = r"^https?://[^/@?#\s]+(/[^?#\s]*)?$"
_URL_PROBLEM = (
    "{prefix}endpoint.url must be an http(s) base URL with a host, and no credentials, query or "
    "fragment (e.g. https://api.openai.com/v1)"
)
HOSTED_URL_PROBLEM = _URL_PROBLEM.format(prefix=SPEC)


def hosted_url_problem(url: str, prefix: str = SPEC) -> str | None:
    """What is wrong with a hosted API's base URL, or None."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - ValueError when out of range or not a number
    except ValueError:
        parts = None
    if (
        parts is None
        or parts.scheme not in ("http", "https")
        or not parts.hostname
        or parts.username is not None
        or parts.query
        or parts.fragment
        or any(c.isspace() for c in url)
    ):
        return _URL_PROBLEM.format(prefix=prefix)
    return None


def needs_billing_problem(prefix: str = SPEC) -> str:
    return (
        f"a hosted pool ({prefix}endpoint) needs {prefix}billing.outputPerMillionUsd: no "
        "performance model prices someone else's hardware, so the pool states its price"
    )


def needs_secret_problem() -> str:
    return "spec.endpoint.apiKeySecretRef is required: the Secret key holding the provider's key"


def needs_accelerator_problem(prefix: str = SPEC) -> str:
    return (
        f"{prefix}accelerator is required (the hardware the pool runs on), unless "
        f"{prefix}endpoint names a hosted API"
    )


def pod_field_problem(field: str, prefix: str = SPEC) -> str:
    instead = ""
    if field == "maxContextTokens":
        instead = f" (the provider's context is {prefix}endpoint.maxContextTokens)"
    return (
        f"{prefix}{field} describes the pool's pods or hardware; a hosted pool "
        f"({prefix}endpoint) has neither: remove it{instead}"
    )


def needs_context_problem(catalog: Catalog, prefix: str = SPEC) -> str:
    return (
        f"a hosted pool whose {prefix}model is not a catalog model "
        f"({', '.join(sorted(catalog.models))}) needs {prefix}endpoint.maxContextTokens"
    )
