"""The `sglang.launch_server` arguments the operator renders (operator/engine_args.py), parsed by
SGLang's own argument parser (`ServerArgs.add_cli_args` of the SGLang release the operator pins,
which tools/real_engine.py installs beside the vLLM engine): every flag is one SGLang knows, and
each says what the pool's spec says.

Only the parser runs: SGLang has no CPU build on PyPI, so `ServerArgs` itself (whose
construction inspects the model and the GPUs) is never built."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from engine_process import installer

from tiergate.operator.engine_args import SGLANG_VERSION, sglang_args
from tiergate.pools import InferencePoolSpec, Layout
from tiergate.sim_nodes.catalogs import default_catalog

#: Run in the parser's venv: parse each argument list read from stdin; print, one JSON line,
#: the installed SGLang version and the values the pool's spec sets, or the parser's complaint.
PARSE = r"""
import argparse, contextlib, importlib.metadata, io, json, sys
from sglang.srt.server_args import ServerArgs
FIELDS = ("model_path", "served_model_name", "host", "port", "tensor_parallel_size",
          "pipeline_parallel_size", "max_running_requests", "max_prefill_tokens",
          "chunked_prefill_size", "quantization", "kv_cache_dtype", "speculative_algorithm",
          "speculative_draft_model_path", "speculative_num_steps", "speculative_eagle_topk",
          "speculative_num_draft_tokens", "enable_metrics", "context_length")
out = []
for args in json.load(sys.stdin):
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            parsed = vars(parser.parse_args(args))
    except SystemExit:
        out.append({"error": errors.getvalue().strip().splitlines()[-1]})
        continue
    out.append({f: parsed.get(f, "<no such field>") for f in FIELDS})
print(json.dumps({"version": importlib.metadata.version("sglang"), "parsed": out}))
"""

GPU = {"accelerator": "h100-sxm", "engine": "sglang", "tier": "batched"}
POOLS: list[tuple[str, dict[str, Any], Layout]] = [
    ("tensor parallel, the first of two names",
     {**GPU, "model": "llama-3.1-70b", "servedModelName": "chat", "aliases": ["chat-70b"]},
     Layout(4, 4)),
    ("pipeline stages, no chunked prefill",
     {**GPU, "model": "llama-3.1-70b", "batching": {"maxNumSeqs": 32, "maxBatchedTokens": 4096,
                                                    "chunkedPrefill": False}},
     Layout(8, 4)),
    ("fp8 weights and KV cache, premium batch cap",
     {**GPU, "tier": "premium", "model": "llama-3.1-8b", "weightDtype": "fp8", "kvDtype": "fp8",
      "batching": {"maxNumSeqs": 8}},
     Layout(1, 1)),
    ("speculative decoding with a draft model",
     {**GPU, "model": "llama-3.1-70b",
      "speculativeDecoding": {"draftModel": "llama-3.2-1b", "tokens": 4, "acceptanceRate": 0.7}},
     Layout(2, 2)),
    ("weights from a volume",
     {**GPU, "model": "llama-3.1-8b", "modelSource": "/models/llama-8b"},
     Layout(1, 1)),
]  # fmt: skip


def expected(spec: InferencePoolSpec, layout: Layout) -> dict[str, Any]:
    batching = spec.batching
    speculative = spec.speculative_decoding
    catalog_ids = {"llama-3.1-70b": "meta-llama/Llama-3.1-70B-Instruct",
                   "llama-3.1-8b": "meta-llama/Llama-3.1-8B-Instruct"}  # fmt: skip
    return {
        "model_path": spec.model_source or catalog_ids[spec.model],
        "served_model_name": spec.names[0],
        "host": "0.0.0.0",
        "port": 8000,
        "tensor_parallel_size": layout.tensor_parallel,
        "pipeline_parallel_size": layout.chips // layout.tensor_parallel,
        "max_running_requests": batching.max_num_seqs,
        "max_prefill_tokens": batching.max_batched_tokens,
        "chunked_prefill_size": batching.max_batched_tokens if batching.chunked_prefill else -1,
        "quantization": "fp8" if spec.weight_dtype == "fp8" else None,
        "kv_cache_dtype": "fp8_e4m3" if spec.kv_dtype == "fp8" else "auto",
        "speculative_algorithm": None if speculative is None else "STANDALONE",
        "speculative_draft_model_path": None
        if speculative is None
        else "meta-llama/Llama-3.2-1B-Instruct",
        "speculative_num_steps": None if speculative is None else speculative.tokens,
        "speculative_eagle_topk": None if speculative is None else 1,
        "speculative_num_draft_tokens": None if speculative is None else speculative.tokens + 1,
        "enable_metrics": True,
        "context_length": default_catalog().model(spec.model).max_context_tokens,
    }


#: A vLLM flag SGLang does not have: the parser must refuse it (the check can fail).
VLLM_ONLY = ["--model-path", "m", "--max-num-seqs", "8"]


@pytest.fixture(scope="module")
def parsed(engine_root: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """What SGLang's parser makes of every pool's rendered arguments (one interpreter: importing
    SGLang's server arguments takes seconds)."""
    rendered = [
        sglang_args(InferencePoolSpec.model_validate(spec), layout) for _, spec, layout in POOLS
    ]
    rendered.append(VLLM_ONLY)
    result = subprocess.run(
        [str(installer().sglang_python(engine_root)), "-P", "-c", PARSE],
        input=json.dumps(rendered),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path_factory.mktemp("sglang-parser"),  # nothing of the project's on the path
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    out: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return out


def test_the_parser_is_the_release_the_operator_renders_for(parsed: dict[str, Any]) -> None:
    assert "v" + parsed["version"] == SGLANG_VERSION


@pytest.mark.parametrize("index", range(len(POOLS)), ids=[p[0] for p in POOLS])
def test_sglang_parses_the_rendered_arguments_as_the_spec_says(
    parsed: dict[str, Any], index: int
) -> None:
    _, raw, layout = POOLS[index]
    spec = InferencePoolSpec.model_validate(raw)
    args = sglang_args(spec, layout)
    result = parsed["parsed"][index]
    assert "error" not in result, (args, result)
    assert result == expected(spec, layout), args


def test_a_flag_sglang_does_not_know_is_refused(parsed: dict[str, Any]) -> None:
    refused = parsed["parsed"][len(POOLS)]
    assert "unrecognized arguments: --max-num-seqs 8" in refused.get("error", ""), refused
