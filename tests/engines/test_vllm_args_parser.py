"""The `vllm serve` arguments the operator renders (operator/engine_args.py), parsed by vLLM's
own argument parser (`make_arg_parser` of the vLLM tools/real_engine.py installs): every flag
is one vLLM knows, and each says what the pool's spec says."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from engine_process import installer

from tiergate.operator.gpu_pods import VLLM_SHUTDOWN_TIMEOUT_S
from tiergate.operator.render import container_command
from tiergate.pools import InferencePoolSpec, Layout
from tiergate.sim_nodes.catalogs import default_catalog

#: Run in the engine's venv: parse each argument list read from stdin; print, one JSON line,
#: the values the router's pools depend on, or the parser's complaint.
PARSE = r"""
import contextlib, io, json, sys
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.entrypoints.launchers.cli_args import make_arg_parser
FIELDS = ("model_tag", "served_model_name", "host", "port", "tensor_parallel_size",
          "pipeline_parallel_size", "max_num_seqs", "max_num_batched_tokens",
          "enable_chunked_prefill", "quantization", "kv_cache_dtype", "speculative_config",
          "shutdown_timeout", "max_model_len")
out = []
for args in json.load(sys.stdin):
    parser = make_arg_parser(FlexibleArgumentParser())
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            parsed = vars(parser.parse_args(args))
    except SystemExit:
        out.append({"error": errors.getvalue().strip().splitlines()[-1]})
        continue
    out.append({f: parsed.get(f) for f in FIELDS})
print(json.dumps(out))
"""

GPU = {"accelerator": "h100-sxm", "engine": "vllm", "tier": "batched"}
POOLS: list[tuple[str, dict[str, Any], Layout]] = [
    ("tensor parallel, two names",
     {**GPU, "model": "llama-3.1-70b", "servedModelName": "chat", "aliases": ["chat-70b"]},
     Layout(4, 4)),
    ("pipeline stages, no chunked prefill",
     {**GPU, "model": "llama-3.1-70b", "batching": {"maxNumSeqs": 32, "maxBatchedTokens": 131072,
                                                    "chunkedPrefill": False}},
     Layout(8, 4)),
    ("fp8 weights and KV cache, premium batch cap",
     {**GPU, "tier": "premium", "model": "llama-3.1-8b", "weightDtype": "fp8", "kvDtype": "fp8",
      "batching": {"maxNumSeqs": 8}},
     Layout(1, 1)),
    ("speculative decoding",
     {**GPU, "model": "llama-3.1-70b",
      "speculativeDecoding": {"draftModel": "llama-3.2-1b", "tokens": 4, "acceptanceRate": 0.7}},
     Layout(2, 2)),
    ("a context the weights' config gives (Qwen3 without YaRN)",
     {**GPU, "model": "qwen3-32b"},
     Layout(2, 2)),
]  # fmt: skip


def expected(spec: InferencePoolSpec, layout: Layout, args: list[str]) -> dict[str, Any]:
    batching = spec.batching
    speculative = spec.speculative_decoding
    return {
        "model_tag": args[1],
        "served_model_name": list(spec.names),
        "host": "0.0.0.0",
        "port": 8000,
        "tensor_parallel_size": layout.tensor_parallel,
        "pipeline_parallel_size": layout.chips // layout.tensor_parallel,
        "max_num_seqs": batching.max_num_seqs,
        "max_num_batched_tokens": batching.max_batched_tokens,
        "enable_chunked_prefill": None if batching.chunked_prefill else False,
        "quantization": "fp8" if spec.weight_dtype == "fp8" else None,
        "kv_cache_dtype": "fp8" if spec.kv_dtype == "fp8" else "auto",
        "speculative_config": None
        if speculative is None
        else {"model": "meta-llama/Llama-3.2-1B-Instruct", "num_speculative_tokens": 4},
        "shutdown_timeout": VLLM_SHUTDOWN_TIMEOUT_S,
        "max_model_len": default_catalog().model(spec.model).max_context_tokens,
    }


def rendered(spec: InferencePoolSpec, layout: Layout) -> list[str]:
    """The vLLM container's arguments, as the operator renders them."""
    command, args = container_command(spec, layout)
    assert command == ["vllm"]
    return args


@pytest.fixture(scope="module")
def parsed(engine_root: Path, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """What vLLM's parser makes of every pool's rendered arguments (one interpreter: importing
    vLLM takes seconds)."""
    lines = [
        rendered(InferencePoolSpec.model_validate(spec), layout)[1:]  # after `serve`
        for _, spec, layout in POOLS
    ]
    result = subprocess.run(
        [str(installer().venv_python(engine_root)), "-P", "-c", PARSE],
        input=json.dumps(lines),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path_factory.mktemp("vllm-parser"),  # nothing of the project's on the path
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    out: list[dict[str, Any]] = json.loads(result.stdout.strip().splitlines()[-1])
    return out


@pytest.mark.parametrize("index", range(len(POOLS)), ids=[p[0] for p in POOLS])
def test_vllm_parses_the_rendered_arguments_as_the_spec_says(
    parsed: list[dict[str, Any]], index: int
) -> None:
    _, raw, layout = POOLS[index]
    spec = InferencePoolSpec.model_validate(raw)
    args = rendered(spec, layout)
    assert "error" not in parsed[index], (args, parsed[index])
    assert parsed[index] == expected(spec, layout, args)
