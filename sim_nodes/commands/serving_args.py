"""The flags that describe a replica (model, hardware, layout, dtypes, batching, speculation),
shared by the sim_nodes commands, and the ServingSpec they make."""

from __future__ import annotations

import argparse
from typing import Any

from tiergate.common.cli import (
    CliError,
    fraction,
    int_or,
    positive_int,
    profile_json,
)

from ..catalogs import DTYPE_BYTES, DTYPES, Accelerator, ModelProfile
from ..perf import Deployment, ServingSpec


def add_serving_arguments(
    p: argparse.ArgumentParser,
    *,
    max_num_seqs: int | None,
    defaults: bool = True,
    context: bool = True,
) -> None:
    """Flags describing a replica: model, hardware, layout, dtypes, batching, speculation, and
    the context it serves.

    `max_num_seqs`: the batch cap's default (None: uncapped, only the KV cache limits it).
    `defaults=False` leaves every flag unset unless given, so that the flags can override a
    pool spec field by field (`tiergate sim-node --pool-file` / `--pool-json`). `context=False`
    leaves out `--max-context-tokens` (the sim node takes vLLM's `--max-model-len` instead).
    """

    def default(value: object) -> object:
        return value if defaults else None

    g = p.add_argument_group("serving spec")
    g.add_argument("--model", required=defaults, help="catalog model name")
    g.add_argument("--accelerator", required=defaults, help="catalog accelerator name")
    g.add_argument(
        "--model-profile-json",
        type=profile_json(ModelProfile),
        metavar="JSON",
        help="inline model profile (camelCase, as spec.modelProfile), named as --model",
    )
    g.add_argument(
        "--accelerator-profile-json",
        type=profile_json(Accelerator),
        metavar="JSON",
        help="inline accelerator profile (as spec.acceleratorProfile), named as --accelerator",
    )
    g.add_argument(
        "--chips", type=int_or("auto"), default=default("auto"), help="chips per replica or auto"
    )
    g.add_argument("--tensor-parallel", type=positive_int, help="TP group size")
    g.add_argument("--weight-dtype", choices=DTYPES, default=default("bf16"), help="weights")
    g.add_argument("--kv-dtype", choices=DTYPES, default=default("bf16"), help="KV cache")
    if context:
        g.add_argument(
            "--max-context-tokens",
            type=positive_int,
            help="context served, prompt and output, as spec.maxContextTokens (default: the "
            "model's)",
        )
    cap = "uncapped" if max_num_seqs is None else str(max_num_seqs)
    g.add_argument(
        "--max-num-seqs",
        type=positive_int,
        default=default(max_num_seqs),
        help=f"batch cap (default {cap})",
    )
    g.add_argument(
        "--max-batched-tokens", type=positive_int, default=default(8192), help="step budget"
    )
    g.add_argument(
        "--no-chunked-prefill",
        dest="chunked_prefill",
        action="store_false",
        default=default(True),
        help="schedule prompts whole",
    )
    g.add_argument("--speculative-tokens", type=positive_int, help="draft tokens per step")
    g.add_argument("--acceptance-rate", type=fraction, help="draft token acceptance rate")
    g.add_argument("--draft-model", help="catalog name of the draft model")


#: Stands for "no batch cap" where a spec needs a number.
UNCAPPED = 1_000_000


def spec_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The serving flags that are set, as a camelCase ServingSpec mapping."""
    given = {
        "model": args.model,
        "accelerator": args.accelerator,
        "modelProfile": args.model_profile_json,
        "acceleratorProfile": args.accelerator_profile_json,
        "chips": args.chips,
        "tensorParallel": args.tensor_parallel,
        "weightDtype": args.weight_dtype,
        "kvDtype": args.kv_dtype,
        "maxContextTokens": getattr(args, "max_context_tokens", None),
    }
    data: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
    batching = {
        "maxNumSeqs": args.max_num_seqs,
        "maxBatchedTokens": args.max_batched_tokens,
        "chunkedPrefill": args.chunked_prefill,
    }
    if any(v is not None for v in batching.values()):
        data["batching"] = {k: v for k, v in batching.items() if v is not None}
    speculative = (args.speculative_tokens, args.acceptance_rate, args.draft_model)
    if any(f is not None for f in speculative):
        if any(f is None for f in speculative):
            raise CliError(
                "speculative decoding needs --speculative-tokens, --acceptance-rate "
                "and --draft-model"
            )
        data["speculativeDecoding"] = {
            "tokens": args.speculative_tokens,
            "acceptanceRate": args.acceptance_rate,
            "draftModel": args.draft_model,
        }
    return data


def spec_from_args(args: argparse.Namespace) -> ServingSpec:
    """The ServingSpec that `add_serving_arguments`' flags describe (no batch cap: uncapped)."""
    data = spec_overrides(args)
    data.setdefault("batching", {}).setdefault("maxNumSeqs", UNCAPPED)
    return ServingSpec.model_validate(data)


def short_of_context(d: Deployment, spec: ServingSpec) -> str:
    """Why a GPU layout whose KV cache holds less than one sequence of its context does not
    fit (`Deployment.holds_its_context`), with the flags that mend it."""
    remedies = [] if spec.chips == "auto" else ["more --chips (or --chips auto)"]
    if DTYPE_BYTES[d.weight_dtype] > DTYPE_BYTES["fp8"]:
        remedies.append("--weight-dtype fp8")
    if DTYPE_BYTES[d.kv_dtype] > DTYPE_BYTES["fp8"]:
        remedies.append("--kv-dtype fp8")
    return (
        f"its KV cache holds {d.kv_capacity_tokens:,} tokens, less than one sequence of the "
        f"{d.model.max_context_tokens:,}-token context it serves (vLLM refuses to start so): "
        f"use {_either(*remedies, 'a shorter --max-context-tokens')}"
    )


def _either(*choices: str) -> str:
    """ "a, b or c"."""
    return " or ".join(filter(None, (", ".join(choices[:-1]), choices[-1])))
