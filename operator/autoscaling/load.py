"""The load a pool's pods report: their `/metrics` text in, the observed load and the mean
request shape out. Pure (the scrape itself is the handler's).

`vllm:num_requests_running` counts the simulated other tenants too (the engine's running
batch holds them), so `tiergate_background_sequences` is subtracted: the autoscaler sizes for
the requests the pool is asked to serve; the background is part of what each replica is, not
of the demand. The shape comes from the cumulative token counters, so it needs no previous
sample; it is trusted only past `MIN_FINISHED_FOR_SHAPE` finished requests. A pod that
reports NaN or an infinity in one of these is refused whole, like one whose text is garbled:
the tick leaves it out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from .capacity import RequestShape
from .decide import ObservedLoad

__all__ = [
    "MIN_FINISHED_FOR_SHAPE",
    "MetricsError",
    "PodMetrics",
    "observed_load",
    "observed_shape",
    "parse_pod_metrics",
]

#: Finished requests (all pods) before their mean shape replaces spec.workload's.
MIN_FINISHED_FOR_SHAPE = 20

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
BACKGROUND = "tiergate_background_sequences"
# Counters by their family names (as the sim node defines them); their samples carry `_total`.
PROMPT_TOKENS = "vllm:prompt_tokens"
GENERATION_TOKENS = "vllm:generation_tokens"
FINISHED = "vllm:request_success"
#: The samples read (counters by their sample names): each must sum to a finite number.
_READ = frozenset(
    {
        RUNNING,
        WAITING,
        BACKGROUND,
        *(f"{c}_total" for c in (PROMPT_TOKENS, GENERATION_TOKENS, FINISHED)),
    }
)


class MetricsError(ValueError):
    """A pod's metrics text that cannot be read as a sim node's (garbled, a gauge the
    autoscaler needs missing, or a value it reads not finite)."""


@dataclass(frozen=True, slots=True)
class PodMetrics:
    """One pod's report: requests running (background excluded) and waiting now, and the
    cumulative counters of its finished requests."""

    running: int
    waiting: int
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    finished: float = 0.0


def parse_pod_metrics(text: str) -> PodMetrics:
    """One pod's `/metrics` (Prometheus text) read; samples of every model name summed.
    Raises MetricsError when it is not a sim node's, or a sample it reads is not finite."""
    sums: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
    except ValueError as exc:  # the parser's word for text it cannot read
        raise MetricsError(f"unreadable metrics: {exc}") from None
    # Summed first: finite samples may still add up to infinity.
    for name in sorted(_READ & sums.keys()):
        if not math.isfinite(sums[name]):
            raise MetricsError(f"{name} is {sums[name]}: not a count")
    missing = [name for name in (RUNNING, WAITING) if name not in sums]
    if missing:
        raise MetricsError(f"not a sim node's metrics: no {', '.join(missing)}")
    running = round(sums[RUNNING] - sums.get(BACKGROUND, 0.0))
    return PodMetrics(
        running=max(running, 0),
        waiting=max(round(sums[WAITING]), 0),
        prompt_tokens=sums.get(f"{PROMPT_TOKENS}_total", 0.0),
        generation_tokens=sums.get(f"{GENERATION_TOKENS}_total", 0.0),
        finished=sums.get(f"{FINISHED}_total", 0.0),
    )


def observed_load(pods: Iterable[PodMetrics], *, unread: int = 0) -> ObservedLoad:
    """Running and waiting summed over the pods that reported; `unread` ready pods did not."""
    reports = list(pods)
    return ObservedLoad(
        pods=len(reports),
        running=sum(p.running for p in reports),
        waiting=sum(p.waiting for p in reports),
        unread=unread,
    )


def observed_shape(
    pods: Iterable[PodMetrics], minimum_finished: int = MIN_FINISHED_FOR_SHAPE
) -> RequestShape | None:
    """Mean prompt and output tokens per finished request over the pods; None below
    `minimum_finished` requests (the caller then sizes for spec.workload)."""
    reports = list(pods)
    finished = sum(p.finished for p in reports)
    if finished < max(minimum_finished, 1):
        return None
    prompt = sum(p.prompt_tokens for p in reports) / finished
    output = sum(p.generation_tokens for p in reports) / finished
    return RequestShape(max(round(prompt), 1), max(round(output), 1), "observed")
