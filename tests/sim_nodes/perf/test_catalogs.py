"""The catalogs: contract names, derived quantities, user files and their errors."""

from pathlib import Path

import pytest

from tiergate.sim_nodes.catalogs import Catalog, CatalogError, default_catalog, load_catalog

ACCELERATORS = {"a100-40gb", "a100-80gb", "h100-sxm", "h200", "b200", "wse-3", "groq-lpu"}
MODELS = {
    "llama-3.1-8b",
    "llama-3.1-70b",
    "llama-3.3-70b",
    "llama-3.1-405b",
    "mixtral-8x7b",
    "qwen3-235b-a22b",
    "gpt-oss-120b",
    "frontier",
    "frontier-spark",
}


def test_contract_names_are_present() -> None:
    catalog = default_catalog()
    assert ACCELERATORS <= set(catalog.accelerators)
    assert MODELS <= set(catalog.models)


def test_sram_chips_are_marked_sram() -> None:
    catalog = default_catalog()
    kinds = {name: catalog.accelerator(name).memory_kind for name in ACCELERATORS}
    assert kinds["wse-3"] == kinds["groq-lpu"] == "sram"
    assert {k for k, v in kinds.items() if v == "hbm"} == ACCELERATORS - {"wse-3", "groq-lpu"}


def test_distilled_model_is_lower_quality_than_its_teacher() -> None:
    catalog = default_catalog()
    spark = catalog.model("frontier-spark")
    assert spark.distilled_from == "frontier"
    assert spark.quality < catalog.model("frontier").quality


def test_moe_parameters_add_up() -> None:
    m = default_catalog().model("mixtral-8x7b")
    total = m.shared_params + m.experts * m.expert_params + m.embedding_params
    active = m.shared_params + m.experts_per_token * m.expert_params + m.embedding_params
    assert total == pytest.approx(m.total_params_b * 1e9)
    assert active == pytest.approx(m.active_params_b * 1e9)


def test_kv_bytes_per_token_of_llama_8b() -> None:
    # 2 (K and V) x 32 layers x 8 KV heads x 128 dims x 2 bytes = 128 KiB
    assert default_catalog().model("llama-3.1-8b").kv_bytes_per_token(2.0) == 131072


def test_unknown_names_list_the_choices() -> None:
    with pytest.raises(CatalogError, match="unknown model 'gpt-9'.*llama-3.1-8b"):
        default_catalog().model("gpt-9")
    with pytest.raises(CatalogError, match="unknown accelerator 'tpu'.*h100-sxm"):
        default_catalog().accelerator("tpu")


def test_user_file_adds_and_overrides(tmp_path: Path) -> None:
    f = tmp_path / "mine.yaml"
    f.write_text(
        """
accelerators:
  - name: h100-sxm
    memory_kind: hbm
    memory_gb: 80
    memory_bandwidth_tb_per_s: 3.35
    peak_tflops: {bf16: 989}
    interconnect_gb_per_s: 900
    interconnect_latency_us: 8
    chips_per_system: 8
    price_per_chip_hour_usd: 1.50
    memory_bandwidth_efficiency: 0.8
    compute_efficiency: 0.5
    step_overhead_us: 800
    layer_latency_us: 0
    usable_memory_fraction: 0.9
    activation_reserve_gb: 2
models:
  - {name: tiny, layers: 2, hidden_size: 64, heads: 4, kv_heads: 2, head_dim: 16,
     vocab_size: 1000, total_params_b: 0.001, active_params_b: 0.001,
     max_context_tokens: 2048, quality: 0.5}
"""
    )
    catalog = load_catalog([f])
    assert catalog.accelerator("h100-sxm").price_per_chip_hour_usd == 1.50
    assert catalog.model("tiny").layers == 2
    assert "llama-3.1-8b" in catalog.models


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("models: [{name: x}]", r"models\.0\.layers: Field required"),
        ("accelerators: 3", "accelerators: Input should be a valid list"),
        ("models: [\n  - {name: [}", "not valid YAML"),
        ("colours: []", "colours: Extra inputs are not permitted"),
    ],
)
def test_bad_user_files_name_the_problem(tmp_path: Path, content: str, message: str) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(content)
    with pytest.raises(CatalogError, match=message):
        load_catalog([f])


def test_missing_user_file_is_a_catalog_error(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match="cannot read catalog file"):
        load_catalog([tmp_path / "nope.yaml"])


def test_fp4_matmuls_have_a_compute_efficiency_of_their_own(catalog: Catalog) -> None:
    """Only fp4 weights on a chip with fp4 units use it; without the units fp4 computes at bf16
    with the chip's ordinary efficiency."""
    b200, h100 = catalog.accelerator("b200"), catalog.accelerator("h100-sxm")
    assert b200.fp4_compute_efficiency is not None
    assert b200.compute_efficiency_for("fp4") == b200.fp4_compute_efficiency
    assert b200.compute_efficiency_for("fp8") == b200.compute_efficiency
    with_fp4 = h100.model_copy(update={"fp4_compute_efficiency": 0.1})
    assert with_fp4.compute_efficiency_for("fp4") == h100.compute_efficiency
