"""`tiergate perf`: steady-state prediction for one configuration.

docs/performance-model.md describes the output and the `--json` fields.
"""

from __future__ import annotations

import argparse

from tiergate.common.cli import int_or, non_negative_int, positive_int

from ..catalogs import Accelerator, default_catalog
from ..perf import PerfResult, Workload, build_deployment, evaluate, unfit
from .serving_args import add_serving_arguments, short_of_context, spec_from_args


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_serving_arguments(p, max_num_seqs=None)
    p.add_argument(
        "--concurrency", type=int_or("max"), default=1, help="streams, or max (KV-limited)"
    )
    p.add_argument("--input-tokens", type=positive_int, default=1024)
    p.add_argument(
        "--cached-input-tokens", type=non_negative_int, default=0, help="prefix-cache hits"
    )
    p.add_argument("--output-tokens", type=positive_int, default=256)
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    catalog = default_catalog()
    concurrency = None if args.concurrency == "max" else args.concurrency
    workload = Workload(
        args.input_tokens, args.output_tokens, args.cached_input_tokens, concurrency
    )
    spec = spec_from_args(args)
    # SRAM chips hold KV too: size `auto` for the requested streams (one when `max`).
    kv_tokens = (concurrency or 1) * workload.tokens_per_sequence
    deployment = build_deployment(spec, catalog, kv_tokens=kv_tokens)
    result = evaluate(deployment, workload, spec.batching.to_batching())
    if result.fits and not deployment.holds_its_context:
        reason = short_of_context(deployment, spec)
        result = unfit(deployment, workload, reason, result.concurrency, result.max_concurrency)
    if args.json:
        print(result.model_dump_json(indent=2))
    else:
        print(render(result))
        print(
            parameter_sources(
                deployment.accelerator, fitted_parameters(deployment.accelerator.name)
            )
        )
    return 0


#: Where each accelerator figure the step uses comes from.
_SPEC_SHEET = {
    "memory_bandwidth_tb_per_s": "memory bandwidth, TB/s",
    "peak_tflops": "dense peak, TFLOP/s",
    "interconnect_gb_per_s": "chip-to-chip bandwidth, GB/s",
    "memory_gb": "memory per chip, GB",
}


def fitted_parameters(accelerator: str) -> dict[str, int]:
    """Accelerator fields fitted by `tiergate calibrate`, with the rows that see each."""
    from ..catalogs import default_catalog as _catalog
    from ..perf.calibration import shipped_measurements
    from ..perf.fitting import groups, sees

    catalog = _catalog()
    rows = [r for r in shipped_measurements() if r.active]
    out: dict[str, int] = {}
    for g in groups(catalog):
        for p in g.parameters:
            if accelerator in p.accelerators:
                out[p.field] = sum(sees(p, r, catalog) for r in rows)
    return out


def parameter_sources(a: Accelerator, fitted: dict[str, int]) -> str:
    """The accelerator's parameters and where each comes from."""
    lines = [f"\nparameters of {a.name} (sim_nodes/catalogs/accelerators.yaml):"]
    for field, label in _SPEC_SHEET.items():
        value = getattr(a, field)
        shown = (
            " ".join(f"{k} {v:g}" for k, v in value.items())
            if isinstance(value, dict)
            else f"{value:g}"
        )
        lines.append(f"  {label:<34} {shown:>14}  vendor spec sheet")
    for field in (
        "memory_bandwidth_efficiency",
        "compute_efficiency",
        "fp4_compute_efficiency",
        "grouped_gemm_efficiency",
        "step_overhead_us",
        "layer_latency_us",
        "interconnect_latency_us",
    ):
        if field == "fp4_compute_efficiency":
            if "fp4" not in a.peak_tflops:
                continue  # no fp4 units: fp4 weights compute at bf16
            value = a.compute_efficiency_for("fp4")
        else:
            value = getattr(a, field)
        if field in fitted:
            source = f"fitted by tiergate calibrate on {fitted[field]} published rows"
        elif field == "interconnect_latency_us":
            source = "published order of magnitude (see the catalog comment)"
        else:
            source = "catalog default, not fitted for this chip"
        lines.append(f"  {field:<34} {value:>14g}  {source}")
    return "\n".join(lines)


def render(r: PerfResult) -> str:
    """The human-readable report."""
    head = (
        f"{r.model} on {r.chips} x {r.accelerator} (tensor parallel {r.tensor_parallel}, "
        f"{r.pipeline_stages} pipeline stage{'s' if r.pipeline_stages > 1 else ''}), "
        f"weights {r.weight_dtype}, KV {r.kv_dtype}"
    )
    workload = (
        f"workload: {r.input_tokens} input tokens ({r.cached_input_tokens} cached), "
        f"{r.output_tokens} output, {r.concurrency} concurrent"
    )
    if not r.fits:
        return f"{head}\n{workload}\nfits: no: {r.reason}"
    s = r.decode_step
    lines = [
        head,
        workload,
        f"fits: yes; KV cache {r.kv_capacity_tokens:,} tokens = {r.max_concurrency} such sequences",
        "",
        f"  time to first token      {r.ttft_s * 1000:10.1f} ms",
        f"  time per output token    {r.tpot_s * 1000:10.2f} ms",
        f"  per-stream speed         {r.output_tokens_per_s_per_stream:10.1f} tok/s",
        f"  throughput               {r.throughput_output_tokens_per_s:10.1f} tok/s",
        f"  cost                     {r.cost_per_million_output_tokens_usd:10.2f} "
        f"$/1M output tokens  (${r.cost_per_hour_usd:.2f}/h)",
        f"  quality (tool calls)     {r.quality:10.2f}",
        "",
        f"decode step {s.total_s * 1000:.2f} ms "
        f"({s.bound}-bound, {r.running_sequences} sequences):",
    ]
    terms = [
        ("weight read", s.weight_read_s),
        ("matmul compute", s.matmul_compute_s),
        (f"expert GEMMs (x{s.expert_imbalance:.2f} load)", s.expert_gemm_s),
        ("KV cache read", s.kv_read_s),
        ("attention compute", s.attention_compute_s),
        ("tensor-parallel comm", s.communication_s),
        ("  of which expert all-to-all", s.expert_all_to_all_s),
        ("per-layer latency", s.layer_latency_s),
        ("pipeline hops", s.pipeline_hop_s),
        ("speculative draft", s.speculative_draft_s),
        ("engine overhead", s.overhead_s),
    ]
    lines += [f"  {name:<28} {sec * 1000:10.3f} ms" for name, sec in terms if sec > 0]
    lines.append(
        "  (weights vs matmuls and KV vs attention overlap: the larger of each pair counts)"
    )
    if r.running_sequences > 1:
        lines.append(
            f"each prefill delays the other streams by {r.prefill_interference_s * 1000:.1f} ms"
        )
    return "\n".join(lines)
