"""Time of one engine step, term by term (the roofline of ARCHITECTURE.md).

A step runs every scheduled sequence through all layers once: decoding sequences emit one token
(or verify `k+1` speculative ones), prefilling sequences push a chunk of their prompt. Per
pipeline stage the step costs

    max(weight bytes / (eta_m * BW), matmul flops / (eta_c * peak))     the weight matmuls
    + max(KV bytes / (eta_m * BW), attention flops / (eta_c * peak))    attention
    + all-reduces of tensor parallelism                                 communication
    + layers * per-layer latency                                        dataflow chips

The matmuls and attention are separate kernels that run one after the other, so each gets its
own roofline and the two add: a big decode batch is compute-bound in the matmuls while its
attention is still bound by reading the KV cache. (A single roofline over the whole step
overpredicts max-throughput serving by up to 70% against the calibration rows.)

and the whole step adds (stages - 1) chip-to-chip hops and the engine's fixed overhead. With
several stages the batch is split into micro-batches so all stages stay busy.

MoE models run their routed experts as a kernel of their own (a grouped GEMM) with its own
roofline, divided by the accelerator's `grouped_gemm_efficiency` and stretched by expert load
imbalance; under tensor parallelism the experts are spread over the group (expert parallel) and
each MoE layer's all-reduce becomes an all-to-all dispatch and combine of the routed tokens.

Every term is returned separately so a user can see *why* a configuration is fast or slow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .deployment import Deployment

#: Activations exchanged by tensor-parallel all-reduces are kept in 16-bit.
ACTIVATION_BYTES = 2.0
#: Two all-reduces per layer (after attention and after the MLP), as in Megatron-style TP.
ALLREDUCES_PER_LAYER = 2


@dataclass(frozen=True, slots=True)
class StepTerms:
    """One step's cost, with each term in seconds for the whole step (all stages)."""

    tokens: float  # tokens processed (decode + verification + prefill)
    weight_bytes: float  # weight bytes streamed per chip per stage pass
    kv_bytes: float  # KV cache bytes read and written per chip per stage pass
    flops: float  # FLOPs per chip per stage pass
    weight_read_s: float
    matmul_compute_s: float
    kv_read_s: float
    attention_compute_s: float
    roofline_s: float  # max(weights, matmuls) + max(KV, attention), over all stages
    communication_s: float  # tensor-parallel all-reduces
    layer_latency_s: float  # fixed per-layer latency (dataflow chips)
    pipeline_hop_s: float  # chip-to-chip hops between pipeline stages
    speculative_draft_s: float  # the draft model's proposals
    overhead_s: float  # engine scheduling, sampling, launches
    total_s: float
    expert_gemm_s: float = 0.0  # MoE expert kernels (part of roofline_s)
    expert_all_to_all_s: float = 0.0  # expert-parallel dispatch + combine (part of communication_s)
    expert_imbalance: float = 1.0  # busiest rank's expert load over the mean

    @property
    def memory_s(self) -> float:
        return self.weight_read_s + self.kv_read_s

    @property
    def compute_s(self) -> float:
        return self.matmul_compute_s + self.attention_compute_s

    @property
    def bound(self) -> str:
        """What limits this step: memory, compute or latency (hops, layers, overhead)."""
        fixed = self.layer_latency_s + self.pipeline_hop_s + self.overhead_s
        if fixed > self.roofline_s:
            return "latency"
        return "compute" if self.compute_s > self.memory_s else "memory"


def touched_expert_fraction(experts: int, experts_per_token: int, tokens: float) -> float:
    """Expected fraction of a layer's routed experts used by `tokens` tokens.

    Uniform routing: each token picks `experts_per_token` of `experts`, so an expert stays
    untouched with probability (1 - k/E)^tokens. A batch of one reads only the active experts;
    a big batch reads them all, which is why MoE models gain so much from small batches.
    """
    if experts <= 1 or tokens <= 0:
        return 1.0 if experts <= 1 else 0.0
    untouched: float = (1.0 - experts_per_token / experts) ** tokens
    return 1.0 - untouched


def expert_imbalance(assignments: float, ranks: int) -> float:
    """Busiest rank's share of routed token-expert assignments over the mean share.

    Uniform routing of `assignments` over `ranks` expert-parallel ranks: each rank's load is
    binomial, and the expected maximum of `ranks` such loads is about mean + sd * sqrt(2 ln r).
    Every rank waits for the busiest, so the expert kernels take this factor longer.
    """
    if ranks <= 1 or assignments <= 0:
        return 1.0
    share = 1.0 / ranks
    mean = assignments * share
    sd = math.sqrt(assignments * share * (1.0 - share))
    return min(1.0 + sd * math.sqrt(2.0 * math.log(ranks)) / mean, float(ranks))


