"""Layouts, fit logic and KV capacity."""

import pytest

from tiergate.sim_nodes.catalogs import Catalog
from tiergate.sim_nodes.perf import (
    Deployment,
    PerfConfigError,
    chips_to_hold,
    default_tensor_parallel,
)


def test_405b_does_not_fit_one_h100(catalog: Catalog) -> None:
    d = Deployment(catalog.model("llama-3.1-405b"), catalog.accelerator("h100-sxm"))
    assert not d.weights_fit
    assert d.kv_capacity_tokens == 0


def test_chips_to_hold_gpu_rounds_to_a_tensor_parallel_group(catalog: Catalog) -> None:
    # 70.55B x 2 bytes = 141 GB over ~70 GB usable per H100: 3 chips by memory, 4 as a TP group
    chips = chips_to_hold(catalog.model("llama-3.1-70b"), catalog.accelerator("h100-sxm"))
    assert chips == 4


def test_chips_to_hold_wafers_counts_kv_too(catalog: Catalog) -> None:
    m, a = catalog.model("llama-3.1-70b"), catalog.accelerator("wse-3")
    assert chips_to_hold(m, a) == 4  # 141 GB over 41.3 GB of usable SRAM each
    more = chips_to_hold(m, a, kv_tokens=200_000)
    assert more > 4


def test_sram_chips_beyond_the_layer_count_become_tensor_parallel_groups(
    catalog: Catalog,
) -> None:
    m, a = catalog.model("llama-3.1-70b"), catalog.accelerator("groq-lpu")  # 230 MB per chip
    chips = chips_to_hold(m, a, weight_dtype="fp8")
    assert chips > m.layers
    tp = default_tensor_parallel(chips, m, a)
    d = Deployment(m, a, chips, tp, "fp8")
    assert tp > 1 and d.pipeline_stages <= m.layers and d.weights_fit


def test_chips_to_hold_what_nothing_holds_returns_the_largest_candidate(
    catalog: Catalog,
) -> None:
    m, a = catalog.model("llama-3.1-405b"), catalog.accelerator("a100-40gb")
    chips = chips_to_hold(m, a, kv_tokens=10**10)
    d = Deployment(m, a, chips, default_tensor_parallel(chips, m, a))
    assert chips == 128
    assert d.kv_capacity_tokens < 10**10


def test_kv_heads_are_replicated_beyond_their_count(catalog: Catalog) -> None:
    m, a = catalog.model("qwen3-235b-a22b"), catalog.accelerator("h200")  # 4 KV heads
    tp4 = Deployment(m, a, 4, 4, "fp8")
    tp8 = Deployment(m, a, 8, 8, "fp8")
    assert tp8.kv_bytes_per_token_per_chip == tp4.kv_bytes_per_token_per_chip


@pytest.mark.parametrize(
    ("chips", "tp", "message"),
    [
        (0, 1, "chips must be at least 1"),
        (4, 3, "must divide chips"),
        (6, 6, "must divide the 32 attention heads"),
        (64, 1, "pipeline stages exceed the 32 layers"),
    ],
)
def test_impossible_layouts_are_errors(catalog: Catalog, chips: int, tp: int, message: str) -> None:
    with pytest.raises(PerfConfigError, match=message):
        Deployment(catalog.model("llama-3.1-8b"), catalog.accelerator("h100-sxm"), chips, tp)


def test_default_layouts(catalog: Catalog) -> None:
    m = catalog.model("llama-3.1-70b")
    assert default_tensor_parallel(8, m, catalog.accelerator("h100-sxm")) == 8
    assert default_tensor_parallel(16, m, catalog.accelerator("h100-sxm")) == 8
    assert default_tensor_parallel(4, m, catalog.accelerator("wse-3")) == 1


def test_max_concurrency_divides_kv_capacity(catalog: Catalog) -> None:
    d = Deployment(catalog.model("llama-3.1-8b"), catalog.accelerator("h100-sxm"))
    assert d.max_concurrency(2048) == d.kv_capacity_tokens // 2048
    assert d.max_concurrency(4096) < d.max_concurrency(2048)
