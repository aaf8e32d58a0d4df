"""What each engine calls the figures tiergate reads from its `/metrics`, defined once: the
router's scraper picks endpoints by them (requests running and waiting, KV-cache use) and the
operator's autoscaler sizes pools by them (running and waiting, and the counters of finished
requests that give their mean shape).

The sim node names its figures as vLLM does. Names are the samples' (counters with `_total`).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LLAMACPP", "METRIC_NAMES", "SGLANG", "VLLM", "EngineMetricNames"]


@dataclass(frozen=True, slots=True)
class EngineMetricNames:
    """One engine's names for the figures read."""

    #: Whose names these are, for messages.
    engine: str
    #: Gauges: requests in the running batch, requests waiting for it.
    running: str
    waiting: str
    #: The KV cache's use (0 to 1), the first name present: an engine may have renamed it.
    kv_usage: tuple[str, ...]
    #: Counters of finished requests' prompt and output tokens, and of the requests (None: the
    #: engine exports none).
    prompt_tokens: str | None = None
    generation_tokens: str | None = None
    finished: str | None = None


VLLM = EngineMetricNames(
    engine="vLLM",
    running="vllm:num_requests_running",
    waiting="vllm:num_requests_waiting",
    # `gpu_cache_usage_perc` before v0.10.
    kv_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    prompt_tokens="vllm:prompt_tokens_total",
    generation_tokens="vllm:generation_tokens_total",
    finished="vllm:request_success_total",
)
#: SGLang with `--enable-metrics` (sglang/srt/metrics/collector.py): its scheduler's gauges,
#: its tokenizer's counters; `num_requests_total` counts requests as they finish.
SGLANG = EngineMetricNames(
    engine="SGLang",
    running="sglang:num_running_reqs",
    waiting="sglang:num_queue_reqs",
    kv_usage=("sglang:token_usage",),
    prompt_tokens="sglang:prompt_tokens_total",
    generation_tokens="sglang:generation_tokens_total",
    finished="sglang:num_requests_total",
)
#: llama.cpp's server with `--metrics` (`kv_cache_usage_ratio` only in releases that still
#: export it).
LLAMACPP = EngineMetricNames(
    engine="llama.cpp",
    running="llamacpp:requests_processing",
    waiting="llamacpp:requests_deferred",
    kv_usage=("llamacpp:kv_cache_usage_ratio",),
)
#: In the order they are tried: a text is read with the first engine's names it holds.
METRIC_NAMES = (VLLM, SGLANG, LLAMACPP)
