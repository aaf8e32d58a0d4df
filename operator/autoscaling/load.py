"""The load a pool's pods report: their `/metrics` text in, the observed load and the mean
request shape out. Pure (the scrape itself is the handler's).

Sim nodes and vLLM name their figures `vllm:*`, SGLang (`--enable-metrics`, which the
operator passes) `sglang:*`; a pod's text is read with the first engine's names it holds.

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
    "ENGINES",
    "MIN_FINISHED_FOR_SHAPE",
    "SGLANG",
    "VLLM",
    "EngineMetricNames",
    "MetricsError",
    "PodMetrics",
    "observed_load",
    "observed_shape",
    "parse_pod_metrics",
]

#: Finished requests (all pods) before their mean shape replaces spec.workload's.
MIN_FINISHED_FOR_SHAPE = 20

BACKGROUND = "tiergate_background_sequences"


@dataclass(frozen=True, slots=True)
class EngineMetricNames:
    """An engine's names for what the autoscaler reads: two gauges and three counters (by
    their sample names, `_total` included)."""

    running: str
    waiting: str
    prompt_tokens: str
    generation_tokens: str
    finished: str


VLLM = EngineMetricNames(
    running="vllm:num_requests_running",
    waiting="vllm:num_requests_waiting",
    prompt_tokens="vllm:prompt_tokens_total",
    generation_tokens="vllm:generation_tokens_total",
    finished="vllm:request_success_total",
)
#: SGLang's scheduler gauges and its tokenizer's counters (sglang/srt/metrics/collector.py);
#: `num_requests_total` counts requests as they finish, as vLLM's `request_success` does.
SGLANG = EngineMetricNames(
    running="sglang:num_running_reqs",
    waiting="sglang:num_queue_reqs",
    prompt_tokens="sglang:prompt_tokens_total",
    generation_tokens="sglang:generation_tokens_total",
    finished="sglang:num_requests_total",
)
#: In the order a pod's text is tried: the first whose two gauges it holds is read.
ENGINES = (VLLM, SGLANG)


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
    Raises MetricsError when it is not a sim node's, vLLM's or SGLang's, or a sample it reads
    is not finite."""
    sums: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
    except ValueError as exc:  # the parser's word for text it cannot read
        raise MetricsError(f"unreadable metrics: {exc}") from None
    names = next((e for e in ENGINES if e.running in sums and e.waiting in sums), None)
    if names is None:
        missing = [n for n in (VLLM.running, VLLM.waiting) if n not in sums]
        raise MetricsError(
            f"not a sim node's, vLLM's or SGLang's metrics: no {', '.join(missing)}"
            f" (nor {SGLANG.running} and {SGLANG.waiting})"
        )
    counters = (names.prompt_tokens, names.generation_tokens, names.finished)
    # Summed first: finite samples may still add up to infinity.
    for name in (names.running, names.waiting, BACKGROUND, *counters):
        if name in sums and not math.isfinite(sums[name]):
            raise MetricsError(f"{name} is {sums[name]}: not a count")
    running = round(sums[names.running] - sums.get(BACKGROUND, 0.0))
    prompt, generation, finished = (sums.get(name, 0.0) for name in counters)
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
