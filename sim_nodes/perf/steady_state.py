"""Steady-state serving: what users of a replica see at a given concurrency.

The workload is closed-loop: `concurrency` streams, each sending a request of `input_tokens`
(of which `cached_input_tokens` hit the prefix cache) and reading `output_tokens`, then the
next. Every stream's prefill interrupts the others' decoding (chunked prefill mixes it into
their steps), which is the interference `throughput_output_tokens_per_s` includes.

    TTFT  = own prompt's prefill steps (chunks mixed with the others' decoding)
    D     = decode time of the remaining tokens, slowed by the others' prefills that land in it
    TPOT  = D / (output_tokens - 1)
    throughput = concurrency * output_tokens / (TTFT + D)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from pydantic import BaseModel, ConfigDict, Field

from .deployment import Deployment, PerfConfigError
from .step import IDLE, StepTerms, step_terms


@dataclass(frozen=True, slots=True)
class Workload:
    """Request shape and how many streams send them at once (None = as many as fit)."""

    input_tokens: int = 1024
    output_tokens: int = 256
    cached_input_tokens: int = 0
    concurrency: int | None = 1

    def __post_init__(self) -> None:
        if self.input_tokens < 1:
            raise PerfConfigError(f"input tokens must be at least 1 (got {self.input_tokens})")
        if self.output_tokens < 1:
            raise PerfConfigError(f"output tokens must be at least 1 (got {self.output_tokens})")
        if not 0 <= self.cached_input_tokens < self.input_tokens:
            raise PerfConfigError("cached input tokens must be in [0, input tokens)")
        if self.concurrency is not None and self.concurrency < 1:
            raise PerfConfigError(f"concurrency must be at least 1 (got {self.concurrency})")

    @property
    def tokens_per_sequence(self) -> int:
        return self.input_tokens + self.output_tokens


@dataclass(frozen=True, slots=True)
class Batching:
    """The engine's batch limits (vLLM's max_num_seqs / max_num_batched_tokens)."""

    max_num_seqs: int | None = None
    max_batched_tokens: int = 8192
    chunked_prefill: bool = True

    def __post_init__(self) -> None:
        if self.max_num_seqs is not None and self.max_num_seqs < 1:
            raise PerfConfigError(f"max_num_seqs must be at least 1 (got {self.max_num_seqs})")
        if self.max_batched_tokens < 1:
            raise PerfConfigError("max_batched_tokens must be at least 1")


class StepBreakdown(BaseModel):
    """Where one decode step's time goes (seconds for the whole step)."""

    model_config = ConfigDict(frozen=True)

    total_s: float
    weight_read_s: float
    matmul_compute_s: float
    kv_read_s: float
    attention_compute_s: float
    roofline_s: float
    communication_s: float
    layer_latency_s: float
    pipeline_hop_s: float
    speculative_draft_s: float
    overhead_s: float
    bound: str = Field(description="memory, compute or latency")
    expert_gemm_s: float = Field(
        default=0.0, description="MoE expert kernels (grouped GEMMs), part of roofline_s."
    )
    expert_all_to_all_s: float = Field(
        default=0.0, description="Expert-parallel dispatch and combine, part of communication_s."
    )
    expert_imbalance: float = Field(
        default=1.0, description="Busiest expert-parallel rank's load over the mean."
    )

    @classmethod
    def of(cls, terms: StepTerms) -> StepBreakdown:
        fields = {k: v for k, v in asdict(terms).items() if k in cls.model_fields}
        return cls(**fields, bound=terms.bound)


class PerfResult(BaseModel):
    """The stable, machine-readable answer of `tiergate perf --json`."""

    model_config = ConfigDict(frozen=True)

    fits: bool
    reason: str | None = None
    model: str
    accelerator: str
    chips: int
    tensor_parallel: int
    pipeline_stages: int
    weight_dtype: str
    kv_dtype: str
    input_tokens: int
    output_tokens: int
    cached_input_tokens: int
    concurrency: int
    running_sequences: int
    max_concurrency: int
    kv_capacity_tokens: int
    weight_bytes_per_chip: float
    ttft_s: float
    tpot_s: float
    output_tokens_per_s_per_stream: float
    throughput_output_tokens_per_s: float
    cost_per_hour_usd: float
    cost_per_million_output_tokens_usd: float
    quality: float
    tokens_per_step_per_sequence: float
    prefill_interference_s: float = Field(
        description="Delay one prompt's prefill adds to every other stream's decoding."
    )
    decode_step: StepBreakdown


def max_running(d: Deployment, workload: Workload, batching: Batching) -> int:
    """Sequences that can decode at once: KV capacity, capped by max_num_seqs."""
    held = d.max_concurrency(workload.tokens_per_sequence)
    if batching.max_num_seqs is not None:
        held = min(held, batching.max_num_seqs)
    return held


