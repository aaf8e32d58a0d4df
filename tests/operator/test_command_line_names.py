"""The pool's model, names and weights reach its pods' command line (`vllm serve MODEL
--served-model-name NAME ...`, the sim node reading the same flags): one starting with '-'
would be read as an option and every pod would exit at start, so pool files, `kubectl apply`
(the CRD's CEL rules) and the router's file refuse it, in the same words. The sim node's own
command line, which argparse has read already, still takes such a name, as vLLM does."""

from __future__ import annotations

from typing import Any

import celpy
import pytest
from crd_helpers import generated_crd, problems, pydantic_says, schema_of, walk
from operator_helpers import CATALOG, IMAGE, FakeCluster, clock, conditions, pool

from tiergate.cli import build_parser
from tiergate.operator.reconcile import reconcile
from tiergate.pools import InferencePoolSpec
from tiergate.pools.engines import COMMAND_LINE_FIELDS, option_like_problem
from tiergate.router.config import ConfigError, parse_config
from tiergate.sim_nodes.commands.sim_node_cmd import replica_spec


@pytest.fixture(scope="module")
def crd() -> dict[str, Any]:
    return generated_crd()


def custom(model: str = "team-72b-instruct", **profile: Any) -> dict[str, Any]:
    """examples/custom-model.yaml, its inline model profile (registered as `model`) changed."""
    obj = pool("custom-model", model=model)
    obj["spec"]["modelProfile"].update(profile, name=model)
    return obj


#: A pool of each field starting with '-'.
CASES = {
    "model": lambda: custom("-team"),
    "servedModelName": lambda: pool(servedModelName="--help"),
    "aliases": lambda: pool(aliases=["fast", "-mini"]),
    "modelSource": lambda: pool(modelSource="-weights"),
    "modelProfile.huggingFaceId": lambda: custom(huggingFaceId="-org/team-72b"),
}


def item_problems(crd: dict[str, Any], obj: dict[str, Any]) -> list[str]:
    """What the CEL rules on a list's items refuse (`problems` reads the rules of fields)."""
    env = celpy.Environment()
    found: list[str] = []
    for path, node in walk(schema_of(crd)):
        if not path.endswith("[]") or path.count("[]") != 1:
            continue
        values: Any = obj
        for key in path.removesuffix("[]").split(".")[1:]:
            values = values.get(key) if isinstance(values, dict) else None
        for rule in node.get("x-kubernetes-validations", []):
            program = env.program(env.compile(rule["rule"]))
            for value in values or []:
                if not program.evaluate({"self": celpy.json_to_cel(value)}):
                    found.append(rule["message"])
    return found


def test_every_field_that_reaches_the_command_line_has_a_case() -> None:
    assert set(CASES) == set(COMMAND_LINE_FIELDS)


@pytest.mark.parametrize("field", COMMAND_LINE_FIELDS)
def test_a_leading_dash_is_refused_by_pool_files_and_kubectl_apply_alike(
    crd: dict[str, Any], field: str
) -> None:
    obj = CASES[field]()
    expected = option_like_problem(field)
    said = pydantic_says(obj)
    assert said is not None and said.endswith(expected), said
    assert expected in problems(crd, obj) + item_problems(crd, obj)


@pytest.mark.parametrize(
    "obj",
    [
        pool(servedModelName="frontier-fast", aliases=["x-", "a--b"]),
        pool(aliases=["a b", "fast-"]),
        pool(modelSource="/model-cache/frontier-fp8"),
        custom("team-72b", huggingFaceId="team/-72b"),
    ],
)
def test_a_dash_elsewhere_is_accepted(crd: dict[str, Any], obj: dict[str, Any]) -> None:
    assert pydantic_says(obj) is None
    assert problems(crd, obj) + item_problems(crd, obj) == []


def unescape(text: str) -> str:
    """A container's argument as the kubelet expands it."""
    return text.replace("$$", "$")


def pod_names(obj: dict[str, Any]) -> tuple[str, ...] | str:
    """The names the pool's pods answer to, read from the command line the operator renders
    as the sim node reads it; or why the operator rendered none."""
    cluster = FakeCluster()
    outcome = reconcile(obj, cluster, CATALOG, IMAGE, clock())
    deployments = [m for m in cluster.applied if m["kind"] == "Deployment"]
    if not deployments:
        return str(conditions(outcome.status)["Ready"]["message"])
    (container,) = deployments[0]["spec"]["template"]["spec"]["containers"]
    argv = container["command"][1:] + [unescape(a) for a in container["args"]]
    environ = {e["name"]: unescape(e["value"]) for e in container["env"] if "value" in e}
    return replica_spec(build_parser("sim-node").parse_args(argv), environ).names


@pytest.mark.parametrize(
    "aliases", [["fast"], ["-mini"], ["fast", "--port"], ["a-b", "-"], ["fast", "a b"]]
)
def test_every_name_the_operator_accepts_reaches_the_pods_whole(aliases: list[str]) -> None:
    obj = pool("batched", aliases=aliases)
    found = pod_names(obj)
    if any(a.startswith("-") for a in aliases):
        assert found == "invalid spec: spec: " + option_like_problem("aliases")
    else:
        assert found == InferencePoolSpec.model_validate(obj["spec"]).names


def test_the_routers_file_refuses_a_leading_dash_naming_the_field() -> None:
    text = (
        "pools:\n  - {name: p, tier: batched, model: llama-3.1-8b, accelerator: h100-sxm, "
        "aliases: [fast, -mini], endpoints: ['http://127.0.0.1:9000']}\n"
    )
    with pytest.raises(ConfigError) as refused:
        parse_config(text, "router.yaml")
    assert str(refused.value) == "router.yaml: pools.0: " + option_like_problem("aliases", "")


def test_the_sim_nodes_own_command_line_still_takes_such_a_name() -> None:
    # argparse has read it already (`=`), as vLLM's does: nothing is read as an option later.
    argv = ["sim-node", "serve", "llama-3.1-8b", "--served-model-name=-mini",
            "--accelerator", "h100-sxm"]  # fmt: skip
    assert replica_spec(build_parser("sim-node").parse_args(argv), {}).names == ("-mini",)
