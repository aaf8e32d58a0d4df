"""What one replica of a pool can carry, for the request shape its pods report.

The performance model lays the replica out as the pods run it (`predict`, the envelope's
layout) and finds the most concurrent requests at which it meets `spec.slo`
(`slo_capacity`); without an SLO, as many as its batch cap and KV cache hold. The pool's
`spec.background` is what every pod runs beside the requests: its sequences take batch slots
and KV cache and slow every step, so they come off the capacity. A pool the model cannot size
(the model does not fit, the background leaves no room, the SLO is missed even at batch 1)
gets a problem with the numbers instead: the autoscaler then leaves its replicas alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tiergate.pools import InferencePoolSpec, predict
from tiergate.sim_nodes.catalogs import Catalog, CatalogError
from tiergate.sim_nodes.perf import PerfConfigError, Resident, Workload, slo_capacity

__all__ = ["Capacity", "RequestShape", "replica_capacity"]

ShapeSource = Literal["observed", "spec"]


@dataclass(frozen=True, slots=True)
class RequestShape:
    """Mean tokens per request the capacity is computed for, and where they came from."""

    input_tokens: int
    output_tokens: int
    source: ShapeSource = "spec"


@dataclass(frozen=True, slots=True)
class Capacity:
    """Concurrent requests one replica carries at the SLO (None: see `problem`)."""

    shape: RequestShape
    concurrency: int | None
    #: (reason, message) why the pool cannot be sized: InvalidSpec, ModelDoesNotFit,
    #: SloUnreachable.
    problem: tuple[str, str] | None = None


def replica_capacity(
    spec: InferencePoolSpec, catalog: Catalog, shape: RequestShape | None = None
) -> Capacity:
    """One replica of `spec` under `shape` (None: the spec's reference workload). The
    prefix-cached share of the prompt is the reference workload's: the metrics do not say."""
    w = spec.workload
    if shape is None:
        shape = RequestShape(w.input_tokens, w.output_tokens, "spec")
    cached_share = w.cached_input_tokens / w.input_tokens
    cached = min(round(shape.input_tokens * cached_share), shape.input_tokens - 1)
    try:
        # The layout the pods run (chips: auto is sized by the spec's workload, as the
        # operator rendered them), under the observed shape.
        performance = predict(spec, w, catalog)
        workload = Workload(shape.input_tokens, shape.output_tokens, cached, None)
        ttft_s, tpot_s = _targets_s(spec)
        found = slo_capacity(
            performance.deployment,
            workload,
            spec.batching.to_batching(),
            ttft_s,
            tpot_s,
            _resident(spec),
        )
    except (CatalogError, PerfConfigError) as exc:
        return Capacity(shape, None, ("InvalidSpec", str(exc)))
    alone = found.alone
    if not alone.fits:
        return Capacity(shape, None, ("ModelDoesNotFit", f"does not fit: {alone.reason}"))
    bg = spec.background
    if found.room < 1 and bg is not None:  # without one, no room means nothing fits
        message = (
            f"the background ({bg.sequences} sequences of {bg.context_tokens} tokens) leaves "
            f"no batch slot or KV cache for a request of {shape.input_tokens} prompt and "
            f"{shape.output_tokens} output tokens: more replicas cannot help; shrink "
            "spec.background or raise batching.maxNumSeqs"
        )
        return Capacity(shape, None, ("ModelDoesNotFit", message))
    if found.concurrency == 0:
        misses = []
        if ttft_s is not None and alone.ttft_s > ttft_s:
            misses.append(f"TTFT {alone.ttft_s * 1e3:.1f} ms > target {ttft_s * 1e3:g} ms")
        if tpot_s is not None and alone.tpot_s > tpot_s:
            misses.append(f"TPOT {alone.tpot_s * 1e3:.2f} ms > target {tpot_s * 1e3:g} ms")
        beside = " beside the background" if spec.background else ""
        message = (
            f"the SLO is missed even at batch 1{beside} for requests of "
            f"{shape.input_tokens} prompt and {shape.output_tokens} output tokens "
            f"({', '.join(misses)}): more replicas cannot help; relax spec.slo or change the "
            "hardware"
        )
        return Capacity(shape, None, ("SloUnreachable", message))
    return Capacity(shape, found.concurrency)


def _resident(spec: InferencePoolSpec) -> Resident | None:
    bg = spec.background
    return Resident(bg.sequences, bg.context_tokens) if bg is not None else None


def _targets_s(spec: InferencePoolSpec) -> tuple[float | None, float | None]:
    slo = spec.slo
    if slo is None:
        return None, None
    ttft = slo.ttft_ms / 1e3 if slo.ttft_ms is not None else None
    tpot = slo.tpot_ms / 1e3 if slo.tpot_ms is not None else None
    return ttft, tpot