def evaluate(d: Deployment, workload: Workload, batching: Batching | None = None) -> PerfResult:
    """Predict TTFT, TPOT, throughput and cost of `workload` on one replica `d`."""
    batching = batching or Batching()
    m = d.model
    if workload.tokens_per_sequence > m.max_context_tokens:
        raise PerfConfigError(
            f"input + output tokens ({workload.tokens_per_sequence}) exceed the "
            f"{m.max_context_tokens}-token context of {m.name}"
        )
    kv_max = d.max_concurrency(workload.tokens_per_sequence)
    max_conc = max_running(d, workload, batching)
    concurrency = workload.concurrency if workload.concurrency is not None else max_conc
    running = min(concurrency, max_conc)
    reason = _misfit(d, workload, concurrency, kv_max)
    if reason is not None:
        return unfit(d, workload, reason, concurrency, max_conc)

    spec = d.speculative
    per_step = spec.tokens_per_step if spec else 1.0
    avg_context = workload.input_tokens + workload.output_tokens / 2.0
    decode = step_terms(d, decode_seqs=running, decode_context_tokens=running * avg_context)
    ttft_s, interference_s = _prefill(d, workload, batching, running, avg_context)

    out = workload.output_tokens
    decode_only_s = (out - 1) * decode.total_s / per_step
    # The other streams' prefills land in this stream's decode time in proportion to it.
    decode_s = _decode_with_interference(decode_only_s, ttft_s, (running - 1) * interference_s)
    tpot_s = decode_s / (out - 1) if out > 1 else decode.total_s / per_step
    cycle_s = ttft_s + decode_s
    throughput = running * out / cycle_s
    return PerfResult(
        fits=True,
        **_identity(d, workload, concurrency, running, max_conc),
        ttft_s=ttft_s,
        tpot_s=tpot_s,
        output_tokens_per_s_per_stream=1.0 / tpot_s,
        throughput_output_tokens_per_s=throughput,
        cost_per_hour_usd=d.cost_per_hour_usd,
        cost_per_million_output_tokens_usd=d.cost_per_hour_usd / 3600.0 / throughput * 1e6,
        quality=m.quality,
        tokens_per_step_per_sequence=per_step,
        prefill_interference_s=interference_s,
        decode_step=StepBreakdown.of(decode),
    )


def _decode_with_interference(decode_only_s: float, ttft_s: float, others_s: float) -> float:
    """Solve D = a + b * D / (T + D): decode time stretched by others' prefills.

    a: this stream's own decode steps; b: all other streams' prefill delay per cycle;
    T: this stream's TTFT. A fraction D / (T + D) of the others' prefills fall in D.
    """
    a, b, t = decode_only_s, others_s, ttft_s
    if a <= 0:
        return 0.0
    p = t - a - b
    return (-p + math.sqrt(p * p + 4.0 * a * t)) / 2.0


def _prefill(
    d: Deployment, workload: Workload, batching: Batching, running: int, avg_context: float
) -> tuple[float, float]:
    """(TTFT of one prompt, delay its prefill adds to each other decoding stream)."""
    new_tokens = workload.input_tokens - workload.cached_input_tokens
    cached = workload.cached_input_tokens
    others = running - 1
    if not batching.chunked_prefill:
        alone = step_terms(
            d,
            prefill_tokens=new_tokens,
            prefill_prefix_tokens=cached,
            prefill_attended_positions=new_tokens * (cached + new_tokens / 2.0),
        ).total_s
        return alone, alone
    budget = max(batching.max_batched_tokens - others, 1)
    base = step_terms(d, decode_seqs=others, decode_context_tokens=others * avg_context)
    ttft_s = interference_s = 0.0
    done = 0
    while done < new_tokens:
        chunk = min(budget, new_tokens - done)
        prefix = cached + done
        mixed = step_terms(
            d,
            decode_seqs=others,
            decode_context_tokens=others * avg_context,
            prefill_tokens=chunk,
            prefill_prefix_tokens=prefix,
            prefill_attended_positions=chunk * (prefix + chunk / 2.0),
        )
        ttft_s += mixed.total_s
        interference_s += mixed.total_s - base.total_s
        done += chunk
    return ttft_s, interference_s


def _misfit(d: Deployment, workload: Workload, concurrency: int, kv_max: int) -> str | None:
    gb = 1e9
    if not d.weights_fit:
        return (
            f"weights need {d.weight_bytes_per_chip / gb:.1f} GB per chip but "
            f"{d.accelerator.name} offers {d.accelerator.usable_bytes_per_chip / gb:.1f} GB "
            f"usable on each of {d.chips} chips"
        )
    if kv_max < 1:
        return (
            f"after weights the KV cache holds {d.kv_capacity_tokens} tokens, less than one "
            f"sequence of {workload.tokens_per_sequence}"
        )
    if concurrency > kv_max:
        return (
            f"KV cache holds {d.kv_capacity_tokens} tokens: {kv_max} sequences of "
            f"{workload.tokens_per_sequence}, fewer than the {concurrency} requested"
        )
    return None


def _identity(
    d: Deployment, workload: Workload, concurrency: int, running: int, max_conc: int
) -> dict[str, object]:
    return {
        "model": d.model.name,
        "accelerator": d.accelerator.name,
        "chips": d.chips,
        "tensor_parallel": d.tensor_parallel,
        "pipeline_stages": d.pipeline_stages,
        "weight_dtype": d.weight_dtype,
        "kv_dtype": d.kv_dtype,
        "input_tokens": workload.input_tokens,
        "output_tokens": workload.output_tokens,
        "cached_input_tokens": workload.cached_input_tokens,
        "concurrency": concurrency,
        "running_sequences": running,
        "max_concurrency": max_conc,
        "kv_capacity_tokens": d.kv_capacity_tokens,
        "weight_bytes_per_chip": d.weight_bytes_per_chip,
    }


def unfit(
    d: Deployment, workload: Workload, reason: str, concurrency: int, max_conc: int
) -> PerfResult:
    """The result for `d` under `workload` when it does not fit, for `reason`: no figures a
    script could rank it by (every time, speed and cost per token zero)."""
    return PerfResult(
        fits=False,
        reason=reason,
        **_identity(d, workload, concurrency, 0, max(max_conc, 0)),
        ttft_s=0.0,
        tpot_s=0.0,
        output_tokens_per_s_per_stream=0.0,
        throughput_output_tokens_per_s=0.0,
        cost_per_hour_usd=d.cost_per_hour_usd,
        cost_per_million_output_tokens_usd=0.0,
        quality=d.model.quality,
        tokens_per_step_per_sequence=1.0,
        prefill_interference_s=0.0,
        decode_step=StepBreakdown.of(IDLE),
    )
