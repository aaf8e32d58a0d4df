"""The serving spec: what an operator sets for a pool, in the InferencePool spec's shape.

Field names are snake_case in Python and camelCase on the wire (YAML pool files, the CRD),
so a pool file written for the operator can be handed to a sim node as it is.
`build_deployment` turns a spec into the `Deployment` the performance model evaluates.

`model` and `accelerator` name catalog entries, unless the spec carries the profile itself
(`modelProfile`, `acceleratorProfile`): then the name is the one that profile is registered
under, in a per-spec copy of the catalog (`layered_catalog`). A profile may shadow a catalog
entry of the same name (that is how a team overrides a published figure); `profile_sources`
says which names were shadowed, so what a pool reports about itself stays honest.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from ..catalogs import Accelerator, Catalog, Dtype, ModelProfile
from .deployment import (
    Deployment,
    PerfConfigError,
    Speculative,
    chips_to_hold,
    holds_whole_context,
)
from .deployment import default_tensor_parallel as _default_tp
from .steady_state import Batching


class _Spec(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        frozen=True,
        allow_inf_nan=False,
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

    model: str = Field(
        description="Catalog model name, or the name spec.modelProfile is registered under."
    )
    accelerator: str | None = Field(
        default=None,
        description=(
            "Catalog accelerator name, or the name spec.acceleratorProfile is registered under "
            "(required unless spec.endpoint names a hosted API)."
        ),
    )
    model_profile: ModelProfile | None = Field(
        default=None,
        description=(
            "The model described inline (a catalog model entry's fields, camelCase), for a "
            "model the catalog lacks. Its name must equal spec.model. Named like a catalog "
            "entry, it shadows that entry for this pool only (status.envelope.modelSource "
            "then says inline-shadows-catalog)."
        ),
    )
    accelerator_profile: Accelerator | None = Field(
        default=None,
        description=(
            "The accelerator described inline (a catalog accelerator entry's fields, "
            "camelCase), for hardware the catalog lacks. Its name must equal spec.accelerator. "
            "Named like a catalog entry, it shadows that entry for this pool only "
            "(status.envelope.acceleratorSource then says inline-shadows-catalog)."
        ),
    )
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
    max_context_tokens: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000_000,
        description=(
            "The longest context a replica serves, prompt and output (vLLM's --max-model-len, "
            "SGLang's --context-length): at most the model's, which is the default. The engine "
            "refuses longer requests, and a replica on GPUs needs KV cache for one sequence of "
            "it (vLLM refuses to start otherwise): a shorter one fits fewer chips."
        ),
    )

    @model_validator(mode="after")
    def _names_its_hardware(self) -> ServingSpec:
        """A replica runs on hardware. (The InferencePool spec overrides this check: a hosted
        pool names an API instead.)"""
        if self.accelerator is None:
            raise PydanticCustomError("missing", "accelerator: Field required")
        return self

    def hardware(self) -> str:
        """The accelerator's name; PerfConfigError for a spec that names none (hosted)."""
        if self.accelerator is None:
            raise PerfConfigError("no accelerator: a hosted pool has no hardware to model")
        return self.accelerator

    @model_validator(mode="after")
    def _profiles_named_as_the_spec(self) -> ServingSpec:
        pairs = (
            ("modelProfile", self.model_profile, "model", self.model),
            ("acceleratorProfile", self.accelerator_profile, "accelerator", self.accelerator),
        )
        for field, profile, key, name in pairs:
            if profile is not None and profile.name != name:
                raise PydanticCustomError(
                    "profile_name",
                    "{field}.name '{profile}' must equal {key} '{name}' "
                    "(the name the profile is registered under)",
                    {"field": field, "profile": profile.name, "key": key, "name": name},
                )
        return self


ProfileSource = Literal["catalog", "inline", "inline-shadows-catalog"]


_SOURCE_NOTES: dict[ProfileSource, str] = {
    "catalog": "",
    "inline": " (inline profile)",
    "inline-shadows-catalog": " (inline profile, shadowing the catalog entry)",
}


def profile_label(name: str, source: ProfileSource) -> str:
    """`name` as people should read it: an inline profile says so, and whether it shadows."""
    return name + _SOURCE_NOTES[source]


def layered_catalog(spec: ServingSpec, catalog: Catalog) -> Catalog:
    """`catalog` with the spec's inline profiles added (a new catalog; `catalog` is untouched),
    its model's context cut to spec.maxContextTokens when that is shorter (a longer one is
    `build_deployment`'s PerfConfigError)."""
    layered = catalog.with_profiles(model=spec.model_profile, accelerator=spec.accelerator_profile)
    served = spec.max_context_tokens
    model = layered.models.get(spec.model)
    if served is None or model is None or served >= model.max_context_tokens:
        return layered
    return layered.with_profiles(model=model.model_copy(update={"max_context_tokens": served}))


def context_problem(spec: ServingSpec, catalog: Catalog) -> str | None:
    """Why spec.maxContextTokens cannot be served (more than the model's context), or None."""
    served = spec.max_context_tokens
    model = catalog.with_profiles(model=spec.model_profile).models.get(spec.model)
    if served is None or model is None or served <= model.max_context_tokens:
        return None
    return (
        f"maxContextTokens {served} is more than the {model.max_context_tokens}-token context of "
        f"{model.name}: an engine serves at most its model's (vLLM refuses a longer "
        "--max-model-len)"
    )


def profile_sources(spec: ServingSpec, catalog: Catalog) -> tuple[ProfileSource, ProfileSource]:
    """Where the spec's (model, accelerator) profiles come from, against the base `catalog`."""

    def source(inline: bool, shadowed: bool) -> ProfileSource:
        if not inline:
            return "catalog"
        return "inline-shadows-catalog" if shadowed else "inline"

    return (
        source(spec.model_profile is not None, spec.model in catalog.models),
        source(
            spec.accelerator_profile is not None, (spec.accelerator or "") in catalog.accelerators
        ),
    )


def build_deployment(spec: ServingSpec, catalog: Catalog, *, kv_tokens: int = 0) -> Deployment:
    """The replica a spec describes. `kv_tokens` sizes `chips: auto` (SRAM chips hold KV too;
    on GPUs at least one sequence of the whole context, `holds_whole_context`).

    Names resolve in `catalog` layered with the spec's inline profiles. Raises CatalogError for
    unknown names and PerfConfigError for impossible layouts.
    """
    catalog = layered_catalog(spec, catalog)
    model = catalog.model(spec.model)
    problem = context_problem(spec, catalog)
    if problem is not None:
        raise PerfConfigError(problem)
    accelerator = catalog.accelerator(spec.hardware())
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
        if holds_whole_context(accelerator):
            kv_tokens = max(kv_tokens, model.max_context_tokens)
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
