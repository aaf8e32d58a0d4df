"""Pydantic schemas of the hardware and model catalogs.

YAML keeps human units (GB, TB/s, TFLOPS, microseconds); the properties convert to SI so the
performance model only ever sees bytes, seconds and FLOP/s.

Field names are snake_case in the catalog files. The same models also describe a profile inline
in a pool spec (`modelProfile`, `acceleratorProfile`), where the wire is camelCase like the rest
of the spec: each field is accepted under both names.
"""

from __future__ import annotations

from functools import cached_property
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel
from pydantic.json_schema import SkipJsonSchema

from tiergate.common.memory import MemoryKind

Dtype = Literal["bf16", "fp8", "int8", "fp4"]
DTYPES: tuple[Dtype, ...] = ("bf16", "fp8", "int8", "fp4")
#: How a deployment spreads a model over several chips of an accelerator.
ChipLayout = Literal["tensor-parallel", "pipeline"]

#: Bytes per element of each storage dtype (fp4 packs two values per byte).
DTYPE_BYTES: dict[Dtype, float] = {"bf16": 2.0, "fp8": 1.0, "int8": 1.0, "fp4": 0.5}

GB = 1e9
TB = 1e12
US = 1e-6


# Every size and rate is bounded far beyond any chip or model (100 TB of memory per chip, a
# quadrillion parameters): a value past that is a typo, and the performance model's arithmetic
# would overflow on it.
_PROFILE_CONFIG = ConfigDict(
    extra="forbid",
    frozen=True,
    alias_generator=to_camel,
    populate_by_name=True,
    allow_inf_nan=False,
)


