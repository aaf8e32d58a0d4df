"""The engine rules: a real engine runs on GPUs only (never on wafer-scale or LPU chips), loads
real weights (in a dtype it makes of them, or from a checkpoint stored so) and keeps its KV
cache in a dtype it has. Pool files (pydantic) and `kubectl apply`
(the CRD's CEL rules, generated from the same table) refuse the same pools with the same
sentence."""

from __future__ import annotations

from typing import Any

import pytest
from crd_helpers import assert_refused_alike, generated_crd, problems, pydantic_says, schema_of

from tiergate.operator.crd import engine_rules
from tiergate.pools import ENGINES
from tiergate.pools.engines import (
    kv_dtype_problem,
    memory_kind_problem,
    weight_dtype_problem,
    weights_problem,
)
from tiergate.sim_nodes.catalogs import default_catalog

CATALOG = default_catalog()


@pytest.fixture(scope="module")
def crd() -> dict[str, Any]:
    return generated_crd()


def pool(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "tiergate.dev/v1alpha1",
        "kind": "InferencePool",
        "metadata": {"name": "p"},
        "spec": {"tier": "batched", "model": "llama-3.1-8b", "accelerator": "h100-sxm", **spec},
    }


def wafer(**spec: Any) -> dict[str, Any]:
    return pool(**{"tier": "wafer-scale", "model": "frontier-spark", "accelerator": "wse-3",
                   **spec})  # fmt: skip


INLINE_GPU = {
    **default_catalog().accelerator("h100-sxm").model_dump(by_alias=True, exclude_none=True),
    "name": "lab-gpu",
}
INLINE_MODEL = {
    **default_catalog()
    .model("llama-3.1-8b")
    .model_dump(by_alias=True, exclude_none=True, exclude={"hugging_face_id"}),
    "name": "team-8b",
}
SPECULATIVE = {"draftModel": "llama-3.2-1b", "tokens": 4, "acceptanceRate": 0.7}

CASES: list[tuple[str, dict[str, Any], str | None]] = [
    ("wafer-scale vllm", wafer(engine="vllm"), memory_kind_problem("vllm", CATALOG)),
    ("wafer-scale sglang", wafer(engine="sglang"), memory_kind_problem("sglang", CATALOG)),
    ("wafer-scale sim", wafer(engine="sim"), None),
    ("wafer-scale, engine left out", wafer(), None),
    ("lpu vllm", pool(accelerator="groq-lpu", engine="vllm"), memory_kind_problem("vllm", CATALOG)),
    ("inline gpu vllm", pool(accelerator="lab-gpu", acceleratorProfile=INLINE_GPU, engine="vllm"),
     None),
    ("inline sram vllm",
     pool(accelerator="lab-gpu", acceleratorProfile={**INLINE_GPU, "memoryKind": "sram"},
          engine="vllm"),
     memory_kind_problem("vllm", CATALOG)),
    ("h100 vllm", pool(engine="vllm"), None),
    ("h100 sglang", pool(engine="sglang"), None),
    ("no weights", pool(model="frontier", chips=8, engine="vllm"),
     weights_problem("vllm", CATALOG)),
    ("weights on a volume", pool(model="frontier", chips=8, engine="vllm",
                                 modelSource="/model-cache/frontier"), None),
    ("inline model without weights",
     pool(model="team-8b", modelProfile=INLINE_MODEL, engine="sglang"),
     weights_problem("sglang", CATALOG)),
    ("inline model with weights",
     pool(model="team-8b", modelProfile={**INLINE_MODEL, "huggingFaceId": "team/8b"},
          engine="sglang"),
     None),
    ("draft with weights", pool(model="llama-3.1-70b", engine="vllm",
                                speculativeDecoding=SPECULATIVE), None),
    ("draft without weights",
     pool(model="llama-3.1-70b", engine="vllm", modelSource="/w",
          speculativeDecoding={**SPECULATIVE, "draftModel": "frontier-spark"}),
     weights_problem("vllm", CATALOG)),
    ("int8 kv cache", pool(engine="vllm", kvDtype="int8"), kv_dtype_problem("vllm")),
    ("fp8 kv cache", pool(engine="sglang", kvDtype="fp8"), None),
    ("int8 kv cache on the sim", pool(engine="sim", kvDtype="int8"), None),
    ("int8 weights from the bf16 checkpoint", pool(engine="vllm", weightDtype="int8"),
     weight_dtype_problem("vllm")),
    ("fp4 weights from the bf16 checkpoint", pool(engine="sglang", weightDtype="fp4"),
     weight_dtype_problem("sglang")),
    ("int8 weights from an int8 checkpoint",
     pool(engine="vllm", weightDtype="int8", modelSource="/model-cache/llama-8b-w8a8"), None),
    ("fp8 weights quantized as they load", pool(engine="vllm", weightDtype="fp8"), None),
    ("fp4 weights on the sim", pool(engine="sim", weightDtype="fp4"), None),
]  # fmt: skip


@pytest.mark.parametrize(("obj", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_pool_files_and_kubectl_apply_refuse_the_same_pools_alike(
    crd: dict[str, Any], obj: dict[str, Any], expected: str | None
) -> None:
    assert_refused_alike(pydantic_says(obj), problems(crd, obj), expected)


def test_a_wafer_scale_vllm_pool_is_refused_with_the_reason() -> None:
    said = memory_kind_problem("vllm", CATALOG)
    assert said is not None
    assert "runs on GPUs" in said and "wse-3" in said and "groq-lpu" in said
    assert "SRAM" in said and "engine sim" in said


def test_every_engine_rule_of_the_table_is_in_the_crd(crd: dict[str, Any]) -> None:
    spec = schema_of(crd)["properties"]["spec"]
    stated = [r["message"] for r in spec["x-kubernetes-validations"]]
    for engine in ENGINES.values():
        for problem in (
            memory_kind_problem(engine.name, CATALOG),
            weights_problem(engine.name, CATALOG),
            weight_dtype_problem(engine.name),
            kv_dtype_problem(engine.name),
        ):
            assert problem is None or problem in stated, problem
    assert spec["properties"]["engine"]["enum"] == list(ENGINES)
    # vllm and sglang: memory, weights, weight dtype, KV dtype
    assert len(engine_rules(CATALOG)) == 8


def test_an_unknown_engine_is_refused(crd: dict[str, Any]) -> None:
    assert any("'tgi' is not one of" in p for p in problems(crd, pool(engine="tgi")))
    assert pydantic_says(pool(engine="tgi")) is not None
