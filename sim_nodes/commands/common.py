"""Shared helpers for sim_nodes commands: argument types, errors, tables."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence

from ..catalogs import DTYPES
from ..perf import BatchingSpec, ServingSpec, SpeculativeSpec


class CliError(Exception):
    """A user error: printed as one line, exit status 2."""


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {value}")
    return value


def int_or(keyword: str) -> Callable[[str], int | str]:
    """Argument type accepting a positive whole number or one keyword (e.g. auto, max)."""

    def parse(text: str) -> int | str:
        if text == keyword:
            return keyword
        try:
            return positive_int(text)
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentTypeError(f"{exc} or {keyword!r}") from None

    parse.__name__ = f"int_or_{keyword}"
    return parse


def add_serving_arguments(p: argparse.ArgumentParser, *, max_num_seqs: int | None) -> None:
    """Flags describing a replica: model, hardware, layout, dtypes, batching, speculation.

    `max_num_seqs`: the batch cap's default (None: uncapped, only the KV cache limits it).
    """
    p.add_argument("--model", required=True, help="catalog model name")
    p.add_argument("--accelerator", required=True, help="catalog accelerator name")
    p.add_argument("--chips", type=int_or("auto"), default="auto", help="chips per replica or auto")
    p.add_argument("--tensor-parallel", type=positive_int, default=None, help="TP group size")
    p.add_argument("--weight-dtype", choices=DTYPES, default="bf16", help="weight dtype")
    p.add_argument("--kv-dtype", choices=DTYPES, default="bf16", help="KV cache dtype")
    cap = "uncapped" if max_num_seqs is None else str(max_num_seqs)
    p.add_argument(
        "--max-num-seqs", type=positive_int, default=max_num_seqs, help=f"batch cap ({cap})"
    )
    p.add_argument("--max-batched-tokens", type=positive_int, default=8192, help="step budget")
    p.add_argument("--no-chunked-prefill", action="store_true", help="schedule prompts whole")
    p.add_argument("--speculative-tokens", type=positive_int, default=None)
    p.add_argument("--acceptance-rate", type=fraction, default=None)
    p.add_argument("--draft-model", default=None)


#: Stands for "no batch cap" where a spec needs a number.
UNCAPPED = 1_000_000


def spec_from_args(args: argparse.Namespace) -> ServingSpec:
    """The ServingSpec that `add_serving_arguments`' flags describe."""
    speculative = None
    spec_flags = (args.speculative_tokens, args.acceptance_rate, args.draft_model)
    if any(f is not None for f in spec_flags):
        if any(f is None for f in spec_flags):
            raise CliError(
                "speculative decoding needs --speculative-tokens, --acceptance-rate "
                "and --draft-model"
            )
        speculative = SpeculativeSpec(
            draft_model=args.draft_model,
            tokens=args.speculative_tokens,
            acceptance_rate=args.acceptance_rate,
        )
    return ServingSpec(
        model=args.model,
        accelerator=args.accelerator,
        chips=args.chips,
        tensor_parallel=args.tensor_parallel,
        weight_dtype=args.weight_dtype,
        kv_dtype=args.kv_dtype,
        batching=BatchingSpec(
            max_num_seqs=args.max_num_seqs or UNCAPPED,
            max_batched_tokens=args.max_batched_tokens,
            chunked_prefill=not args.no_chunked_prefill,
        ),
        speculative_decoding=speculative,
    )


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, left: int = 1) -> str:
    """A plain, aligned text table: the first `left` columns (names) left-aligned, numbers right."""
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        parts = [
            str(c).ljust(w) if i < left else str(c).rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    out = [line(headers), line(["-" * w for w in widths])]
    out += [line(r) for r in rows]
    return "\n".join(out)
