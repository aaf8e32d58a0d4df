"""A pool's performance envelope: what the performance model predicts for one replica.

Shared by the operator (it writes the envelope into the InferencePool's status) and the router
(it prices and predicts with the same numbers), so both always agree. Both hand in the shared
catalog; the spec's inline profiles are layered onto a copy of it here (`build_deployment`),
and the envelope says which profiles were inline and whether they shadowed catalog entries.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from tiergate.sim_nodes.catalogs import DTYPE_BYTES, Catalog
from tiergate.sim_nodes.perf import (
    Deployment,
    PerfConfigError,
    PerfResult,
    ProfileSource,
    ServingSpec,
    Workload,
    build_deployment,
    context_problem,
    evaluate,
    layered_catalog,
    max_running,
    profile_sources,
    unfit,
)

from .inference_pool import Envelope, ReferenceWorkload

__all__ = ["PoolPerformance", "predict"]


class Layout(NamedTuple):
    """Chips and tensor-parallel group of one replica, as the performance model resolved them
    (`chips: auto` included). Pods get these numbers, not the spec's: the envelope in the
    status must describe what the pods run, and a node sizing `auto` on its own can land on
    a different count (it does not know the pool's reference workload)."""

    chips: int
    tensor_parallel: int


@dataclass(frozen=True, slots=True)
class PoolPerformance:
    """One replica as the spec lays it out, and the model's prediction for it."""

    deployment: Deployment
    result: PerfResult  # `result.fits` False: the model or its KV cache does not fit
    model_source: ProfileSource  # catalog, inline, or inline-shadows-catalog
    accelerator_source: ProfileSource

    def layout(self) -> Layout:
        return Layout(self.deployment.chips, self.deployment.tensor_parallel)

    def envelope(self) -> Envelope:
        r = self.result
        return Envelope(
            max_concurrency=r.max_concurrency,
            tokens_per_second_per_stream=round(r.output_tokens_per_s_per_stream, 2),
            throughput_tokens_per_second=round(r.throughput_output_tokens_per_s, 1),
            ttft_seconds=round(r.ttft_s, 4),
            cost_per_million_output_tokens_usd=round(r.cost_per_million_output_tokens_usd, 4),
            chips=r.chips,
            model_source=self.model_source,
            accelerator_source=self.accelerator_source,
        )


def predict(spec: ServingSpec, workload: ReferenceWorkload, catalog: Catalog) -> PoolPerformance:
    """The envelope: `spec`'s batch as full as its cap and KV cache allow, under `workload`.

    `catalog` is the shared one; the spec's inline profiles join a copy of it. A replica on
    GPUs must also hold one sequence of its whole context (spec.maxContextTokens, else the
    model's, `Deployment.holds_its_context`): `chips: auto` counts it, and a layout short of it does
    not fit. Raises CatalogError (unknown names) and PerfConfigError (impossible layouts, a
    context longer than the model's, a reference workload longer than the context).
    """
    w = workload
    shape = Workload(w.input_tokens, w.output_tokens, w.cached_input_tokens, None)
    kv_tokens = spec.batching.max_num_seqs * shape.tokens_per_sequence
    layered = layered_catalog(spec, catalog)
    context = layered.model(spec.model).max_context_tokens
    problem = context_problem(spec, catalog)
    if problem is not None:
        raise PerfConfigError(problem)
    if shape.tokens_per_sequence > context:
        raise PerfConfigError(_longer_than_served(shape, context, catalog, spec))
    try:
        deployment = build_deployment(spec, catalog, kv_tokens=kv_tokens)
        batching = spec.batching.to_batching()
        running = max(max_running(deployment, shape, batching), 1)
        full = Workload(shape.input_tokens, shape.output_tokens, shape.cached_input_tokens, running)
        result = evaluate(deployment, full, batching)
    except ArithmeticError as exc:  # overflow, a division by zero: absurd inline profiles
        raise PerfConfigError(_beyond_the_model(f"{type(exc).__name__}: {exc}")) from None
    if result.fits and not deployment.holds_its_context:
        reason = _short_of(deployment, spec)
        result = unfit(deployment, full, reason, result.concurrency, result.max_concurrency)
    if result.fits and not all(
        math.isfinite(x) and x >= 0
        for x in (result.ttft_s, result.tpot_s, result.cost_per_million_output_tokens_usd)
    ):
        raise PerfConfigError(_beyond_the_model("a figure came out infinite or undefined"))
    return PoolPerformance(deployment, result, *profile_sources(spec, catalog))


def _short_of(d: Deployment, spec: ServingSpec) -> str:
    """Why a GPU replica whose KV cache holds less than one sequence of its context does not
    fit: vLLM checks it when it starts, and no engine could serve a request that long."""
    remedies = ["more chips"]
    if DTYPE_BYTES[spec.weight_dtype] > DTYPE_BYTES["fp8"]:
        remedies.append("weightDtype fp8")
    if DTYPE_BYTES[spec.kv_dtype] > DTYPE_BYTES["fp8"]:
        remedies.append("kvDtype fp8")
    remedies.append("a shorter spec.maxContextTokens")
    return (
        f"its KV cache holds {d.kv_capacity_tokens:,} tokens, less than one sequence of the "
        f"{d.model.max_context_tokens:,}-token context it serves (vLLM refuses to start so, "
        f"and no engine could serve a request that long): use {', '.join(remedies[:-1])} or "
        f"{remedies[-1]}"
    )


def _longer_than_served(shape: Workload, context: int, catalog: Catalog, spec: ServingSpec) -> str:
    """Why a reference workload longer than the pool's context cannot be predicted."""
    words = f"the {context}-token context of {spec.model}"
    if spec.max_context_tokens is not None:
        model = catalog.with_profiles(model=spec.model_profile).models.get(spec.model)
        own = f"; the model's is {model.max_context_tokens}" if model is not None else ""
        words = f"the {context}-token context the pool serves (spec.maxContextTokens{own})"
    return (
        f"the reference workload's input + output tokens ({shape.tokens_per_sequence}) exceed "
        f"{words}: shorten spec.workload"
        + (" or lengthen spec.maxContextTokens" if spec.max_context_tokens is not None else "")
    )


def _beyond_the_model(detail: str) -> str:
    return (
        "the model or accelerator profile is outside what the performance model can compute "
        f"({detail}): check its sizes"
    )
