"""`tiergate sim-node serve MODEL ...`: vLLM's command line read as the spec it describes,
over the spec in the environment, under tiergate's own flags; errors are one line, exit 2."""

from __future__ import annotations

import json

import pytest
from cli_status import exit_status

from tiergate.cli import build_parser, main
from tiergate.common.cli import CliError
from tiergate.sim_nodes.commands.sim_node_cmd import (
    GRACEFUL_SHUTDOWN_S,
    graceful_shutdown_s,
    node_config,
    replica_spec,
)
from tiergate.sim_nodes.replica_spec import ReplicaSpec

H100 = {"TIERGATE_ACCELERATOR": "h100-sxm"}


def spec_of(*argv: str, environ: dict[str, str] | None = None) -> ReplicaSpec:
    args = build_parser("sim-node").parse_args(["sim-node", *argv])
    return replica_spec(args, H100 if environ is None else environ)


def test_vllm_s_line_describes_the_replica() -> None:
    spec = spec_of(
        "serve", "meta-llama/Llama-3.1-70B-Instruct",
        "--served-model-name", "a", "b",
        "--tensor-parallel-size", "4", "--pipeline-parallel-size", "2",
        "--max-num-seqs", "32", "--max-num-batched-tokens", "2048",
        "--no-enable-chunked-prefill",
        "--quantization", "fp8", "--kv-cache-dtype", "fp8_e5m2",
        "--speculative-config",
        '{"model": "meta-llama/Llama-3.2-1B-Instruct", "num_speculative_tokens": 5}',
        "--acceptance-rate", "0.6",
    )  # fmt: skip
    assert (spec.model, spec.accelerator) == ("llama-3.1-70b", "h100-sxm")
    assert (spec.chips, spec.tensor_parallel) == (8, 4)
    assert spec.batching.max_num_seqs == 32 and spec.batching.max_batched_tokens == 2048
    assert spec.batching.chunked_prefill is False
    assert (spec.weight_dtype, spec.kv_dtype) == ("fp8", "fp8")
    assert spec.speculative_decoding is not None
    assert spec.speculative_decoding.draft_model == "llama-3.2-1b"
    assert (spec.speculative_decoding.tokens, spec.speculative_decoding.acceptance_rate) == (5, 0.6)
    assert spec.names == ("a", "b")


def test_a_catalog_name_works_as_model_and_defaults_are_vllm_s_own() -> None:
    spec = spec_of("serve", "llama-3.1-8b", "--kv-cache-dtype", "auto", "--chips", "1")
    assert (spec.model, spec.kv_dtype, spec.weight_dtype, spec.chips) == (
        "llama-3.1-8b", "bf16", "bf16", 1)  # fmt: skip


def test_the_environment_s_spec_is_the_base_and_the_flags_override_it() -> None:
    pool = {"model": "frontier", "accelerator": "b200", "chips": 8, "tensorParallel": 8,
            "speculativeDecoding": {"draftModel": "frontier-spark", "tokens": 2,
                                    "acceptanceRate": 0.8},
            "background": {"sequences": 2, "contextTokens": 100}}  # fmt: skip
    environ = {"TIERGATE_POOL_JSON": json.dumps(pool), "TIERGATE_NODE_NAME": "pod-7"}
    args = build_parser("sim-node").parse_args(
        ["sim-node", "serve", "/model-cache/frontier", "--max-num-seqs", "4",
         "--speculative-config", '{"model": "frontier-spark", "num_speculative_tokens": 3}']
    )  # fmt: skip
    spec = replica_spec(args, environ)
    # MODEL is where vLLM would load weights: the spec says which model to simulate.
    assert (spec.model, spec.accelerator, spec.chips) == ("frontier", "b200", 8)
    assert spec.batching.max_num_seqs == 4
    assert spec.speculative_decoding is not None
    assert (spec.speculative_decoding.tokens, spec.speculative_decoding.acceptance_rate) == (3, 0.8)
    assert spec.background is not None and spec.background.sequences == 2
    assert node_config(args, spec, 8000, environ).node_name == "pod-7"


