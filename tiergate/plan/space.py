"""The search space of one tier: every configuration of the catalog its rules allow.

A configuration is what a pool spec sets: accelerator, chips and tensor-parallel layout,
weight and KV dtypes, batch cap, and speculative decoding where the catalog holds a draft (a
model distilled from the tier's). GPUs are tried from the fewest chips that hold one sequence
of the model's whole context (as vLLM needs to start) up to `max_chip_multiple` times that, in
every layout that divides the heads within a system; SRAM chips hold the KV cache too, so each
batch cap gets the fewest chips that hold its batch.
A tier planned for a real engine (vLLM, SGLang) keeps to what the engine runs: GPUs, a replica
within one system, its weight and KV-cache dtypes, a model (and draft) with published weights.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import cast

from tiergate.common.tiers import DEFINITIONS, Tier, batch_cap_problem
from tiergate.pools.engines import ENGINES, Engine, models_with_weights, spans_nodes_problem
from tiergate.sim_nodes.catalogs import Accelerator, Catalog, Dtype, ModelProfile
from tiergate.sim_nodes.perf import (
    BatchingSpec,
    ServingSpec,
    SpeculativeSpec,
    chips_to_hold,
    default_tensor_parallel,
    holds_whole_context,
)
from tiergate.sim_nodes.tier_rules import accelerators_with, tier_problem

from .errors import PlanError
from .report import Configuration
from .spec import SearchSpec, TierDemand

__all__ = ["Candidate", "candidates"]


@dataclass(frozen=True, slots=True)
class Candidate:
    """One configuration of a replica (replica count is searched separately)."""

    model: str
    accelerator: str
    chips: int
    tensor_parallel: int
    weight_dtype: Dtype
    kv_dtype: Dtype
    max_num_seqs: int
    max_batched_tokens: int
    draft_model: str | None = None
    speculative_tokens: int | None = None
    acceptance_rate: float | None = None

    def serving_spec(self) -> ServingSpec:
        """The pool spec fields this configuration sets."""
        speculative = None
        if self.draft_model is not None:
            assert self.speculative_tokens is not None and self.acceptance_rate is not None
            speculative = SpeculativeSpec(
                draft_model=self.draft_model,
                tokens=self.speculative_tokens,
                acceptance_rate=self.acceptance_rate,
            )
        return ServingSpec(
            model=self.model,
            accelerator=self.accelerator,
            chips=self.chips,
            tensor_parallel=self.tensor_parallel,
            weight_dtype=self.weight_dtype,
            kv_dtype=self.kv_dtype,
            batching=BatchingSpec(
                max_num_seqs=self.max_num_seqs, max_batched_tokens=self.max_batched_tokens
            ),
            speculative_decoding=speculative,
        )

    @classmethod
    def of(cls, c: Configuration) -> Candidate:
        """The candidate a planned configuration was (for checking a plan afterwards)."""
        return cls(
            model=c.model,
            accelerator=c.accelerator,
            chips=c.chips,
            tensor_parallel=c.tensor_parallel,
            weight_dtype=cast(Dtype, c.weight_dtype),
            kv_dtype=cast(Dtype, c.kv_dtype),
            max_num_seqs=c.max_num_seqs,
            max_batched_tokens=c.max_batched_tokens,
            draft_model=c.draft_model,
            speculative_tokens=c.speculative_tokens,
            acceptance_rate=c.acceptance_rate,
        )

    def __str__(self) -> str:
        spec = f" spec {self.draft_model}x{self.speculative_tokens}" if self.draft_model else ""
        return (
            f"{self.chips}x {self.accelerator} tp{self.tensor_parallel} "
            f"{self.weight_dtype}/{self.kv_dtype} cap {self.max_num_seqs}{spec}"
        )


def candidates(
    tier: Tier,
    demand: TierDemand,
    search: SearchSpec,
    catalog: Catalog,
    *,
    tokens_per_request: int,
    longest_request: int,
) -> Iterator[Candidate]:
    """Every configuration of `tier` the catalog and `search` allow, in a fixed order.

    `tokens_per_request`: the mean request's KV footprint (sizes SRAM replicas for a full
    batch); `longest_request`: the longest, which every replica must hold (a GPU replica, one
    sequence of the model's whole context: `holds_whole_context`)."""
    model = catalog.model(demand.model)
    names = search.accelerators if search.accelerators is not None else sorted(catalog.accelerators)
    accelerators = _engine_runs(
        tier, demand.engine, model, [catalog.accelerator(name) for name in names], catalog
    )
    engine = ENGINES[demand.engine]
    weight_dtypes = _engine_dtypes(
        tier, search.weight_dtypes, engine.weight_dtypes,
        f"engine {engine.name} loads the published weights as "
        f"{' or '.join(engine.weight_dtypes or ())}: search.weightDtypes names neither (a pool "
        "of a checkpoint stored in another dtype names it in spec.modelSource, which a plan "
        "does not write)",
    )  # fmt: skip
    kv_dtypes = _engine_dtypes(
        tier, search.kv_dtypes, engine.kv_dtypes,
        f"engine {engine.name} keeps the KV cache in {' or '.join(engine.kv_dtypes or ())}: "
        "search.kvDtypes names neither",
    )  # fmt: skip
    speculative: list[tuple[ModelProfile, int] | None] = [None]
    if demand.speculative is not None:
        drafts = sorted(
            (
                m
                for m in catalog.models.values()
                if m.distilled_from == model.name
                and (m.hugging_face_id or not engine.loads_weights)
            ),
            key=lambda m: m.name,
        )
        speculative += [(d, k) for d in drafts for k in demand.speculative.tokens]
    caps = sorted(set(search.batch_caps))
    limit = DEFINITIONS[tier].max_num_seqs
    if limit is not None and caps[0] > limit:
        raise PlanError(f"tiers.{tier}: {batch_cap_problem(tier)} (search.batchCaps: {caps})")
    for accelerator in accelerators:
        for weight_dtype in weight_dtypes:
            for kv_dtype in kv_dtypes:
                for spec in speculative:
                    for cap in caps:
                        if tier_problem(tier, cap, accelerator.name, None, catalog) is not None:
                            continue
                        for chips, tp in _layouts(
                            model,
                            accelerator,
                            weight_dtype,
                            kv_dtype,
                            spec[0] if spec else None,
                            kv_tokens=max(cap * tokens_per_request, longest_request),
                            longest_request=longest_request,
                            multiple=search.max_chip_multiple,
                        ):
                            if spans_nodes_problem(
                                demand.engine, accelerator.name, chips, accelerator.chips_per_system
                            ):
                                continue
                            yield Candidate(
                                model=model.name,
                                accelerator=accelerator.name,
                                chips=chips,
                                tensor_parallel=tp,
                                weight_dtype=weight_dtype,
                                kv_dtype=kv_dtype,
                                max_num_seqs=cap,
                                max_batched_tokens=search.max_batched_tokens,
                                draft_model=spec[0].name if spec else None,
                                speculative_tokens=spec[1] if spec else None,
                                acceptance_rate=(
                                    demand.speculative.acceptance_rate
                                    if spec and demand.speculative
                                    else None
                                ),
                            )


def _engine_runs(
    tier: Tier,
    engine: Engine,
    model: ModelProfile,
    accelerators: list[Accelerator],
    catalog: Catalog,
) -> list[Accelerator]:
    """The accelerators `engine` runs `model` on; PlanError when the engine cannot serve the
    tier at all (its model has no weights to load, or it runs on none of them)."""
    definition = ENGINES[engine]
    if definition.loads_weights and not model.hugging_face_id:
        with_weights = ", ".join(models_with_weights(catalog))
        raise PlanError(
            f"tiers.{tier}: engine {engine} loads real weights, and the catalog has none for "
            f"{model.name} (no Hugging Face id): plan one of {with_weights}"
        )
    kind = definition.memory_kind
    if kind is None:
        return accelerators
    tier_kind = DEFINITIONS[tier].memory_kind
    if tier_kind is not None and tier_kind != kind:
        raise PlanError(
            f"tiers.{tier}: {tier} pools run on {tier_kind.upper()} accelerators and engine "
            f"{engine} on {kind.upper()} ones (GPUs): plan this tier with engine sim"
        )
    runs = [a for a in accelerators if a.memory_kind == kind]
    if not runs:
        raise PlanError(
            f"tiers.{tier}: engine {engine} runs on GPUs "
            f"({', '.join(accelerators_with(catalog, kind))}): search.accelerators names none"
        )
    return runs


def _engine_dtypes(
    tier: Tier, wanted: list[Dtype], runs: tuple[Dtype, ...] | None, why: str
) -> list[Dtype]:
    """The dtypes of the search an engine runs (`runs`; None: all); PlanError, saying `why`,
    when it runs none of them."""
    if runs is None:
        return wanted
    kept = [d for d in wanted if d in runs]
    if not kept:
        raise PlanError(f"tiers.{tier}: {why}")
    return kept


def _layouts(
    model: ModelProfile,
    accelerator: Accelerator,
    weight_dtype: Dtype,
    kv_dtype: Dtype,
    draft: ModelProfile | None,
    *,
    kv_tokens: int,
    longest_request: int,
    multiple: int,
) -> list[tuple[int, int]]:
    """(chips, tensor parallel) pairs worth trying for one accelerator and dtype pair."""

    def hold(tokens: int) -> int:
        return chips_to_hold(
            model,
            accelerator,
            weight_dtype=weight_dtype,
            kv_dtype=kv_dtype,
            kv_tokens=tokens,
            draft=draft,
        )

    # A GPU replica holds one sequence of the model's whole context (vLLM will not start
    # otherwise): the operator refuses fewer chips.
    if holds_whole_context(accelerator):
        longest_request = max(longest_request, model.max_context_tokens)
    if accelerator.layout == "pipeline":
        # More chips than the batch needs only add pipeline hops.
        chips = hold(max(kv_tokens, longest_request))
        return [(chips, default_tensor_parallel(chips, model, accelerator))]
    fewest = hold(longest_request)
    per_system = accelerator.chips_per_system
    sizes = [c for c in (1, 2, 4, 8, 16, 32) if c < per_system] + [
        per_system * k for k in range(1, 17)
    ]
    out = []
    for chips in sizes:
        if not fewest <= chips <= fewest * multiple:
            continue
        group = min(chips, per_system)
        for tp in (t for t in (1, 2, 4, 8, 16, 32, 64) if t <= group):
            if chips % tp == 0 and model.heads % tp == 0 and chips // tp <= model.layers:
                out.append((chips, tp))
    return out
