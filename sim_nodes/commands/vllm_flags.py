"""`vllm serve`'s command line, as the sim node reads it: the sim node is a drop-in for vLLM.

``tiergate sim-node serve MODEL --served-model-name NAME ... --tensor-parallel-size N
--max-model-len N --max-num-seqs N --max-num-batched-tokens N --quantization fp8
--kv-cache-dtype fp8 --speculative-config JSON --port P`` simulates what vLLM would serve
with those flags. What the flags cannot say - the accelerator and its chips, inline profiles,
the draft's acceptance rate, other tenants' load - comes from the environment
(`replica_spec`'s `*_ENV` names) or from tiergate's own flags. MODEL is a catalog name or a
catalog model's Hugging Face id; any other MODEL (a path to weights) needs the model to
simulate from elsewhere (--model or the spec).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from tiergate.common.cli import CliError, non_negative_int, positive_int

from ..catalogs import Catalog

__all__ = ["add_vllm_arguments", "catalog_model_name", "vllm_overrides"]

#: vLLM's KV-cache dtypes and the one the sim simulates for each (auto: the weights' bf16).
KV_CACHE_DTYPES = {"auto": "bf16", "fp8": "fp8", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8"}
#: vLLM's --quantization methods the sim simulates, by the weight dtype they store.
QUANTIZATIONS = {"fp8": "fp8"}


def _speculative_config(text: str) -> dict[str, Any]:
    """Argument type of --speculative-config: a JSON object with the draft model and its
    token count."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {exc.msg}") from None
    if not isinstance(data, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    missing = [k for k in ("model", "num_speculative_tokens") if k not in data]
    if missing:
        raise argparse.ArgumentTypeError(f"the sim node needs {' and '.join(missing)} in it")
    return data


def add_vllm_arguments(parser: argparse.ArgumentParser) -> None:
    """`serve MODEL` and the `vllm serve` flags the operator renders (tiergate's own flags
    with the same meaning, --max-num-seqs, --served-model-name, --host and --port, are the
    sim node's)."""
    parser.add_argument(
        "serve", nargs="?", choices=["serve"], help="as in `vllm serve MODEL` (optional)"
    )
    parser.add_argument(
        "model_ref",
        nargs="?",
        metavar="MODEL",
        help="the weights vLLM would load: a catalog model's name or Hugging Face id",
    )
    g = parser.add_argument_group("vllm serve flags (the command line the operator renders)")
    g.add_argument("--tensor-parallel-size", dest="vllm_tensor_parallel", type=positive_int)
    g.add_argument("--pipeline-parallel-size", dest="vllm_pipeline_parallel", type=positive_int)
    g.add_argument("--max-num-batched-tokens", dest="vllm_max_batched_tokens", type=positive_int)
    g.add_argument(
        "--enable-chunked-prefill",
        dest="vllm_chunked_prefill",
        action=argparse.BooleanOptionalAction,
        default=None,
    )
    g.add_argument("--quantization", dest="vllm_quantization", help="fp8 (others: not simulated)")
    g.add_argument("--kv-cache-dtype", dest="vllm_kv_cache_dtype", choices=list(KV_CACHE_DTYPES))
    g.add_argument(
        "--max-model-len",
        dest="vllm_max_model_len",
        type=positive_int,
        metavar="N",
        help="context served, prompt and output, as spec.maxContextTokens (default: the "
        "model's; more is refused)",
    )
    g.add_argument(
        "--shutdown-timeout",
        dest="vllm_shutdown_timeout",
        type=non_negative_int,
        metavar="S",
        help="seconds the requests in flight get to finish on SIGTERM (default: a few)",
    )
    g.add_argument(
        "--speculative-config",
        dest="vllm_speculative_config",
        type=_speculative_config,
        metavar="JSON",
        help='{"model": DRAFT, "num_speculative_tokens": N}; the acceptance rate from the spec '
        "or --acceptance-rate",
    )


def catalog_model_name(ref: str, catalog: Catalog) -> str | None:
    """The catalog model `ref` names (by name or by Hugging Face id), or None."""
    if ref in catalog.models:
        return ref
    return next((m.name for m in catalog.models.values() if m.hugging_face_id == ref), None)


def vllm_overrides(
    args: argparse.Namespace, base: dict[str, Any], catalog: Catalog
) -> dict[str, Any]:
    """The spec fields (camelCase) the vLLM flags and MODEL set, over `base` (the spec so far)."""
    out: dict[str, Any] = {}
    if args.model_ref is not None and "model" not in base and args.model is None:
        name = catalog_model_name(args.model_ref, catalog)
        if name is None:
            raise CliError(
                f"MODEL {args.model_ref} is no catalog model (by name or Hugging Face id): "
                "say which to simulate with --model"
            )
        out["model"] = name
    tp, pp = args.vllm_tensor_parallel, args.vllm_pipeline_parallel
    if tp is not None:
        out["tensorParallel"] = tp
    if (tp is not None or pp is not None) and "chips" not in base:
        out["chips"] = (tp or base.get("tensorParallel") or 1) * (pp or 1)
    batching: dict[str, Any] = {}
    if args.vllm_max_batched_tokens is not None:
        batching["maxBatchedTokens"] = args.vllm_max_batched_tokens
    if args.vllm_chunked_prefill is not None:
        batching["chunkedPrefill"] = args.vllm_chunked_prefill
    if batching:
        out["batching"] = batching
    if args.vllm_quantization is not None:
        if args.vllm_quantization not in QUANTIZATIONS:
            raise CliError(
                f"--quantization {args.vllm_quantization} is not simulated (fp8 is; other "
                "weight dtypes: --weight-dtype)"
            )
        out["weightDtype"] = QUANTIZATIONS[args.vllm_quantization]
    served = args.vllm_max_model_len
    if served is not None and served != _served_context({**base, **out}, args, catalog):
        out["maxContextTokens"] = served  # the context served already is no override
    if args.vllm_kv_cache_dtype not in (None, "auto"):
        out["kvDtype"] = KV_CACHE_DTYPES[args.vllm_kv_cache_dtype]
    config = args.vllm_speculative_config
    if config is not None:
        out["speculativeDecoding"] = _speculative(config, args, base, catalog)
    return out


def _served_context(spec: dict[str, Any], args: argparse.Namespace, catalog: Catalog) -> int | None:
    """The context the spec so far serves: its maxContextTokens, else that of the model it
    (or --model) names, where known."""
    given = spec.get("maxContextTokens")
    if isinstance(given, int):
        return given
    profile = args.model_profile_json or spec.get("modelProfile")
    if isinstance(profile, dict):
        context = profile.get("maxContextTokens")
        return context if isinstance(context, int) else None
    if profile is not None:
        return int(profile.max_context_tokens)
    model = catalog.models.get(str(args.model or spec.get("model")))
    return model.max_context_tokens if model is not None else None


def _speculative(
    config: dict[str, Any], args: argparse.Namespace, base: dict[str, Any], catalog: Catalog
) -> dict[str, Any]:
    draft = catalog_model_name(str(config["model"]), catalog)
    if draft is None:
        raise CliError(
            f"--speculative-config: draft model {config['model']} is no catalog model (by "
            "name or Hugging Face id)"
        )
    known = base.get("speculativeDecoding")
    rate = args.acceptance_rate
    if rate is None and isinstance(known, dict):
        rate = known.get("acceptanceRate")
    if rate is None:
        raise CliError("--speculative-config needs the draft's acceptance rate: --acceptance-rate")
    return {"draftModel": draft, "tokens": config["num_speculative_tokens"], "acceptanceRate": rate}
