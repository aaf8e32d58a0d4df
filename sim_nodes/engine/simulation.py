"""Discrete-event simulation of N replicas in virtual time.

Each replica's `Engine` runs on its own timeline: a step that starts at t ends at
t + step time, and the next starts right then while there is work. One heap holds every
replica's next step boundary; arrivals are merged in time order (an arrival at exactly a
boundary joins the step starting there). Requests go to the replica with the fewest
outstanding requests, as a least-loaded router would send them.

Every request loads the replicas, but the report can measure only those arriving within a
window (`measured_s`): a run starts from idle replicas and its arrivals stop, so the first
and last arrivals see a lighter load than the steady state.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from ..perf import Batching, Deployment
from .engine import Engine, StepSummary
from .errors import EngineError
from .kv_blocks import DEFAULT_BLOCK_SIZE
from .request import EngineRequest
from .workload import WorkloadRequest

__all__ = ["SimulationReport", "percentile", "simulate"]


class SimulationReport(BaseModel):
    """What `tiergate simulate --json` prints: one object, seconds and USD in the names."""

    model_config = ConfigDict(frozen=True)

    model: str
    accelerator: str
    chips: int
    tensor_parallel: int
    replicas: int
    max_num_seqs: int | None
    max_batched_tokens: int
    chunked_prefill: bool
    kv_capacity_tokens: int
    requests: int
    completed: int
    rejected: int = Field(description="Requests that can never fit the replica (too long).")
    first_rejection: str | None = Field(description="Why the first rejected request was.")
    duration_s: float = Field(description="First arrival to last completion.")
    ttft_p50_s: float
    ttft_p90_s: float
    ttft_p99_s: float
    tpot_p50_s: float
    tpot_p90_s: float
    tpot_p99_s: float
    e2e_p50_s: float
    e2e_p99_s: float
    output_tokens: int
    output_tokens_per_s: float
    requests_per_s: float
    goodput_requests_per_s: float = Field(
        description="Completed requests per second that met the TTFT and TPOT SLOs (if set)."
    )
    slo_ttft_s: float | None
    slo_tpot_s: float | None
    cost_per_hour_usd: float = Field(description="All replicas.")
    cost_per_million_output_tokens_usd: float
    preemptions: int
    steps: int


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of ascending values, linearly interpolated; 0 if empty."""
    if not sorted_values:
        return 0.0
    position = (len(sorted_values) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    frac = position - low
    return sorted_values[low] * (1.0 - frac) + sorted_values[high] * frac


def simulate(
    deployment: Deployment,
    batching: Batching,
    workload: Sequence[WorkloadRequest],
    *,
    replicas: int = 1,
    slo_ttft_s: float | None = None,
    slo_tpot_s: float | None = None,
    seed: int = 0,
    block_size: int = DEFAULT_BLOCK_SIZE,
    measured_s: tuple[float, float] | None = None,
) -> SimulationReport:
    """Run `workload` (sorted by arrival) through `replicas` replicas; deterministic for a
    given seed. The report's requests, latencies and rates are those of the requests arriving
    within `measured_s` (inclusive; None: all). Raises EngineCapacityError if the deployment
    cannot run at all."""
    if replicas < 1:
        raise EngineError(f"replicas must be at least 1 (got {replicas})")
    workload = sorted(workload, key=lambda request: request.arrival_s)
    engines = [
        Engine(deployment, batching, block_size=block_size, seed=seed + i) for i in range(replicas)
    ]
    n = len(workload)
    arrival = [0.0] * n
    first_token = [math.nan] * n
    finish = [math.nan] * n
    outstanding = [0] * replicas
    pending: list[StepSummary | None] = [None] * replicas
    busy = [False] * replicas
    boundaries: list[tuple[float, int]] = []  # (time, replica): release + start next step
    rejected = 0
    first_rejection: str | None = None
    index = 0
    while True:
        next_arrival = workload[index].arrival_s if index < n else math.inf
        if boundaries and boundaries[0][0] < next_arrival:
            now, r = heapq.heappop(boundaries)
            done = pending[r]
            if done is not None:
                for rid in done.first_token:
                    first_token[int(rid)] = now
                for rid in done.finished:
                    finish[int(rid)] = now
                outstanding[r] -= len(done.finished)
            summary = engines[r].advance(now)
            pending[r] = summary
            if summary is None:
                busy[r] = False
            else:
                heapq.heappush(boundaries, (summary.end_s, r))
            continue
        if index >= n:
            break
        request = workload[index]
        arrival[index] = request.arrival_s
        r = min(range(replicas), key=outstanding.__getitem__)
        try:
            engines[r].add(
                EngineRequest(
                    str(index),
                    request.prompt_tokens,
                    request.output_tokens,
                    0,
                    request.arrival_s,
                    request.cached_prompt_tokens,
                )
            )
        except EngineError as exc:
            rejected += 1
            first_rejection = first_rejection or str(exc)
        else:
            outstanding[r] += 1
            if not busy[r]:
                busy[r] = True
                pending[r] = None
                heapq.heappush(boundaries, (request.arrival_s, r))
        index += 1
    return _report(
        deployment,
        batching,
        workload,
        engines,
        arrival,
        first_token,
        finish,
        rejected=rejected,
        first_rejection=first_rejection,
        slo_ttft_s=slo_ttft_s,
        slo_tpot_s=slo_tpot_s,
        measured_s=measured_s,
    )


def _report(
    deployment: Deployment,
    batching: Batching,
    workload: Sequence[WorkloadRequest],
    engines: Sequence[Engine],
    arrival: Sequence[float],
    first_token: Sequence[float],
    finish: Sequence[float],
    *,
    rejected: int,
    first_rejection: str | None,
    slo_ttft_s: float | None,
    slo_tpot_s: float | None,
    measured_s: tuple[float, float] | None,
) -> SimulationReport:
    low, high = measured_s if measured_s is not None else (-math.inf, math.inf)
    measured = [i for i in range(len(workload)) if low <= workload[i].arrival_s <= high]
    ttfts: list[float] = []
    tpots: list[float] = []
    e2es: list[float] = []
    good = 0
    output_tokens = 0
    start = min((workload[i].arrival_s for i in measured), default=0.0)
    end = start
    for i in measured:
        request = workload[i]
        if math.isnan(finish[i]):
            continue
        ttft = first_token[i] - arrival[i]
        out = request.output_tokens
        tpot = (finish[i] - first_token[i]) / (out - 1) if out > 1 else None
        ttfts.append(ttft)
        if tpot is not None:
            tpots.append(tpot)
        e2es.append(finish[i] - arrival[i])
        output_tokens += out
        end = max(end, finish[i])
        meets_ttft = slo_ttft_s is None or ttft <= slo_ttft_s
        meets_tpot = slo_tpot_s is None or tpot is None or tpot <= slo_tpot_s
        good += meets_ttft and meets_tpot
    for values in (ttfts, tpots, e2es):
        values.sort()
    duration = end - start
    per_s = 1.0 / duration if duration > 0 else 0.0
    replicas = len(engines)
    cost_per_hour = deployment.cost_per_hour_usd * replicas
    cost_per_million = (
        cost_per_hour * duration / 3600.0 / output_tokens * 1e6 if output_tokens else 0.0
    )
    return SimulationReport(
        model=deployment.model.name,
        accelerator=deployment.accelerator.name,
        chips=deployment.chips,
        tensor_parallel=deployment.tensor_parallel,
        replicas=replicas,
        max_num_seqs=batching.max_num_seqs,
        max_batched_tokens=batching.max_batched_tokens,
        chunked_prefill=batching.chunked_prefill,
        kv_capacity_tokens=engines[0].kv_capacity_tokens,
        requests=len(measured),
        completed=len(e2es),
        rejected=rejected,
        first_rejection=first_rejection,
        duration_s=duration,
        ttft_p50_s=percentile(ttfts, 50),
        ttft_p90_s=percentile(ttfts, 90),
        ttft_p99_s=percentile(ttfts, 99),
        tpot_p50_s=percentile(tpots, 50),
        tpot_p90_s=percentile(tpots, 90),
        tpot_p99_s=percentile(tpots, 99),
        e2e_p50_s=percentile(e2es, 50),
        e2e_p99_s=percentile(e2es, 99),
        output_tokens=output_tokens,
        output_tokens_per_s=output_tokens * per_s,
        requests_per_s=len(e2es) * per_s,
        goodput_requests_per_s=good * per_s,
        slo_ttft_s=slo_ttft_s,
        slo_tpot_s=slo_tpot_s,
        cost_per_hour_usd=cost_per_hour,
        cost_per_million_output_tokens_usd=cost_per_million,
        preemptions=sum(e.num_preemptions for e in engines),
        steps=sum(e.steps for e in engines),
    )