def step_terms(
    d: Deployment,
    *,
    decode_seqs: int = 0,
    decode_context_tokens: float = 0.0,
    prefill_tokens: float = 0.0,
    prefill_prefix_tokens: float = 0.0,
    prefill_attended_positions: float = 0.0,
) -> StepTerms:
    """Cost of one step.

    decode_seqs: sequences emitting a token this step.
    decode_context_tokens: sum of their context lengths (the KV each must read).
    prefill_tokens: prompt tokens computed this step (chunks of one or more prompts).
    prefill_prefix_tokens: tokens already in cache before those chunks (their KV is read).
    prefill_attended_positions: sum over prefill tokens of the positions each attends to.
    """
    m, a = d.model, d.accelerator
    spec = d.speculative
    verify_tokens = decode_seqs * (spec.tokens + 1 if spec else 1)
    tokens = verify_tokens + prefill_tokens
    if tokens <= 0:
        return IDLE
    stages, chips = d.pipeline_stages, d.chips
    # Sequences are split into micro-batches, one per stage at most, so stages overlap; a
    # token's round trip is then `stages` stage passes of one micro-batch each.
    micro = max(1, min(stages, decode_seqs + (1 if prefill_tokens else 0)))
    micro_tokens = tokens / micro

    # Per chip, for one micro-batch passing one stage.
    expert_share = touched_expert_fraction(m.experts, m.experts_per_token, micro_tokens)
    expert_bytes = m.experts * m.expert_params * expert_share * d.weight_bytes_per_param / chips
    dense_bytes = m.shared_params * d.weight_bytes_per_param / chips
    weight_bytes = dense_bytes + expert_bytes
    # Decoding reads each sequence's KV once (speculative verification included); prefill
    # chunks read their cached prefix; every new token writes its KV.
    kv_bytes = (
        (decode_context_tokens + prefill_prefix_tokens + tokens)
        / micro
        * d.kv_bytes_per_token_per_chip
    )
    verify_per_seq = verify_tokens / decode_seqs if decode_seqs else 0.0
    attended = decode_context_tokens * verify_per_seq + prefill_attended_positions
    expert_compute_params = m.experts_per_token * m.expert_params
    dense_flops = 2.0 * (m.active_compute_params - expert_compute_params) * tokens / micro / chips
    expert_flops = 2.0 * expert_compute_params * tokens / micro / chips
    attention_flops = 4.0 * m.layers * m.heads * m.head_dim * attended / micro / chips

    bandwidth = a.memory_bandwidth_bytes_per_s * a.memory_bandwidth_efficiency
    peak = d.peak_flops_per_s * d.compute_efficiency
    weight_read_s = stages * weight_bytes / bandwidth
    matmul_compute_s = stages * (dense_flops + expert_flops) / peak
    kv_read_s = stages * kv_bytes / bandwidth
    attention_compute_s = stages * attention_flops / peak
    tp = d.tensor_parallel
    imbalance = 1.0
    expert_gemm_s = 0.0
    if m.is_moe:
        imbalance = expert_imbalance(micro_tokens * m.experts_per_token, tp)
        expert_gemm_s = (
            stages
            * imbalance
            * max(expert_bytes / bandwidth, expert_flops / peak)
            / a.grouped_gemm_efficiency
        )
    dense_s = stages * max(dense_bytes / bandwidth, dense_flops / peak)
    roofline_s = dense_s + expert_gemm_s + max(kv_read_s, attention_compute_s)

    communication_s = all_to_all_s = 0.0
    if tp > 1:
        message = micro_tokens * m.hidden_size * ACTIVATION_BYTES
        allreduce_s = a.interconnect_latency_s + 2.0 * (tp - 1) / tp * message / (
            a.interconnect_bytes_per_s
        )
        if m.is_moe:
            # Attention keeps its all-reduce; the MoE block sends each token's activations to
            # its experts' ranks and back instead: dispatch + combine, (tp - 1) / tp remote.
            routed = message * m.experts_per_token / tp * (tp - 1) / tp
            one_way_s = a.interconnect_latency_s + routed / a.interconnect_bytes_per_s
            all_to_all_s = m.layers * 2.0 * one_way_s
            communication_s = m.layers * allreduce_s + all_to_all_s
        else:
            communication_s = m.layers * ALLREDUCES_PER_LAYER * allreduce_s
    layer_latency_s = m.layers * a.layer_latency_s
    hop_message = micro_tokens * m.hidden_size * ACTIVATION_BYTES
    pipeline_hop_s = (stages - 1) * (
        a.interconnect_latency_s + hop_message / a.interconnect_bytes_per_s
    )

    draft_s = 0.0
    if spec is not None and d.draft is not None and decode_seqs:
        one = step_terms(
            d.draft, decode_seqs=decode_seqs, decode_context_tokens=decode_context_tokens
        )
        draft_s = spec.tokens * (one.total_s - one.overhead_s)

    overhead_s = a.step_overhead_s
    total_s = roofline_s + communication_s + layer_latency_s + pipeline_hop_s + draft_s + overhead_s
    return StepTerms(
        tokens=tokens,
        weight_bytes=weight_bytes,
        kv_bytes=kv_bytes,
        flops=dense_flops + expert_flops + attention_flops,
        weight_read_s=weight_read_s,
        matmul_compute_s=matmul_compute_s,
        kv_read_s=kv_read_s,
        attention_compute_s=attention_compute_s,
        roofline_s=roofline_s,
        communication_s=communication_s,
        layer_latency_s=layer_latency_s,
        pipeline_hop_s=pipeline_hop_s,
        speculative_draft_s=draft_s,
        overhead_s=overhead_s,
        total_s=total_s,
        expert_gemm_s=expert_gemm_s,
        expert_all_to_all_s=all_to_all_s,
        expert_imbalance=imbalance,
    )


IDLE = StepTerms(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
