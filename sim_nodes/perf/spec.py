"""The serving spec: what an operator sets for a pool, in the InferencePool spec's shape.

Field names are snake_case in Python and camelCase on the wire (YAML pool files, the CRD),
so a pool file written for the operator can be handed to a sim node as it is.
`build_deployment` turns a spec into the `Deployment` the performance model evaluates.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from ..catalogs import Catalog, Dtype
from .deployment import Deployment, PerfConfigError, Speculative, chips_to_hold
from .deployment import default_tensor_parallel as _default_tp
from .steady_state import Batching


class _Spec(BaseModel):
    model_config = ConfigDict(
        extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True
    )


class BatchingSpec(_Spec):
    """The engine's batch limits."""

    max_num_seqs: int = Field(
        default=256, ge=1, description="Batch cap: sequences decoded together (premium: small)."
    )
    max_batched_tokens: int = Field(
        default=8192, ge=1, description="Token budget of one step (decode + prefill chunks)."
    )
    chunked_prefill: bool = Field(
        default=True, description="Split prompts into chunks mixed with decoding."
    )

    def to_batching(self) -> Batching:
        return Batching(self.max_num_seqs, self.max_batched_tokens, self.chunked_prefill)


class SpeculativeSpec(_Spec):
    """Speculative decoding with a draft model."""

    draft_model: str = Field(description="Catalog name of the draft model.")
    tokens: int = Field(ge=1, le=16, description="Tokens the draft proposes per step.")
    acceptance_rate: float = Field(ge=0, lt=1, description="Probability a draft token is kept.")


class PricingSpec(_Spec):
    """Overrides of the catalog price."""

    per_chip_hour_usd: float = Field(ge=0, description="Price per chip-hour, USD.")


class ServingSpec(_Spec):
    """Model, hardware, layout and batching of one pool's replicas."""

    model: str = Field(description="Catalog model name.")
    accelerator: str = Field(description="Catalog accelerator name.")
    chips: int | Literal["auto"] = Field(
        default="auto", description="Chips per replica, or auto: the fewest that hold the model."
    )
    tensor_parallel: int | None = Field(
        default=None, ge=1, description="Tensor-parallel group size (default: per system)."
    )
    weight_dtype: Dtype = Field(default="bf16", description="Weight storage dtype.")
    kv_dtype: Dtype = Field(
        default="bf16", description="KV cache dtype (bf16 unless set, like vLLM's auto)."
    )
    batching: BatchingSpec = Field(default_factory=BatchingSpec, description="Batch limits.")
    speculative_decoding: SpeculativeSpec | None = Field(
        default=None, description="Speculative decoding, if any."
    )
    pricing: PricingSpec | None = Field(default=None, description="Price override.")


def build_deployment(spec: ServingSpec, catalog: Catalog, *, kv_tokens: int = 0) -> Deployment:
    """The replica a spec describes. `kv_tokens` sizes `chips: auto` (SRAM chips hold KV too).

    Raises CatalogError for unknown names and PerfConfigError for impossible layouts.
    """
    model = catalog.model(spec.model)
    accelerator = catalog.accelerator(spec.accelerator)
    if spec.pricing is not None:
        accelerator = accelerator.model_copy(
            update={"price_per_chip_hour_usd": spec.pricing.per_chip_hour_usd}
        )
    kv_dtype = spec.kv_dtype
    speculative = None
    if spec.speculative_decoding is not None:
        sd = spec.speculative_decoding
        speculative = Speculative(sd.tokens, sd.acceptance_rate, catalog.model(sd.draft_model))
    if spec.chips == "auto":
        chips = chips_to_hold(
            model,
            accelerator,
            weight_dtype=spec.weight_dtype,
            kv_dtype=kv_dtype,
            kv_tokens=kv_tokens,
            draft=speculative.draft if speculative else None,
        )
    else:
        chips = spec.chips
    if chips < 1:
        raise PerfConfigError(f"chips must be at least 1 (got {chips})")
    tp = spec.tensor_parallel or _default_tp(chips, model, accelerator)
    return Deployment(model, accelerator, chips, tp, spec.weight_dtype, kv_dtype, speculative)
