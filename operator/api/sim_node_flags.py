"""A pool spec as `tiergate sim-node` flags: what the node simulates and answers to.

One rendering for both places that start sim nodes: the operator's Deployments and
`tiergate up`'s local processes. Every batching limit is explicit (the node's own default is
uncapped). Inline profiles travel as compact camelCase JSON (`--model-profile-json`,
`--accelerator-profile-json`), the node validating them with the same models, so a pod needs
no catalog file mounted. Where the node listens and what it is called are the caller's flags.
"""

from __future__ import annotations

from .inference_pool import InferencePoolSpec

__all__ = ["sim_node_flags"]


def sim_node_flags(
    spec: InferencePoolSpec, *, chips: int | str, tensor_parallel: int | None
) -> list[str]:
    """`chips` / `tensor_parallel`: the spec's, or the layout a caller already resolved."""
    b = spec.batching
    flags = [
        "--model", spec.model,
        "--accelerator", spec.accelerator,
        "--chips", str(chips),
        "--weight-dtype", spec.weight_dtype,
        "--kv-dtype", spec.kv_dtype,
        "--max-num-seqs", str(b.max_num_seqs),
        "--max-batched-tokens", str(b.max_batched_tokens),
    ]  # fmt: skip
    for flag, profile in (
        ("--model-profile-json", spec.model_profile),
        ("--accelerator-profile-json", spec.accelerator_profile),
    ):
        if profile is not None:
            flags += [flag, profile.model_dump_json(by_alias=True, exclude_none=True)]
    if tensor_parallel is not None:
        flags += ["--tensor-parallel", str(tensor_parallel)]
    if not b.chunked_prefill:
        flags.append("--no-chunked-prefill")
    if spec.speculative_decoding is not None:
        sd = spec.speculative_decoding
        flags += ["--draft-model", sd.draft_model, "--speculative-tokens", str(sd.tokens),
                  "--acceptance-rate", repr(sd.acceptance_rate)]  # fmt: skip
    for name in spec.names:
        flags += ["--served-model-name", name]
    bg = spec.background
    if bg is not None and bg.sequences:
        flags += [
            "--background-sequences", str(bg.sequences),
            "--background-context-tokens", str(bg.context_tokens),
            "--background-turn-input-tokens", str(bg.turn_input_tokens),
            "--background-turn-output-tokens", str(bg.turn_output_tokens),
        ]  # fmt: skip
    return flags
