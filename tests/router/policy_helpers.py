"""Helpers of the routing-policy tests (a uniquely named module: conftest names clash)."""

from __future__ import annotations

from typing import Any

from tiergate.router.base.tiers import Tier
from tiergate.router.endpoints.state import EndpointState, RequestContext

MODEL = "llama-3.1-8b"


def endpoint(url: str = "http://e0", **fields: Any) -> EndpointState:
    """An endpoint of pool `p0` (batched, serving MODEL) unless `fields` say otherwise."""
    values: dict[str, Any] = {
        "pool": "p0",
        "tier": "batched",
        "model": MODEL,
        "served_names": (MODEL,),
    }
    values.update(fields)
    return EndpointState(url=url, **values)


def endpoints(n: int, **fields: Any) -> list[EndpointState]:
    return [endpoint(f"http://e{i}", **fields) for i in range(n)]


def request(
    model: str = MODEL,
    tier: Tier = "batched",
    prompt_tokens: int = 1000,
    max_output_tokens: int = 200,
    prefix_hashes: tuple[int, ...] = (),
    slo_ttft_s: float | None = None,
    slo_tpot_s: float | None = None,
) -> RequestContext:
    return RequestContext(
        model=model,
        tier=tier,
        prompt_tokens=prompt_tokens,
        max_output_tokens=max_output_tokens,
        prefix_hashes=prefix_hashes,
        slo_ttft_s=slo_ttft_s,
        slo_tpot_s=slo_tpot_s,
    )
