"""A pool's context: the longest request its engine serves (spec.maxContextTokens, else the
model's), said on the engine's command line, admitted by the router, and held by a GPU
replica's KV cache (vLLM refuses to start without room for one whole sequence)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from tiergate.operator.engine_args import sglang_args, vllm_args
from tiergate.operator.status import assess
from tiergate.pools import InferencePoolSpec, Layout, predict
from tiergate.router.config import parse_config
from tiergate.router.discovery.view import build_view
from tiergate.sim_nodes.catalogs import default_catalog

CATALOG = default_catalog()
#: Qwen3-32B on one H100: its weights leave room for a batch of short requests, not for one
#: sequence of its 40,960-token context.
TIGHT: dict[str, Any] = {
    "tier": "premium",
    "engine": "vllm",
    "model": "qwen3-32b",
    "accelerator": "h100-sxm",
    "chips": 1,
    "batching": {"maxNumSeqs": 1, "maxBatchedTokens": 8192},
    "workload": {"inputTokens": 2048, "outputTokens": 256},
}


def spec(**changes: Any) -> InferencePoolSpec:
    return InferencePoolSpec.model_validate({**TIGHT, **changes})


def test_a_gpu_replica_short_of_one_whole_context_does_not_fit_and_says_why() -> None:
    assessment = assess(spec(), CATALOG)
    assert assessment.envelope is None
    assert assessment.misfit is not None
    assert "less than one sequence of the 40,960-token context" in assessment.misfit
    assert "shorter spec.maxContextTokens" in assessment.misfit
    # The same replica with a context its KV cache holds fits, and serves that context.
    shorter = spec(maxContextTokens=4096)
    fits = assess(shorter, CATALOG)
    assert fits.envelope is not None and fits.misfit is None, fits
    for args, flag in ((vllm_args(shorter, Layout(1, 1)), "--max-model-len"),
                       (sglang_args(shorter, Layout(1, 1)), "--context-length")):  # fmt: skip
        assert args[args.index(flag) + 1] == "4096", args


def test_chips_auto_takes_the_chips_one_whole_context_needs() -> None:
    whole = predict(spec(chips="auto"), spec().workload, CATALOG)
    assert whole.result.fits
    assert whole.deployment.kv_capacity_tokens >= 40_960
    shorter = predict(spec(chips="auto", maxContextTokens=4096), spec().workload, CATALOG)
    assert shorter.result.fits
    assert shorter.deployment.chips < whole.deployment.chips


def test_a_context_longer_than_the_model_s_is_an_invalid_spec() -> None:
    # Qwen3's model card's 131,072 needs YaRN, which no pool renders.
    problem = assess(spec(maxContextTokens=131_072), CATALOG).problem
    assert problem is not None
    assert "maxContextTokens 131072 is more than the 40960-token context of qwen3-32b" in problem


def test_a_workload_longer_than_the_context_is_an_invalid_spec() -> None:
    problem = assess(spec(maxContextTokens=2000), CATALOG).problem
    assert problem is not None and "exceed the 2000-token context" in problem, problem


def test_a_hosted_pool_states_its_provider_s_context_on_its_endpoint() -> None:
    hosted = {
        "tier": "batched",
        "model": "llama-3.1-70b",
        "endpoint": {"url": "https://api.example.com/v1", "model": "m",
                     "apiKeySecretRef": {"name": "k", "key": "k"}},
        "billing": {"outputPerMillionUsd": 1},
        "maxContextTokens": 4096,
    }  # fmt: skip
    with pytest.raises(ValidationError) as refused:
        InferencePoolSpec.model_validate(hosted)
    assert "the provider's context is spec.endpoint.maxContextTokens" in str(refused.value)


def test_the_router_bounds_a_request_s_cost_by_the_pool_s_context(tmp_path: Path) -> None:
    def pool(name: str, context: str) -> str:
        return (
            f"  - {{name: {name}, tier: batched, model: llama-3.1-8b, accelerator: h100-sxm, "
            f"endpoints: ['http://10.0.0.1:8000'], servedModelName: {name}{context}}}\n"
        )

    config = parse_config(
        "router: {}\npools:\n" + pool("whole", "") + pool("short", ", maxContextTokens: 4096")
    )
    view = build_view(config.pools, CATALOG)
    assert view.pools["whole"].max_context_tokens == 131_072
    assert view.pools["short"].max_context_tokens == 4096
    # A request that sets no output cap may fill the context: its budget hold says so.
    per_token = view.pools["short"].output_price_per_token_usd
    assert view.most_cost_usd("short", "batched", 10, None) == pytest.approx(
        10 * view.pools["short"].input_price_per_token_usd + 4096 * per_token
    )


def test_background_sequences_longer_than_the_context_are_an_invalid_spec() -> None:
    """A sim pool's background load is sequences the engine keeps decoding: none may be longer
    than the context the pool serves."""
    background = {"sequences": 2, "contextTokens": 8000}
    sim = {"engine": "sim", "chips": 2, "batching": {"maxNumSeqs": 8}, "background": background}
    assert assess(spec(**sim), CATALOG).problem is None
    problem = assess(spec(**sim, maxContextTokens=4096), CATALOG).problem
    assert problem is not None
    assert "background sequences of 8000 tokens exceed the 4096-token context" in problem