class Accelerator(BaseModel):
    """One accelerator chip, as the performance model needs it."""

    model_config = _PROFILE_CONFIG

    name: str = Field(
        description="Name the profile is registered under, e.g. h100-sxm (inline in a pool: "
        "spec.accelerator)."
    )
    memory_kind: MemoryKind = Field(description="Where weights and KV cache live.")
    chip_layout: ChipLayout | None = Field(
        default=None,
        description="How a model spans chips. tensor-parallel: groups of chips within a system "
        "split every layer, whole systems become pipeline stages, and a deployment takes the "
        "fewest chips that hold the weights and, on GPU memory, one sequence of the whole "
        "context (the KV cache gets what is left), as on GPUs. "
        "pipeline: layers are laid out chip after chip (a tensor-parallel group per stage only "
        "when chips outnumber layers), and a deployment takes the chips the weights and a full "
        "batch's KV cache need, since a chip more only adds a hop, as on SRAM dataflow chips. "
        "Default: pipeline when memoryKind is sram, else tensor-parallel.",
    )
    kind: SkipJsonSchema[str | None] = Field(
        default=None,
        description="The accelerator kind (sim_nodes/catalogs/kinds.yaml) whose calibrated "
        "parameters it shares; unset, it keeps its own values. Catalog files only.",
    )
    fitted_alone: SkipJsonSchema[tuple[str, ...]] = Field(
        default=(),
        description="Fields of its kind's calibrated parameters it fits on its own rows instead "
        "of sharing them. Catalog files only.",
    )
    gpu_product: str | None = Field(
        default=None,
        description="The node label nvidia.com/gpu.product of nodes with this GPU (NVIDIA GPU "
        "feature discovery), e.g. NVIDIA-H100-80GB-HBM3: how pods of a real engine select "
        "them. Unset for chips that are no NVIDIA GPU.",
    )
    memory_gb: float = Field(
        gt=0, le=100_000, description="Memory capacity per chip, GB (1e9 bytes)."
    )
    memory_bandwidth_tb_per_s: float = Field(
        gt=0, le=1_000_000, description="Peak memory bandwidth, TB/s."
    )
    peak_tflops: dict[Dtype, Annotated[float, Field(gt=0, le=100_000_000)]] = Field(
        description="Dense peak compute per dtype, TFLOP/s. bf16 is required."
    )
    interconnect_gb_per_s: float = Field(
        ge=0.001, le=100_000_000, description="Chip-to-chip bandwidth, GB/s."
    )
    interconnect_latency_us: float = Field(
        ge=0,
        le=1_000_000,
        description="Latency of one collective (GPUs) or one chip-to-chip hop (pipelines).",
    )
    chips_per_system: int = Field(ge=1, le=100_000, description="Chips in one server/system.")
    price_per_chip_hour_usd: float = Field(
        ge=0, le=1_000_000, description="List price per chip-hour, USD."
    )
    memory_bandwidth_efficiency: float = Field(
        gt=0, le=1, description="Fraction of peak bandwidth reached when streaming weights/KV."
    )
    compute_efficiency: float = Field(
        gt=0, le=1, description="Fraction of dense peak reached by compute-bound steps (prefill)."
    )
    step_overhead_us: float = Field(
        ge=0,
        le=1_000_000,
        description="Fixed cost of every engine step: scheduling, sampling, launches.",
    )
    layer_latency_us: float = Field(
        ge=0,
        le=1_000_000,
        description="Fixed latency per layer per step (dataflow chips); 0 for GPUs.",
    )
    grouped_gemm_efficiency: float = Field(
        default=1.0,
        gt=0,
        le=1,
        description="Fraction of the dense roofline MoE expert matmuls (grouped GEMMs) reach.",
    )
    fp4_compute_efficiency: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="Fraction of the fp4 dense peak that fp4 matmuls reach, where it differs from "
        "compute_efficiency (block-scaled fp4 kernels lag the others). Default: "
        "compute_efficiency.",
    )
    usable_memory_fraction: float = Field(
        gt=0, le=1, description="Fraction of memory the engine may use (gpu_memory_utilization)."
    )
    activation_reserve_gb: float = Field(
        ge=0,
        le=100_000,
        description="Memory per chip held back for activations and runtime buffers, GB.",
    )

    @model_validator(mode="after")
    def _bf16_required(self) -> Accelerator:
        if "bf16" not in self.peak_tflops:
            raise ValueError(f"accelerator {self.name}: peak_tflops needs a bf16 entry")
        return self

    @property
    def layout(self) -> ChipLayout:
        """`chip_layout`, or its default: SRAM chips keep a layer's weights resident on each
        chip of a pipeline; other chips split layers in tensor-parallel groups."""
        if self.chip_layout is not None:
            return self.chip_layout
        return "pipeline" if self.memory_kind == "sram" else "tensor-parallel"

    @property
    def memory_bytes(self) -> float:
        return self.memory_gb * GB

    @property
    def memory_bandwidth_bytes_per_s(self) -> float:
        return self.memory_bandwidth_tb_per_s * TB

    @property
    def interconnect_bytes_per_s(self) -> float:
        return self.interconnect_gb_per_s * GB

    @property
    def interconnect_latency_s(self) -> float:
        return self.interconnect_latency_us * US

    @property
    def step_overhead_s(self) -> float:
        return self.step_overhead_us * US

    @property
    def layer_latency_s(self) -> float:
        return self.layer_latency_us * US

    @property
    def usable_bytes_per_chip(self) -> float:
        """Bytes per chip the engine may fill with weights and KV cache."""
        return self.memory_bytes * self.usable_memory_fraction - self.activation_reserve_gb * GB

    def peak_flops_per_s(self, dtype: Dtype) -> float:
        """Dense peak for `dtype`; a dtype without native units computes at bf16.

        That is weight-only quantisation: memory shrinks, arithmetic does not speed up.
        """
        return self.peak_tflops.get(dtype, self.peak_tflops["bf16"]) * TB

    def compute_efficiency_for(self, dtype: Dtype) -> float:
        """Share of `dtype`'s dense peak that compute-bound kernels reach."""
        if dtype == "fp4" and "fp4" in self.peak_tflops and self.fp4_compute_efficiency:
            return self.fp4_compute_efficiency
        return self.compute_efficiency


