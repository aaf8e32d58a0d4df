"""Each step-time term, in isolation and in how it moves."""

import pytest

from tiergate.sim_nodes.catalogs import Catalog
from tiergate.sim_nodes.perf import Deployment, Speculative, step_terms, touched_expert_fraction


def llama8b(catalog: Catalog, **kw: object) -> Deployment:
    return Deployment(catalog.model("llama-3.1-8b"), catalog.accelerator("h100-sxm"), **kw)  # type: ignore[arg-type]


def test_batch_one_decode_streams_the_weights(catalog: Catalog) -> None:
    d = llama8b(catalog)
    t = step_terms(d, decode_seqs=1, decode_context_tokens=1000)
    a = d.accelerator
    streamed = (d.model.total_params_b * 1e9 - d.model.embedding_params) * 2
    assert t.weight_bytes == pytest.approx(streamed)
    bandwidth = a.memory_bandwidth_bytes_per_s * a.memory_bandwidth_efficiency
    assert t.weight_read_s == pytest.approx(streamed / bandwidth)
    assert t.bound == "memory"
    assert t.total_s == pytest.approx(t.roofline_s + t.overhead_s)


def test_kv_read_grows_with_batch_and_context(catalog: Catalog) -> None:
    d = llama8b(catalog)
    small = step_terms(d, decode_seqs=8, decode_context_tokens=8 * 1000)
    longer = step_terms(d, decode_seqs=8, decode_context_tokens=8 * 8000)
    bigger = step_terms(d, decode_seqs=64, decode_context_tokens=64 * 1000)
    assert longer.kv_read_s > small.kv_read_s
    assert bigger.kv_read_s > small.kv_read_s
    assert bigger.weight_read_s == small.weight_read_s  # weights are read once per step


def test_big_prefill_is_compute_bound(catalog: Catalog) -> None:
    t = step_terms(llama8b(catalog), prefill_tokens=8192, prefill_attended_positions=8192 * 4096)
    assert t.bound == "compute"
    assert t.matmul_compute_s > t.weight_read_s


def test_fp8_weights_halve_the_weight_read(catalog: Catalog) -> None:
    bf16 = step_terms(llama8b(catalog), decode_seqs=1, decode_context_tokens=100)
    fp8 = step_terms(llama8b(catalog, weight_dtype="fp8"), decode_seqs=1, decode_context_tokens=100)
    assert fp8.weight_read_s == pytest.approx(bf16.weight_read_s / 2)


def test_tensor_parallel_divides_bytes_and_adds_allreduces(catalog: Catalog) -> None:
    m, a = catalog.model("llama-3.1-70b"), catalog.accelerator("h100-sxm")
    tp2 = step_terms(Deployment(m, a, 2, 2), decode_seqs=1, decode_context_tokens=100)
    tp8 = step_terms(Deployment(m, a, 8, 8), decode_seqs=1, decode_context_tokens=100)
    assert tp8.weight_read_s == pytest.approx(tp2.weight_read_s / 4)
    assert tp8.communication_s > tp2.communication_s > 0
    # 80 layers x 2 all-reduces, each at least the link latency
    assert tp8.communication_s >= 160 * a.interconnect_latency_s


def test_moe_reads_only_the_experts_a_batch_touches(catalog: Catalog) -> None:
    assert touched_expert_fraction(128, 8, 1) == pytest.approx(8 / 128)
    assert touched_expert_fraction(128, 8, 1000) == pytest.approx(1.0)
    assert touched_expert_fraction(1, 1, 5) == 1.0
    d = Deployment(catalog.model("qwen3-235b-a22b"), catalog.accelerator("h200"), 4, 4, "fp8")
    one = step_terms(d, decode_seqs=1, decode_context_tokens=100)
    many = step_terms(d, decode_seqs=256, decode_context_tokens=256 * 100)
    assert many.weight_bytes > 5 * one.weight_bytes
    # compute follows the active parameters, not the touched ones
    assert many.matmul_compute_s == pytest.approx(256 * one.matmul_compute_s, rel=0.01)


def test_sram_wafer_is_latency_bound(catalog: Catalog) -> None:
    d = Deployment(catalog.model("llama-3.1-8b"), catalog.accelerator("wse-3"))
    t = step_terms(d, decode_seqs=1, decode_context_tokens=1000)
    assert t.bound == "latency"
    assert t.layer_latency_s == pytest.approx(32 * d.accelerator.layer_latency_s)
    assert t.pipeline_hop_s == 0


def test_pipeline_stages_add_hops(catalog: Catalog) -> None:
    m, a = catalog.model("llama-3.1-70b"), catalog.accelerator("wse-3")
    t = step_terms(Deployment(m, a, 4, 1), decode_seqs=1, decode_context_tokens=1000)
    assert t.pipeline_hop_s >= 3 * a.interconnect_latency_s


def test_speculative_decoding_costs_draft_steps(catalog: Catalog) -> None:
    draft = catalog.model("llama-3.1-8b")
    spec = Speculative(tokens=4, acceptance_rate=0.7, draft=draft)
    assert spec.tokens_per_step == pytest.approx((1 - 0.7**5) / (1 - 0.7))
    m, a = catalog.model("llama-3.1-70b"), catalog.accelerator("h100-sxm")
    plain = step_terms(Deployment(m, a, 4, 4), decode_seqs=1, decode_context_tokens=1000)
    sd = step_terms(
        Deployment(m, a, 4, 4, speculative=spec), decode_seqs=1, decode_context_tokens=1000
    )
    assert sd.speculative_draft_s > 0
    assert sd.tokens == 5
    assert sd.total_s > plain.total_s
    # ...but fewer seconds per emitted token at batch 1
    assert sd.total_s / spec.tokens_per_step < plain.total_s


def test_empty_step_costs_nothing(catalog: Catalog) -> None:
    assert step_terms(llama8b(catalog)).total_s == 0
