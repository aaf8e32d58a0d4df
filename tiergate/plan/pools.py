"""The plan as InferencePools: one manifest per planned tier, ready for `kubectl apply`.

Each manifest is built as a plain dict (only the fields the plan sets, so the YAML reads like
the examples) and validated with the operator's `InferencePool` model before it is written:
what the planner emits, the operator and its CRD accept.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tiergate.pools import API_VERSION, KIND, InferencePool
from tiergate.pools.engines import DEFAULT_ENGINE

from .errors import PlanError
from .report import PlanReport, TierPlan

__all__ = ["pool_manifest", "write_pools"]


def pool_manifest(plan_name: str, tier: TierPlan, autoscale: bool = False) -> dict[str, Any]:
    """The InferencePool of a met tier's plan (validated: a ValidationError is a bug here).
    With `autoscale`, its replicas follow the load from 1 to the planned count (the plan is
    sized for the plan's rates: the most the pool should need)."""
    if tier.plan is None:
        raise ValueError(f"tier {tier.tier} has no plan to emit")
    c = tier.plan.configuration
    batching = {"maxNumSeqs": c.max_num_seqs, "maxBatchedTokens": c.max_batched_tokens}
    spec: dict[str, Any] = {
        "tier": tier.tier,
        **({} if tier.engine == DEFAULT_ENGINE else {"engine": tier.engine}),
        "model": c.model,
        "accelerator": c.accelerator,
        "chips": c.chips,
        "tensorParallel": c.tensor_parallel,
        "weightDtype": c.weight_dtype,
        "kvDtype": c.kv_dtype,
        "batching": batching,
        "replicas": tier.plan.replicas,
        "workload": {
            "inputTokens": tier.mean_prompt_tokens,
            "cachedInputTokens": tier.mean_cached_prompt_tokens,
            "outputTokens": tier.mean_output_tokens,
        },
        "slo": {"ttftMs": tier.slo_ttft_ms, "tpotMs": tier.slo_tpot_ms},
    }
    if autoscale:
        spec["autoscaling"] = {"minReplicas": 1, "maxReplicas": tier.plan.replicas}
    if c.draft_model is not None:
        spec["speculativeDecoding"] = {
            "draftModel": c.draft_model,
            "tokens": c.speculative_tokens,
            "acceptanceRate": c.acceptance_rate,
        }
    manifest = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": f"{plan_name}-{tier.tier}",
            "labels": {"tiergate.dev/plan": plan_name},
        },
        "spec": spec,
    }
    InferencePool.model_validate(manifest)
    return manifest


def write_pools(report: PlanReport, folder: Path, autoscale: bool = False) -> list[Path]:
    """One `<name>-<tier>.yaml` per met tier in `folder` (created); the paths written.
    `autoscale`: see `pool_manifest`."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PlanError(f"cannot create {str(folder)!r}: {exc.strerror or exc}") from None
    written = []
    for tier in report.tiers:
        if tier.plan is None:
            continue
        manifest = pool_manifest(report.name, tier, autoscale)
        path = folder / f"{manifest['metadata']['name']}.yaml"
        header = f"# Planned by `tiergate plan` ({report.name}): {tier.verdict}\n"
        body = yaml.safe_dump(manifest, sort_keys=False)
        try:
            path.write_text(header + body, encoding="utf-8")
        except OSError as exc:
            raise PlanError(f"cannot write {str(path)!r}: {exc.strerror or exc}") from None
        written.append(path)
    return written
