"""The tiers, defined once: every tier-aware part of tiergate reads this table.

A tier is a name, the rules its pools must follow (the largest batch cap they may have, the
memory their accelerators must hold weights in), how a request asks for it, and how a reply
says it in OpenAI's words. The InferencePool schema and its CEL rules, pool files, the
router's tier resolution, admission and replies, and the seed table all read it here; it sits
in the lowest layer so that each of them can.

Adding a tier: its name in `Tier`, its `TierDefinition` in `DEFINITIONS`, `make docs-reference`
(the CRD, the chart's values schema and the reference pages are generated from this table), and
its tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from .catalogs import Catalog, MemoryKind

__all__ = [
    "DEFAULT_TIER",
    "DEFINITIONS",
    "TIERS",
    "MemoryKind",
    "Priority",
    "Tier",
    "TierDefinition",
    "accelerators_with",
    "batch_cap_problem",
    "memory_problem",
    "tier_problem",
]

Tier = Literal["batched", "premium", "wafer-scale"]
#: Admission priority: lower is served first and shed last.
Priority = Literal["premium", "standard", "flex"]


@dataclass(frozen=True, slots=True)
class TierDefinition:
    """One tier: what its pools promise and how requests and replies name it."""

    name: Tier
    #: What it serves, in a few words (the CRD's description of `spec.tier`).
    summary: str
    #: The largest `batching.maxNumSeqs` its pools may have (None: any).
    max_num_seqs: int | None = None
    #: Where its pools' accelerators must hold the weights (None: anywhere).
    memory_kind: MemoryKind | None = None
    #: Selected by Anthropic's `"speed": "fast"`.
    speed_fast: bool = False
    #: OpenAI's `service_tier` value that selects it, and what its replies say in that field.
    openai_service_tier: str | None = None
    reply_service_tier: str = "default"
    #: Admission priority of its requests (flex is asked for per request).
    priority: Priority = "standard"
    #: Selected for a model that only its pools serve (a distilled model of its own).
    by_model: bool = False
    #: Its weight in a mixed workload of every tier (`tiergate bench`'s default `--mix`); 0
    #: leaves it out of that mix.
    traffic_share: float = 0.0


DEFINITIONS: dict[Tier, TierDefinition] = {
    "batched": TierDefinition(
        "batched", "ordinary GPU serving, large continuous batches", traffic_share=0.6
    ),
    "premium": TierDefinition(
        "premium",
        "the same model with a small batch cap",
        max_num_seqs=16,
        speed_fast=True,
        openai_service_tier="priority",
        reply_service_tier="priority",
        priority="premium",
        traffic_share=0.3,
    ),
    "wafer-scale": TierDefinition(
        "wafer-scale",
        "a model held in the SRAM of wafer-scale chips",
        memory_kind="sram",
        by_model=True,
        traffic_share=0.1,
    ),
}
#: Every tier, in the order lists of them are shown and tried.
TIERS: tuple[Tier, ...] = tuple(DEFINITIONS)
#: The tier of a request that asks for none.
DEFAULT_TIER: Tier = "batched"


def tier_problem(
    tier: Tier,
    max_num_seqs: int,
    accelerator: str,
    inline_memory_kind: MemoryKind | None,
    catalog: Catalog,
) -> str | None:
    """What is wrong with a pool of `tier` with this batch cap on this accelerator (named in
    `catalog`, or described inline with `inline_memory_kind`), or None: the sentences
    `kubectl apply` gives for the CRD's CEL rules (operator/crd.py `tier_rules`)."""
    definition = DEFINITIONS[tier]
    if definition.max_num_seqs is not None and max_num_seqs > definition.max_num_seqs:
        return batch_cap_problem(tier)
    kind = definition.memory_kind
    if kind is not None:
        known = catalog.accelerators.get(accelerator)
        has = inline_memory_kind or (known.memory_kind if known is not None else None)
        if has != kind:
            return memory_problem(tier, catalog)
    return None


def batch_cap_problem(tier: Tier) -> str | None:
    """What is wrong with a pool of `tier` whose batch cap is over the tier's, or None for a
    tier with no cap."""
    cap = DEFINITIONS[tier].max_num_seqs
    if cap is None:
        return None
    return f"{tier} pools serve a small batch: set spec.batching.maxNumSeqs to {cap} or less"


def memory_problem(tier: Tier, catalog: Catalog) -> str | None:
    """What is wrong with a pool of `tier` on an accelerator that does not hold weights in the
    tier's memory, or None for a tier with no such rule."""
    kind = DEFINITIONS[tier].memory_kind
    if kind is None:
        return None
    names = ", ".join(accelerators_with(catalog, kind))
    others = " or ".join(k.upper() for k in get_args(MemoryKind) if k != kind)
    return (
        f"{tier} pools need an {kind.upper()} accelerator ({names}, or an "
        f"acceleratorProfile with memoryKind {kind}); spec.accelerator keeps weights in {others}"
    )


def accelerators_with(catalog: Catalog, kind: MemoryKind) -> list[str]:
    """The names of the catalog's accelerators that hold weights in `kind` memory, sorted."""
    return sorted(a.name for a in catalog.accelerators.values() if a.memory_kind == kind)
