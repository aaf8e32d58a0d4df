"""The load a pool's pods report: their `/metrics` text in, the observed load and the mean
request shape out. Pure (the scrape itself is the handler's).

Sim nodes and vLLM name their figures `vllm:*`, SGLang (`--enable-metrics`, which the
operator passes) `sglang:*` (tiergate/pools/engine_metrics.py); a pod's text is read with the
first engine's names it holds.

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

from tiergate.pools.engine_metrics import METRIC_NAMES, VLLM

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

BACKGROUND = "tiergate_background_sequences"


class MetricsError(ValueError):
    """A pod's metrics text that cannot be read as an engine's (garbled, a gauge the
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
    Raises MetricsError when it holds no engine's two gauges, or a sample it reads is not
    finite."""
    sums: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
    except ValueError as exc:  # the parser's word for text it cannot read
        raise MetricsError(f"unreadable metrics: {exc}") from None
    names = next((e for e in METRIC_NAMES if e.running in sums and e.waiting in sums), None)
    if names is None:
        missing = [n for n in (VLLM.running, VLLM.waiting) if n not in sums]
        others = "; ".join(f"{e.engine}'s {e.running} and {e.waiting}" for e in METRIC_NAMES[1:])
        raise MetricsError(f"not an engine's metrics: no {', '.join(missing)} (nor {others})")
    counters = (names.prompt_tokens, names.generation_tokens, names.finished)
    # Summed first: finite samples may still add up to infinity.
    for name in (names.running, names.waiting, BACKGROUND, *counters):
        if name is not None and name in sums and not math.isfinite(sums[name]):
            raise MetricsError(f"{name} is {sums[name]}: not a count")
    running = round(sums[names.running] - sums.get(BACKGROUND, 0.0))
    prompt, generation, finished = (sums.get(name, 0.0) if name else 0.0 for name in counters)
    return PodMetrics(
        running=max(running, 0),
        waiting=max(round(sums[names.waiting]), 0),
        prompt_tokens=prompt,
        generation_tokens=generation,
        finished=finished,
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
