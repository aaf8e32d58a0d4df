"""`tiergate plan` for a real engine: a tier planned for vLLM or SGLang keeps to what the
engine runs (GPUs, a replica within one system, its dtypes, a model with published weights),
and the pools it writes name the engine and are ones the operator runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from crd_helpers import generated_crd, problems
from plan_helpers import parsed, tiny_plan, write_plan

from tiergate.cli import main
from tiergate.operator.status import assess
from tiergate.plan import PlanReport, plan_traffic
from tiergate.plan.space import candidates
from tiergate.pools import InferencePool, ReferenceWorkload, predict
from tiergate.sim_nodes.catalogs import default_catalog


def space(data: dict[str, Any], tier: str = "batched") -> list[Any]:
    plan = parsed(data)
    traffic = plan_traffic(plan, Path("."))[tier]  # type: ignore[index]
    return list(
        candidates(
            tier,  # type: ignore[arg-type]
            plan.tiers[tier],  # type: ignore[index]
            plan.search,
            default_catalog(),
            tokens_per_request=traffic.shape.tokens_per_sequence,
            longest_request=traffic.longest_tokens,
        )
    )


def seventy_b(**tier: Any) -> dict[str, Any]:
    """Llama 3.1 70B on 40 GB A100s: the weights alone take four in bf16, and the search goes
    up to four times the fewest chips, past the eight of one system."""
    data = tiny_plan(model="llama-3.1-70b", **tier)
    data["search"].update(
        accelerators=["a100-40gb"], weightDtypes=["bf16", "fp8", "int8"], kvDtypes=["bf16", "int8"]
    )
    data["search"]["maxChipMultiple"] = 4
    return data


def test_a_real_engine_s_space_keeps_to_one_system_and_its_dtypes() -> None:
    simulated = space(seventy_b())
    assert max(c.chips for c in simulated) > 8  # the sim node's pools may span systems
    assert {c.weight_dtype for c in simulated} == {"bf16", "fp8", "int8"}
    for engine in ("vllm", "sglang"):
        real = space(seventy_b(engine=engine))
        assert real, engine
        assert max(c.chips for c in real) <= 8, engine
        assert {c.weight_dtype for c in real} == {"bf16", "fp8"}, engine
        assert {c.kv_dtype for c in real} == {"bf16"}, engine
        assert {str(c) for c in real} <= {str(c) for c in simulated}, engine


def test_a_gpu_layout_holds_one_sequence_of_the_model_s_whole_context() -> None:
    """Qwen3-32B on an H100: one chip holds the weights and a batch of short requests, not one
    40,960-token sequence, so vLLM would not start on it and the operator refuses it."""
    layouts = space(tiny_plan(model="qwen3-32b", engine="vllm"))
    assert layouts and min(c.chips for c in layouts) == 2
    for c in layouts:
        assert predict(c.serving_spec(), ReferenceWorkload(), default_catalog()).result.fits, c


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["plan", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.slow
def test_pools_planned_for_vllm_name_it_and_the_operator_runs_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pools = tmp_path / "pools"
    plan = write_plan(tmp_path, tiny_plan(engine="vllm"))
    code, out, err = run(capsys, str(plan), "--json", "--emit-pools", str(pools))
    assert code == 0, err
    tier = PlanReport.model_validate(json.loads(out)).tiers[0]
    assert tier.engine == "vllm" and tier.plan is not None
    manifest = yaml.safe_load((pools / "tiny-batched.yaml").read_text(encoding="utf-8"))
    assert manifest["spec"]["engine"] == "vllm"
    assert problems(generated_crd(), manifest) == []
    assessment = assess(InferencePool.model_validate(manifest).spec, default_catalog())
    assert assessment.problem is None and assessment.envelope is not None

    code, out, err = run(capsys, str(plan))
    assert code == 0 and "tier batched: llama-3.1-8b on vllm at" in out, out


def with_search(data: dict[str, Any], **search: Any) -> dict[str, Any]:
    data["search"].update(search)
    return data


BAD: dict[str, tuple[dict[str, Any], str]] = {
    "no published weights": (
        tiny_plan(model="frontier", engine="vllm"),
        "engine vllm loads real weights, and the catalog has none for frontier (no Hugging "
        "Face id): plan one of ",
    ),
    "a wafer-scale tier": (
        {**tiny_plan(), "tiers": {"wafer-scale": tiny_plan(engine="sglang")["tiers"]["batched"]}},
        "tiers.wafer-scale: wafer-scale pools run on SRAM accelerators and engine sglang on HBM "
        "ones (GPUs): plan this tier with engine sim",
    ),
    "SRAM accelerators only": (
        with_search(tiny_plan(engine="vllm"), accelerators=["wse-3", "groq-lpu"]),
        "tiers.batched: engine vllm runs on GPUs (a100-40gb, a100-80gb, b200, h100-sxm, h200): "
        "search.accelerators names none",
    ),
    "a KV cache dtype it lacks": (
        with_search(tiny_plan(engine="vllm"), kvDtypes=["int8"]),
        "engine vllm keeps the KV cache in bf16 or fp8: search.kvDtypes names neither",
    ),
    "weights it cannot make": (
        with_search(tiny_plan(engine="sglang"), weightDtypes=["int8", "fp4"]),
        "engine sglang loads the published weights as bf16 or fp8: search.weightDtypes names "
        "neither",
    ),
    "a replica larger than one system": (
        tiny_plan(model="llama-3.1-405b", engine="vllm"),
        "tiers.batched: no configuration in the search: engine vllm runs a replica on one "
        "system of its accelerator, and no accelerator and weightDtype of the search holds "
        "llama-3.1-405b",
    ),
    "no such engine": (
        tiny_plan(engine="hosted"),
        "tiers.batched.engine: Input should be 'sim', 'vllm' or 'sglang'",
    ),
}


@pytest.mark.parametrize("data, expected", BAD.values(), ids=BAD.keys())
def test_a_tier_a_real_engine_cannot_serve_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], data: dict[str, Any], expected: str
) -> None:
    code, out, err = run(capsys, str(write_plan(tmp_path, data)))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("tiergate plan: error: "), err
    assert expected in err, err