def test_tiergate_s_own_flags_win_over_vllm_s() -> None:
    spec = spec_of("serve", "llama-3.1-8b", "--tensor-parallel-size", "2", "--chips", "4",
                   "--max-num-batched-tokens", "1024", "--max-batched-tokens", "512")  # fmt: skip
    assert (spec.chips, spec.tensor_parallel, spec.batching.max_batched_tokens) == (4, 2, 512)


def test_the_accelerator_can_come_from_the_environment_only() -> None:
    with pytest.raises(CliError, match="--accelerator is required"):
        spec_of("serve", "llama-3.1-8b", environ={})
    environ = {"TIERGATE_ACCELERATOR": "a100-80gb", "TIERGATE_CHIPS": "2"}
    spec = spec_of("serve", "llama-3.1-8b", environ=environ)
    assert (spec.accelerator, spec.chips) == ("a100-80gb", 2)


def test_vllm_s_shutdown_timeout_is_how_long_open_streams_get_when_stopped() -> None:
    """What the operator renders for vLLM pods, the sim node reads as vLLM does (0: none)."""
    parse = build_parser("sim-node").parse_args
    for flags, seconds in (([], GRACEFUL_SHUTDOWN_S), (["--shutdown-timeout", "170"], 170),
                           (["--shutdown-timeout", "0"], 0)):  # fmt: skip
        assert graceful_shutdown_s(parse(["sim-node", "serve", "llama-3.1-8b", *flags])) == seconds


def test_vllm_s_max_model_len_is_the_context_served_over_the_spec_s() -> None:
    """The pool's context, else the model's: the flag is an override only where it differs."""
    assert spec_of("serve", "llama-3.1-8b").max_context_tokens is None
    assert spec_of("serve", "llama-3.1-8b", "--max-model-len", "131072").max_context_tokens is None
    assert spec_of("serve", "llama-3.1-8b", "--max-model-len", "4096").max_context_tokens == 4096
    pool = {
        "TIERGATE_POOL_JSON": json.dumps(
            {"model": "llama-3.1-8b", "accelerator": "h100-sxm", "maxContextTokens": 4096}
        )
    }
    assert spec_of(environ=pool).max_context_tokens == 4096
    assert spec_of("--max-model-len", "4096", environ=pool).max_context_tokens == 4096
    longer = spec_of("--max-model-len", "131072", environ=pool)
    assert longer.max_context_tokens == 131072  # the flags override the spec


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["serve", "someone/unknown-model"], "is no catalog model"),
        (["serve", "llama-3.1-8b", "--quantization", "awq"], "--quantization awq is not simulated"),
        (["serve", "llama-3.1-70b", "--speculative-config",
          '{"model": "llama-3.2-1b", "num_speculative_tokens": 2}'], "acceptance rate"),
        (["serve", "llama-3.1-70b", "--speculative-config", '{"model": "x"}'],
         "num_speculative_tokens"),
        (["serve", "llama-3.1-8b", "--kv-cache-dtype", "int4"], "invalid choice"),
        (["serve", "llama-3.1-8b", "--shutdown-timeout", "-5"], "--shutdown-timeout"),
        (["launch", "llama-3.1-8b"], "invalid choice"),
        # More context than the weights' config gives: vLLM refuses to start so.
        (["serve", "qwen3-32b", "--max-model-len", "131072"],
         "maxContextTokens 131072 is more than the 40960-token context of qwen3-32b"),
        (["serve", "llama-3.1-8b", "--max-model-len", "0"], "--max-model-len"),
    ],
)  # fmt: skip
def test_a_bad_vllm_line_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
    message: str,
) -> None:
    monkeypatch.setenv("TIERGATE_ACCELERATOR", "h100-sxm")
    monkeypatch.delenv("TIERGATE_POOL_JSON", raising=False)
    assert exit_status(["sim-node", *argv, "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def test_a_bad_pool_json_in_the_environment_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIERGATE_POOL_JSON", '{"model": ')
    assert main(["sim-node", "serve", "llama-3.1-8b", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "$TIERGATE_POOL_JSON: not valid JSON" in err, err
