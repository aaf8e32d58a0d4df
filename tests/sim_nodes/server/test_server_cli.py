"""`tiergate sim-node` arguments: pool files, flag overrides, one-line errors (exit 2)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import yaml
from cli_status import exit_status

from tiergate.cli import main
from tiergate.sim_nodes.catalogs import default_catalog
from tiergate.sim_nodes.commands import sim_node_cmd
from tiergate.sim_nodes.server.config import NodeConfig
from tiergate.sim_nodes.server.node import Node

POOL = """\
apiVersion: tiergate.dev/v1alpha1
kind: InferencePool
metadata: {name: premium}
spec:
  tier: premium
  replicas: 3
  model: frontier
  accelerator: b200
  chips: 8
  tensorParallel: 8
  weightDtype: fp8
  batching: {maxNumSeqs: 4, maxBatchedTokens: 4096}
  pricing: {perChipHourUsd: 5.5}
  servedModelName: frontier-fast
  slo: {ttftMs: 500}
"""


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    sim_node_cmd.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_pool_file_whole_object(tmp_path: Path) -> None:
    path = tmp_path / "pool.yaml"
    path.write_text(POOL)
    spec = sim_node_cmd.replica_spec(parse("--pool-file", str(path)))
    assert (spec.model, spec.accelerator, spec.chips, spec.tensor_parallel) == (
        "frontier",
        "b200",
        8,
        8,
    )
    assert spec.weight_dtype == "fp8"
    assert spec.batching.max_num_seqs == 4 and spec.batching.max_batched_tokens == 4096
    assert spec.pricing is not None and spec.pricing.per_chip_hour_usd == 5.5
    assert spec.names == ("frontier-fast",)


def test_pool_file_spec_only_and_flags_override(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(
        "model: llama-3.1-8b\naccelerator: h100-sxm\nbatching: {maxNumSeqs: 64}\naliases: [a, b]\n"
    )
    args = parse(
        "--pool-file",
        str(path),
        "--max-num-seqs",
        "8",
        "--accelerator",
        "h200",
        "--served-model-name",
        "x",
    )
    spec = sim_node_cmd.replica_spec(args)
    assert spec.accelerator == "h200" and spec.batching.max_num_seqs == 8
    assert spec.names == ("x",)
    spec = sim_node_cmd.replica_spec(parse("--pool-file", str(path)))
    # as the pool's pods answer (InferencePoolSpec.names): the model's own name, then aliases
    assert spec.names == ("llama-3.1-8b", "a", "b") and spec.batching.max_num_seqs == 64


def test_flags_only() -> None:
    spec = sim_node_cmd.replica_spec(
        parse("--model", "llama-3.1-8b", "--accelerator", "h100-sxm", "--chips", "2")
    )
    assert spec.chips == 2 and spec.names == ("llama-3.1-8b",) and spec.background is None


BAD_FILES = {
    "missing": None,
    "not yaml": "model: [unclosed\n",
    "a list": "- model: x\n",
    "spec not a mapping": "spec: 3\n",
    "bad field value": "spec: {model: frontier, accelerator: b200, chips: -1}\n",
    "bad batching": "model: frontier\naccelerator: b200\nbatching: {maxNumSeqs: zero}\n",
    "bad served name": "model: frontier\naccelerator: b200\nservedModelName: [1]\n",
    "no model": "accelerator: b200\n",
    "unknown model": "model: gpt-17\naccelerator: b200\n",
    "misspelt field": "spec: {modle: frontier, model: frontier, accelerator: b200}\n",
}


def test_the_fields_a_node_ignores_are_the_inferencepool_spec_s_others() -> None:
    from tiergate.pools import InferencePoolSpec
    from tiergate.sim_nodes.replica_spec import POOL_ONLY_FIELDS, ReplicaSpec

    def aliases(model: type) -> set[str]:
        return {f.alias or name for name, f in model.model_fields.items()}

    assert issubclass(InferencePoolSpec, ReplicaSpec)  # one model validates what nodes read
    assert aliases(InferencePoolSpec) - aliases(ReplicaSpec) == POOL_ONLY_FIELDS


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_bad_pool_file_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    path = tmp_path / "pool.yaml"
    if BAD_FILES[case] is not None:
        path.write_text(BAD_FILES[case] or "")
    assert main(["sim-node", "--pool-file", str(path), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tiergate sim-node: error: ")
    assert err.count("\n") == 1 and "Traceback" not in err


def test_bad_flags_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["sim-node", "--model", "frontier", "--accelerator", "b200", "--failure-rate", "2"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert (
        main(
            [
                "sim-node",
                "--model",
                "frontier",
                "--accelerator",
                "b200",
                "--background-sequences",
                "3",
                "--port",
                "0",
            ]
        )
        == 2
    )
    assert (
        main(
            [
                "sim-node",
                "--model",
                "llama-3.1-8b",
                "--accelerator",
                "h100-sxm",
                "--background-sequences",
                "100000",
                "--background-context-tokens",
                "100000",
                "--port",
                "0",
            ]
        )
        == 2
    )
    assert "background" in capsys.readouterr().err.splitlines()[-1]


# -- inline profiles: --model-profile-json / --accelerator-profile-json ----------------------

TEAM_70B = json.dumps(
    {
        **default_catalog().model("llama-3.1-70b").model_dump(by_alias=True, exclude_none=True),
        "name": "team-70b",
        "quality": 0.5,
    }
)


def test_profile_flags_make_the_node_simulate_the_inline_profile() -> None:
    faster = (
        default_catalog()
        .accelerator("h100-sxm")
        .model_copy(update={"memory_bandwidth_tb_per_s": 6.7})
    )
    args = parse(
        "--model", "team-70b", "--model-profile-json", TEAM_70B,
        "--accelerator", "h100-sxm", "--chips", "4",
        "--accelerator-profile-json", faster.model_dump_json(by_alias=True),
    )  # fmt: skip
    spec = sim_node_cmd.replica_spec(args)
    assert spec.model_profile is not None and spec.model_profile.quality == 0.5
    node = Node(NodeConfig(serving=spec))
    assert node.model.name == "team-70b" and node.model.quality == 0.5
    assert node.deployment.accelerator.memory_bandwidth_tb_per_s == 6.7
    assert node.names == ["team-70b"]


def test_a_pool_file_with_an_inline_profile_is_served_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "pool.yaml"
    profile = json.loads(TEAM_70B)
    path.write_text(
        yaml.safe_dump(
            {
                "spec": {
                    "tier": "batched",
                    "model": "team-70b",
                    "accelerator": "h100-sxm",
                    "chips": 4,
                    "modelProfile": profile,
                }
            }
        )  # fmt: skip
    )
    spec = sim_node_cmd.replica_spec(parse("--pool-file", str(path)))
    assert spec.model_profile is not None and spec.model_profile.name == "team-70b"


BAD_PROFILES = {
    "not json": (["--model-profile-json", "{layers: 80"], "not valid JSON"),
    "not an object": (["--model-profile-json", "[1, 2]"], "expected a JSON object"),
    "missing field": (
        [
            "--model-profile-json",
            json.dumps({k: v for k, v in json.loads(TEAM_70B).items() if k != "hiddenSize"}),
        ],  # fmt: skip
        "hiddenSize: Field required",
    ),
    "bad accelerator": (["--accelerator-profile-json", '{"name": "h100-sxm"}'], "memoryKind"),
    "named otherwise": (
        ["--model-profile-json", TEAM_70B.replace('"team-70b"', '"team-7b"')],
        "modelProfile.name 'team-7b' must equal model 'team-70b'",
    ),
}


@pytest.mark.parametrize("case", list(BAD_PROFILES))
def test_a_bad_inline_profile_is_one_line_exit_2(
    capsys: pytest.CaptureFixture[str], case: str
) -> None:
    flags, words = BAD_PROFILES[case]
    argv = ["sim-node", "--model", "team-70b", "--accelerator", "h100-sxm", "--port", "0", *flags]
    assert exit_status(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert words in err, err


def test_the_fault_header_is_honoured_only_with_enable_fault_injection() -> None:
    flags = ("--model", "llama-3.1-8b", "--accelerator", "h100-sxm")
    for extra, enabled in (((), False), (("--enable-fault-injection",), True)):
        args = parse(*flags, *extra)
        config = sim_node_cmd.node_config(args, sim_node_cmd.replica_spec(args), 8000)
        assert config.fault_header_enabled is enabled
        assert (Node(config).faults.decide("503") is not None) is enabled


# -- --pool-json: the spec whole, as the operator's pods and `tiergate up` pass it -------------


def test_pool_json_is_read_as_the_same_pool_file_is(tmp_path: Path) -> None:
    path = tmp_path / "pool.yaml"
    path.write_text(POOL)
    pool = yaml.safe_load(POOL)
    from_file = sim_node_cmd.replica_spec(parse("--pool-file", str(path)))
    for value in (pool, pool["spec"]):  # an InferencePool object, or just its spec
        spec = sim_node_cmd.replica_spec(parse("--pool-json", json.dumps(value)))
        assert spec == from_file and spec.names == ("frontier-fast",)


def test_flags_override_the_pool_json_field_by_field() -> None:
    pool = {
        "model": "llama-3.1-8b", "accelerator": "h100-sxm", "aliases": ["a"],
        "batching": {"maxNumSeqs": 4, "maxBatchedTokens": 4096},
        "background": {"sequences": 3, "contextTokens": 1000, "turnInputTokens": 10},
    }  # fmt: skip
    given = ("--pool-json", json.dumps(pool))
    args = parse(*given)
    config = sim_node_cmd.node_config(args, sim_node_cmd.replica_spec(args), 8000)
    assert config.names == ["llama-3.1-8b", "a"]
    assert (config.background_sequences, config.background_context_tokens) == (3, 1000)
    assert config.background_turn_input_tokens == 10
    args = parse(*given, "--max-num-seqs", "2", "--served-model-name", "y",
                 "--background-sequences", "5")  # fmt: skip
    spec = sim_node_cmd.replica_spec(args)
    assert (spec.batching.max_num_seqs, spec.batching.max_batched_tokens) == (2, 4096)
    assert spec.names == ("y",)
    assert spec.background is not None
    assert (spec.background.sequences, spec.background.context_tokens) == (5, 1000)
    assert spec.background.turn_input_tokens == 10
    args = parse(*given, "--background-sequences", "0")  # no other tenants' load after all
    config = sim_node_cmd.node_config(args, sim_node_cmd.replica_spec(args), 8000)
    assert (config.background_sequences, config.background_context_tokens) == (0, 0)


GOOD = {"model": "llama-3.1-8b", "accelerator": "h100-sxm"}
BAD_POOL_JSON = {
    "not json": (["--pool-json", '{"model": "frontier", "layers: 80'], "not valid JSON"),
    "a list": (["--pool-json", "[1, 2]"], "expected a mapping"),
    "spec not a mapping": (["--pool-json", '{"spec": 3}'], "`spec` must be a mapping"),
    "misspelt field": (["--pool-json", json.dumps({**GOOD, "maxNumSeq": 4})], "maxNumSeq"),
    "bad batch cap": (
        ["--pool-json", json.dumps({**GOOD, "batching": {"maxNumSeqs": 0}})],
        "--pool-json: batching.maxNumSeqs: Input should be greater than or equal to 1",
    ),
    "bad background": (
        ["--pool-json", json.dumps({**GOOD, "background": {"sequences": 2}})],
        "--pool-json: background.contextTokens: Field required",
    ),
    "background too big": (
        [
            "--pool-json",
            json.dumps({**GOOD, "background": {"sequences": 100_000, "contextTokens": 100_000}}),
        ],
        "background",
    ),  # fmt: skip
    "bad name": (["--pool-json", json.dumps({**GOOD, "aliases": "a"})], "aliases"),
    "no model": (["--pool-json", '{"accelerator": "b200"}'], "--model is required"),
    "unknown model": (["--pool-json", json.dumps({**GOOD, "model": "gpt-17"})], "gpt-17"),
    "profile named otherwise": (
        [
            "--pool-json",
            json.dumps(
                {**GOOD, "model": "team-70b", "modelProfile": json.loads(TEAM_70B) | {"name": "x"}}
            ),
        ],
        "modelProfile.name 'x' must equal model 'team-70b'",
    ),  # fmt: skip
    "a file too": (["--pool-json", json.dumps(GOOD), "--pool-file", "p.yaml"], "not allowed"),
}


@pytest.mark.parametrize("case", list(BAD_POOL_JSON))
def test_a_bad_pool_json_is_one_line_exit_2(capsys: pytest.CaptureFixture[str], case: str) -> None:
    flags, words = BAD_POOL_JSON[case]
    assert exit_status(["sim-node", "--port", "0", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tiergate sim-node: error: ")
    assert err.count("\n") == 1 and "Traceback" not in err
    assert words in err, err
    assert flags[1] not in err  # the value is not quoted back: it may be long
