"""Prometheus metrics under vLLM's names, so routers built for vLLM can read a sim node.

Each app gets its own `CollectorRegistry` (tests build many apps). Gauges of engine state
are read at scrape time by a collector, so they are never stale. Every vLLM-named series has
the label `model_name`: the node's first served model name, as vLLM labels with its first
``--served-model-name``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["CONTENT_TYPE", "EngineStats", "NodeMetrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# vLLM's buckets, with finer ones at the fast end where wafer-scale nodes live.
_TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
_TPOT_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.0075,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
_E2E_BUCKETS = (
    0.1,
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)


class EngineStats(Protocol):
    """What the metrics read from the batching engine at scrape time."""

    @property
    def num_running(self) -> int: ...
    @property
    def num_waiting(self) -> int: ...
    @property
    def kv_usage(self) -> float: ...
    @property
    def num_preemptions(self) -> int: ...
    @property
    def background_sequences(self) -> int: ...


class _EngineCollector(Collector):
    def __init__(self, engine: EngineStats, model_name: str) -> None:
        self._engine = engine
        self._model_name = model_name

    def collect(self) -> Iterator[Metric]:
        e, labels = self._engine, [self._model_name]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=["model_name"])
            family.add_metric(labels, value)
            return family

        yield gauge("vllm:num_requests_running", "Requests in the running batch.", e.num_running)
        yield gauge("vllm:num_requests_waiting", "Requests waiting to run.", e.num_waiting)
        yield gauge("vllm:kv_cache_usage_perc", "KV cache usage (1 = full).", e.kv_usage)
        preemptions = CounterMetricFamily(
            "vllm:num_preemptions", "Preemptions since start.", labels=["model_name"]
        )
        preemptions.add_metric(labels, e.num_preemptions)
        yield preemptions
        yield gauge(
            "tiergate_background_sequences",
            "Simulated other-tenant sequences kept decoding.",
            e.background_sequences,
        )


class NodeMetrics:
    """The node's metrics; `observe_*` record finished requests, `render` is the scrape."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.registry = CollectorRegistry(auto_describe=True)
        r, labels = self.registry, ["model_name"]
        self.time_to_first_token = Histogram(
            "vllm:time_to_first_token_seconds",
            "Time to first token.",
            labels,
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.time_per_output_token = Histogram(
            "vllm:time_per_output_token_seconds",
            "Time per output token after the first.",
            labels,
            buckets=_TPOT_BUCKETS,
            registry=r,
        )
        self.e2e_latency = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Request latency, arrival to last token.",
            labels,
            buckets=_E2E_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prompt tokens.", labels, registry=r)
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Generated tokens.", labels, registry=r
        )
        self.request_success = Counter(
            "vllm:request_success",
            "Finished requests by finish reason.",
            ["model_name", "finished_reason"],
            registry=r,
        )
        # Series exist (at zero) from the start, as vLLM's do: rate() needs a first sample.
        for family in (
            self.time_to_first_token,
            self.time_per_output_token,
            self.e2e_latency,
            self.prompt_tokens,
            self.generation_tokens,
        ):
            family.labels(model_name)
        self.http_errors = Counter(
            "tiergate_http_errors",
            "Error replies by HTTP status and error code.",
            ["status", "code"],
            registry=r,
        )

    def attach_engine(self, engine: EngineStats) -> None:
        """Read `engine`'s state on every scrape."""
        self.registry.register(_EngineCollector(engine, self.model_name))

    def observe_request(
        self,
        *,
        prompt_tokens: int,
        generated_tokens: int,
        finish_reason: str,
        ttft_s: float | None,
        e2e_s: float,
        decode_s: float,
    ) -> None:
        """Record one finished (or aborted) request."""
        name = self.model_name
        self.prompt_tokens.labels(name).inc(prompt_tokens)
        self.generation_tokens.labels(name).inc(generated_tokens)
        self.request_success.labels(name, finish_reason).inc()
        if ttft_s is not None:
            self.time_to_first_token.labels(name).observe(max(ttft_s, 0.0))
        if generated_tokens > 1:
            tpot = max(decode_s, 0.0) / (generated_tokens - 1)
            self.time_per_output_token.labels(name).observe(tpot)
        self.e2e_latency.labels(name).observe(max(e2e_s, 0.0))

    def observe_error(self, status: int, code: str | None) -> None:
        """Count one error reply."""
        self.http_errors.labels(str(status), code or "").inc()

    def render(self) -> bytes:
        """The Prometheus text exposition."""
        return generate_latest(self.registry)