class ModelProfile(BaseModel):
    """One language model's architecture, as the performance model needs it."""

    model_config = _PROFILE_CONFIG

    name: str = Field(
        description="Name the profile is registered under, e.g. llama-3.1-8b (inline in a pool: "
        "spec.model)."
    )
    hugging_face_id: str | None = Field(
        default=None,
        description="The Hugging Face repository of the weights, e.g. "
        "meta-llama/Llama-3.1-8B-Instruct: what a real engine loads (unset: no published "
        "weights; a pool of a real engine then names them in spec.modelSource).",
    )
    layers: int = Field(ge=1, le=100_000, description="Transformer layers.")
    hidden_size: int = Field(ge=1, le=1_000_000, description="Model (residual) width.")
    heads: int = Field(ge=1, le=100_000, description="Attention (query) heads.")
    kv_heads: int = Field(ge=1, le=100_000, description="Key/value heads (GQA).")
    head_dim: int = Field(ge=1, le=100_000, description="Dimension of one attention head.")
    vocab_size: int = Field(ge=1, le=100_000_000, description="Vocabulary size.")
    tied_embeddings: bool = Field(
        default=False, description="Input embedding shared with the output projection."
    )
    total_params_b: float = Field(gt=0, le=1_000_000, description="All parameters, billions.")
    active_params_b: float = Field(
        gt=0, le=1_000_000, description="Parameters used per token, billions."
    )
    experts: int = Field(
        default=1, ge=1, le=1_000_000, description="Routed experts per MoE layer (1 = dense)."
    )
    experts_per_token: int = Field(
        default=1, ge=1, le=1_000_000, description="Experts each token is routed to."
    )
    max_context_tokens: int = Field(
        ge=1, le=1_000_000_000, description="Longest supported context."
    )
    quality: float = Field(
        ge=0, le=1, description="Probability a tool call is well-formed and right."
    )
    distilled_from: str | None = Field(default=None, description="Teacher model, if distilled.")

    @model_validator(mode="after")
    def _consistent(self) -> ModelProfile:
        if self.active_params_b > self.total_params_b:
            raise ValueError(f"model {self.name}: active_params_b exceeds total_params_b")
        if self.heads % self.kv_heads:
            raise ValueError(f"model {self.name}: heads must be a multiple of kv_heads")
        if self.experts_per_token > self.experts:
            raise ValueError(f"model {self.name}: experts_per_token exceeds experts")
        if self.experts > 1 and self.experts_per_token == self.experts:
            raise ValueError(f"model {self.name}: every expert active; declare it dense")
        if self.active_compute_params <= 0:
            raise ValueError(
                f"model {self.name}: the embedding table (vocab_size x hidden_size) holds "
                "all of active_params_b: no parameters left to compute with"
            )
        return self

    @property
    def is_moe(self) -> bool:
        return self.experts > 1

    @cached_property
    def embedding_params(self) -> float:
        """Input embedding table: looked up one row per token, never streamed whole."""
        return 0.0 if self.tied_embeddings else float(self.vocab_size * self.hidden_size)

    @cached_property
    def expert_params(self) -> float:
        """Parameters of one routed expert summed over all layers (0 for dense models)."""
        if not self.is_moe:
            return 0.0
        total, active = self.total_params_b * 1e9, self.active_params_b * 1e9
        return (total - active) / (self.experts - self.experts_per_token)

    @cached_property
    def shared_params(self) -> float:
        """Parameters every token uses and every step streams (attention, norms, lm_head)."""
        return self.total_params_b * 1e9 - self.experts * self.expert_params - self.embedding_params

    @cached_property
    def active_compute_params(self) -> float:
        """Parameters that do matrix multiplies for one token."""
        return self.active_params_b * 1e9 - self.embedding_params

    def kv_bytes_per_token(self, kv_bytes_per_element: float) -> float:
        """KV cache bytes per token of context: K and V for every layer and KV head."""
        return 2.0 * self.layers * self.kv_heads * self.head_dim * kv_bytes_per_element
