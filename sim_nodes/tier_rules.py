"""The tiers' rules that read the hardware catalog: which accelerators hold weights where a
tier needs them, and what is wrong with a pool that breaks its tier's rules (the sentences
`kubectl apply` gives for the CRD's CEL rules). The tiers themselves are
tiergate/common/tiers.py."""

from __future__ import annotations

from typing import get_args

from tiergate.common.memory import MemoryKind
from tiergate.common.tiers import DEFINITIONS, Tier, batch_cap_problem

from .catalogs import Catalog

__all__ = ["accelerators_with", "memory_problem", "tier_problem"]


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
