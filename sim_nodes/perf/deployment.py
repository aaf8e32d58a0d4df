"""A model placed on chips: sharding, validation, memory fit and KV capacity.

A `Deployment` is the static half of the performance model: everything that does not depend on
what the batch looks like at a given step. Parallelism follows the usual layout: tensor
parallel inside a group of `tensor_parallel` chips, pipeline stages across groups
(`chips / tensor_parallel`). SRAM chips default to a pure pipeline (tensor_parallel 1): the
weights are laid out layer after layer across chips, which is how wafer-scale and LPU systems
hold models bigger than one chip.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..catalogs import DTYPE_BYTES, Accelerator, Dtype, ModelProfile


class PerfConfigError(ValueError):
    """An impossible configuration (as opposed to one that merely does not fit)."""


def holds_whole_context(accelerator: Accelerator) -> bool:
    """Whether a replica on `accelerator` must keep KV cache for one sequence of its whole
    context: GPUs do (vLLM checks so when it starts; SGLang and the sim node stand in for the
    same pods). SRAM chips (wafer-scale, LPU; simulated only) are sized by their batch."""
    return accelerator.memory_kind != "sram"


@dataclass(frozen=True, slots=True)
class Speculative:
    """Speculative decoding: a draft model proposes `tokens`, the target verifies them at once."""

    tokens: int
    acceptance_rate: float
    draft: ModelProfile

    def __post_init__(self) -> None:
        if self.tokens < 1:
            raise PerfConfigError("speculative tokens must be at least 1")
        if not 0.0 <= self.acceptance_rate < 1.0:
            raise PerfConfigError("acceptance rate must be in [0, 1)")

    @property
    def tokens_per_step(self) -> float:
        """Expected tokens emitted per verification step: (1 - a^(k+1)) / (1 - a)."""
        a, k = self.acceptance_rate, self.tokens
        return (1.0 - a ** (k + 1)) / (1.0 - a)


@dataclass(frozen=True, slots=True)
class Deployment:
    """One replica: a model on `chips` accelerators with a parallel layout and dtypes."""

    model: ModelProfile
    accelerator: Accelerator
    chips: int = 1
    tensor_parallel: int = 1
    weight_dtype: Dtype = "bf16"
    kv_dtype: Dtype = "bf16"
    speculative: Speculative | None = None
    # Derived once; the engine reads these on every step.
    pipeline_stages: int = field(init=False)
    weight_bytes_per_param: float = field(init=False)
    kv_bytes_per_token_per_chip: float = field(init=False)
    draft: Deployment | None = field(init=False)

    def __post_init__(self) -> None:
        if self.chips < 1:
            raise PerfConfigError(f"chips must be at least 1 (got {self.chips})")
        if self.tensor_parallel < 1:
            raise PerfConfigError(
                f"tensor parallel must be at least 1 (got {self.tensor_parallel})"
            )
        if self.chips % self.tensor_parallel:
            raise PerfConfigError(
                f"tensor parallel {self.tensor_parallel} must divide chips {self.chips}"
            )
        if self.model.heads % self.tensor_parallel:
            raise PerfConfigError(
                f"tensor parallel {self.tensor_parallel} must divide the {self.model.heads} "
                f"attention heads of {self.model.name}; valid: {_divisors(self.model.heads)}"
            )
        stages = self.chips // self.tensor_parallel
        if stages > self.model.layers:
            raise PerfConfigError(
                f"{stages} pipeline stages exceed the {self.model.layers} layers "
                f"of {self.model.name}"
            )
        object.__setattr__(self, "pipeline_stages", stages)
        object.__setattr__(self, "weight_bytes_per_param", DTYPE_BYTES[self.weight_dtype])
        # KV heads are split across tensor-parallel ranks; with more ranks than KV heads each
        # rank keeps a replica of one head (as vLLM does), so capacity stops improving.
        kv_heads_per_chip = max(self.model.kv_heads / self.tensor_parallel, 1.0)
        per_chip = (
            2.0
            * (self.model.layers / stages)
            * kv_heads_per_chip
            * self.model.head_dim
            * DTYPE_BYTES[self.kv_dtype]
        )
        object.__setattr__(self, "kv_bytes_per_token_per_chip", per_chip)
        object.__setattr__(self, "draft", self._draft_deployment())

    def _draft_deployment(self) -> Deployment | None:
        """The draft model runs beside the target, on one tensor-parallel group."""
        if self.speculative is None:
            return None
        draft = self.speculative.draft
        tp = math.gcd(self.tensor_parallel, draft.heads)
        return Deployment(draft, self.accelerator, tp, tp, self.weight_dtype, self.kv_dtype)

    # -- memory -------------------------------------------------------------------------------

    @property
    def weight_bytes(self) -> float:
        """All weights of the replica (and of the draft model, if any)."""
        params = self.model.total_params_b * 1e9
        if self.speculative is not None:
            params += self.speculative.draft.total_params_b * 1e9
        return params * self.weight_bytes_per_param

    @property
    def weight_bytes_per_chip(self) -> float:
        return self.weight_bytes / self.chips

    @property
    def kv_capacity_bytes_per_chip(self) -> float:
        """Memory left for KV cache on each chip (negative: weights do not fit)."""
        return self.accelerator.usable_bytes_per_chip - self.weight_bytes_per_chip

    @property
    def weights_fit(self) -> bool:
        return self.kv_capacity_bytes_per_chip > 0

    @property
    def kv_capacity_tokens(self) -> int:
        """Tokens of context the KV cache holds across all sequences."""
        if not self.weights_fit:
            return 0
        return int(self.kv_capacity_bytes_per_chip // self.kv_bytes_per_token_per_chip)

    @property
    def holds_its_context(self) -> bool:
        """Whether the replica can serve one request as long as its context (the model's, cut
        to what the pool serves): on GPUs its KV cache must hold one such sequence, which vLLM
        checks when it starts (`holds_whole_context`); SRAM chips are sized by their batch."""
        return (
            not holds_whole_context(self.accelerator)
            or self.kv_capacity_tokens >= self.model.max_context_tokens
        )

    def max_concurrency(self, tokens_per_sequence: int) -> int:
        """Sequences of `tokens_per_sequence` context the KV cache holds at once."""
        return self.kv_capacity_tokens // max(tokens_per_sequence, 1)

    # -- compute ------------------------------------------------------------------------------

    @property
    def peak_flops_per_s(self) -> float:
        """Dense peak per chip for the weight dtype (weight-only quantisation computes at bf16)."""
        return self.accelerator.peak_flops_per_s(self.weight_dtype)

    @property
    def compute_efficiency(self) -> float:
        """Share of that peak the matmuls reach (fp4 kernels may have their own)."""
        return self.accelerator.compute_efficiency_for(self.weight_dtype)

    @property
    def cost_per_hour_usd(self) -> float:
        return self.chips * self.accelerator.price_per_chip_hour_usd


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


def chips_to_hold(
    model: ModelProfile,
    accelerator: Accelerator,
    *,
    weight_dtype: Dtype = "bf16",
    kv_dtype: Dtype = "bf16",
    kv_tokens: int = 0,
    draft: ModelProfile | None = None,
) -> int:
    """Fewest chips whose memory holds the weights plus `kv_tokens` of KV cache.

    A tensor-parallel layout is sized in groups (a power of two dividing the heads, up to a
    system, then whole systems as pipeline stages); a pipeline layout one chip at a time. When
    nothing holds the model the largest candidate is returned, so evaluating it reports
    `fits: false` with the numbers rather than failing.
    """
    params = model.total_params_b * 1e9 + (draft.total_params_b * 1e9 if draft else 0.0)
    need = params * DTYPE_BYTES[weight_dtype] + kv_tokens * model.kv_bytes_per_token(
        DTYPE_BYTES[kv_dtype]
    )
    per_chip = max(accelerator.usable_bytes_per_chip, 1.0)
    lower = max(1, math.ceil(need / per_chip))
    if accelerator.layout == "pipeline":
        return _pipeline_size(lower, model)
    sizes = _gpu_sizes(accelerator.chips_per_system, model)
    # KV heads are replicated when tensor parallel exceeds them, so check each size for real.
    for chips in sizes:
        if chips < lower:
            continue
        tp = default_tensor_parallel(chips, model, accelerator)
        d = Deployment(model, accelerator, chips, tp, weight_dtype, kv_dtype)
        if d.kv_capacity_tokens >= kv_tokens and d.weights_fit:
            return chips
    return sizes[-1]


def _pipeline_size(lower: int, model: ModelProfile) -> int:
    """Fewest chips >= `lower` that lay out as (tensor-parallel group) x (stages <= layers).

    One layer per chip at most while the model spans fewer chips than it has layers; beyond
    that (an LPU holds 230 MB) each stage becomes a tensor-parallel group of chips.
    """
    if lower <= model.layers:
        return lower
    layouts = [
        tp * math.ceil(lower / tp)
        for tp in _head_divisors(model)
        if math.ceil(lower / tp) <= model.layers
    ]
    return min(layouts) if layouts else max(_head_divisors(model)) * model.layers


def _head_divisors(model: ModelProfile) -> list[int]:
    return [tp for tp in range(1, model.heads + 1) if model.heads % tp == 0]


def _gpu_sizes(per_system: int, model: ModelProfile) -> list[int]:
    sizes = [c for c in (1, 2, 4, 8, 16) if c <= per_system and model.heads % c == 0]
    biggest = sizes[-1]
    sizes += [biggest * stages for stages in range(2, 17) if stages <= model.layers]
    return sizes


def default_tensor_parallel(chips: int, model: ModelProfile, accelerator: Accelerator) -> int:
    """The layout an operator would pick.

    Tensor-parallel layouts (GPUs): the largest group that fits in one system, divides the
    chips and divides the attention heads; the rest of the chips become pipeline stages.
    Pipeline layouts (SRAM chips): a pure pipeline while there are no more chips than layers,
    then the smallest tensor-parallel group per stage that makes the stages fit the layers.
    """
    if accelerator.layout == "pipeline":
        fitting = [
            tp for tp in _head_divisors(model) if chips % tp == 0 and chips // tp <= model.layers
        ]
        return fitting[0] if fitting else 1
    limit = math.gcd(chips, accelerator.chips_per_system)
    return max(tp for tp in range(1, limit + 1) if limit % tp == 0 and model.heads % tp == 0)
