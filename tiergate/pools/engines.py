"""The engines a pool may run, defined once: the API's validators and the CRD's CEL rules
(operator/crd.py) are both made from this table and the catalog's memory kinds.

`sim` is tiergate's simulated node (any accelerator of the catalog, nothing to load). `vllm`
and `sglang` are the real engines: they run on GPUs (accelerators that hold weights in HBM;
no such engine runs on wafer-scale or LPU chips, which hold them in SRAM), load real weights
(the catalog model's Hugging Face id, or `spec.modelSource`) and know fewer KV-cache dtypes.
Each rule has one sentence, the same from a pool file and from `kubectl apply`.

Every engine, the sim node included, takes the pool's model, names and weights on its command
line (operator/engine_args.py), so none of them may start with '-': argparse reads such a value
as an option, and every pod of the pool would exit at start (`COMMAND_LINE_FIELDS`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from tiergate.sim_nodes.catalogs import Catalog, Dtype, MemoryKind
from tiergate.sim_nodes.tier_rules import accelerators_with

from .hosted import SPEC

__all__ = [
    "COMMAND_LINE_FIELDS",
    "DEFAULT_ENGINE",
    "ENGINES",
    "Engine",
    "EngineDefinition",
    "batching_problem",
    "engine_problem",
    "kv_dtype_problem",
    "memory_kind_problem",
    "models_with_weights",
    "option_like_problem",
    "spans_nodes_problem",
    "weight_dtype_problem",
    "weights_problem",
]

Engine = Literal["sim", "vllm", "sglang"]

#: The spec's strings (camelCase paths; each item of a list) that reach the pods' command line
#: as an option's value or the positional model: each must not start with '-'.
COMMAND_LINE_FIELDS = (
    "model",
    "servedModelName",
    "aliases",
    "modelSource",
    "modelProfile.huggingFaceId",
)


@dataclass(frozen=True, slots=True)
class EngineDefinition:
    """One engine: what it is and what a pool running it must be."""

    name: Engine
    #: What it is, in a few words (the CRD's description of `spec.engine`).
    summary: str
    #: Where its accelerators must hold the weights (None: anywhere; the sim simulates any).
    memory_kind: MemoryKind | None = None
    #: It loads real weights: the model needs a Hugging Face id or spec.modelSource.
    loads_weights: bool = False
    #: The KV-cache dtypes it can run (None: every dtype of the catalog).
    kv_dtypes: tuple[Dtype, ...] | None = None
    #: The weight dtypes it makes of a model's published weights: bf16 as published, fp8
    #: quantized as they load. Others need a checkpoint stored so, named in spec.modelSource.
    #: None: every dtype (the sim node loads nothing).
    weight_dtypes: tuple[Dtype, ...] | None = None
    #: A replica runs in one pod on one node: no more chips than one system of the
    #: accelerator has (the sim node simulates any layout, and needs no GPU).
    one_node: bool = False


def _gpu_engine(name: Engine, summary: str) -> EngineDefinition:
    """A real engine: GPUs, real weights in bf16 or fp8, a replica in one pod."""
    bf16_fp8: tuple[Dtype, ...] = ("bf16", "fp8")
    return EngineDefinition(
        name, summary, "hbm", True, kv_dtypes=bf16_fp8, weight_dtypes=bf16_fp8, one_node=True
    )


ENGINES: dict[Engine, EngineDefinition] = {
    "sim": EngineDefinition("sim", "the simulated node (any accelerator; the default)"),
    "vllm": _gpu_engine("vllm", "vLLM on GPUs"),
    "sglang": _gpu_engine("sglang", "SGLang on GPUs"),
}
DEFAULT_ENGINE: Engine = "sim"


def memory_kind_problem(engine: Engine, catalog: Catalog) -> str | None:
    """What is wrong with a pool of `engine` on an accelerator that does not hold weights in
    the engine's memory, or None for an engine with no such rule."""
    kind = ENGINES[engine].memory_kind
    if kind is None:
        return None
    others = sorted(a.name for a in catalog.accelerators.values() if a.memory_kind != kind)
    return (
        f"engine {engine} runs on GPUs ({', '.join(accelerators_with(catalog, kind))}, or an "
        f"acceleratorProfile with memoryKind {kind}); no such engine runs on "
        f"{', '.join(others)} (wafer-scale and LPU chips hold weights in SRAM): run those "
        "pools with engine sim"
    )


def models_with_weights(catalog: Catalog) -> list[str]:
    """The catalog's models with published weights (a Hugging Face id), sorted."""
    return sorted(m.name for m in catalog.models.values() if m.hugging_face_id)


def weights_problem(engine: Engine, catalog: Catalog) -> str | None:
    """What is wrong with a pool of `engine` whose model has no weights to load, or None for
    an engine that loads none."""
    if not ENGINES[engine].loads_weights:
        return None
    return (
        f"engine {engine} loads real weights: spec.model must be a catalog model with a Hugging "
        f"Face id ({', '.join(models_with_weights(catalog))}), or a modelProfile with "
        "huggingFaceId, or spec.modelSource must name them (so must the draft model of "
        "spec.speculativeDecoding, by a catalog model with a Hugging Face id)"
    )


def kv_dtype_problem(engine: Engine) -> str | None:
    """What is wrong with a pool of `engine` whose KV-cache dtype it cannot run, or None."""
    dtypes = ENGINES[engine].kv_dtypes
    if dtypes is None:
        return None
    return f"engine {engine} keeps the KV cache in {' or '.join(dtypes)}: set spec.kvDtype to one"


def spans_nodes_problem(
    engine: Engine, accelerator: str, chips: int, chips_per_system: int
) -> str | None:
    """Why a replica of `chips` x `accelerator` cannot be scheduled with `engine`: it needs
    more chips than one node has (the performance model lays it out over several systems, as
    pipeline stages), and the engine runs a replica in one pod. None if it can."""
    if not ENGINES[engine].one_node or chips <= chips_per_system:
        return None
    return (
        f"a replica of {chips} x {accelerator} spans {math.ceil(chips / chips_per_system)} "
        f"nodes of {chips_per_system}, and a {engine} replica runs in one pod on one node "
        "(multi-node replicas are not supported): its pods would stay Pending. Set chips to "
        f"{chips_per_system} or fewer where the weights and the workload's KV cache fit them, "
        "or use smaller weights (weightDtype), a smaller model or an accelerator with more "
        "memory"
    )


def batching_problem(
    engine: Engine,
    max_num_seqs: int,
    max_batched_tokens: int,
    chunked_prefill: bool,
    model: str,
    context_tokens: int,
) -> str | None:
    """Why vLLM would refuse to start with the pool's batch limits (its scheduler's checks at
    start), or None: a step's token budget must cover every running sequence's token, and
    without chunked prefill a whole prompt of the model's context (`context_tokens`, which
    the pods' --max-model-len says) must fit one step."""
    if engine != "vllm":
        return None
    if max_batched_tokens < max_num_seqs:
        return (
            f"batching.maxBatchedTokens ({max_batched_tokens}) is below batching.maxNumSeqs "
            f"({max_num_seqs}): vLLM refuses to start so (each running sequence takes a token "
            "of every step); raise maxBatchedTokens or lower maxNumSeqs"
        )
    if not chunked_prefill and max_batched_tokens < context_tokens:
        return (
            f"batching.chunkedPrefill: false needs batching.maxBatchedTokens "
            f"({max_batched_tokens}) of at least the context the pool serves "
            f"({context_tokens:,} tokens of {model}: spec.maxContextTokens, else the model's): "
            "vLLM then prefills a prompt in one step, and refuses to start otherwise; raise "
            "maxBatchedTokens, leave chunked prefill on, or shorten spec.maxContextTokens"
        )
    return None


def weight_dtype_problem(engine: Engine) -> str | None:
    """What is wrong with a pool of `engine` whose weight dtype it cannot make of the
    published weights, with no checkpoint stored so named, or None."""
    dtypes = ENGINES[engine].weight_dtypes
    if dtypes is None:
        return None
    return (
        f"engine {engine} makes {' or '.join(dtypes)} weights of the published ones: for another "
        "spec.weightDtype name a checkpoint stored so in spec.modelSource (the engine reads its "
        "quantization from it)"
    )


def option_like_problem(field: str, prefix: str = SPEC) -> str:
    """What is wrong with a value of `field` (one of COMMAND_LINE_FIELDS) that starts with
    '-'."""
    return (
        f"{prefix}{field} must not start with '-': the pods' command line (vllm serve, SGLang, "
        "the sim node) would read it as an option"
    )


def engine_problem(
    engine: Engine,
    *,
    accelerator: str,
    inline_memory_kind: MemoryKind | None,
    model: str,
    inline_hugging_face_id: str | None,
    has_inline_model: bool,
    model_source: str | None,
    draft_model: str | None,
    weight_dtype: Dtype,
    kv_dtype: Dtype,
    catalog: Catalog,
) -> str | None:
    """The first of `engine`'s rules the pool breaks, in the words of the CRD's CEL rules
    (operator/crd.py `engine_rules`), or None."""
    definition = ENGINES[engine]
    if definition.memory_kind is not None:
        known = catalog.accelerators.get(accelerator)
        has = inline_memory_kind or (known.memory_kind if known is not None else None)
        if has != definition.memory_kind:
            return memory_kind_problem(engine, catalog)
    if definition.loads_weights:
        with_weights = set(models_with_weights(catalog))
        if has_inline_model:
            model_ok = inline_hugging_face_id is not None
        else:
            model_ok = model in with_weights
        draft_ok = draft_model is None or draft_model in with_weights
        if not (model_ok or model_source) or not draft_ok:
            return weights_problem(engine, catalog)
    weights = definition.weight_dtypes
    if weights is not None and weight_dtype not in weights and not model_source:
        return weight_dtype_problem(engine)
    if definition.kv_dtypes is not None and kv_dtype not in definition.kv_dtypes:
        return kv_dtype_problem(engine)
    return None
