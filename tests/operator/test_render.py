"""Rendered manifests of sim pools: the sim node reads back the spec the operator renders
(`vllm serve`'s arguments and the spec in the environment) and a pod's container starts a node
serving the pool's names; pods are locked down and carry the router's contract (the labels and
port name of `api.sim_node_pods`); the Service is named after the pool, port `http`."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest
import yaml
from pydantic import ValidationError

from tiergate.cli import build_parser
from tiergate.common.validation import first_problem
from tiergate.operator.render import PodSettings, deployment_manifest, service_manifest
from tiergate.operator.status import assess
from tiergate.pools import (
    InferencePool,
    InferencePoolSpec,
    Layout,
    pool_selector_labels,
    served_names,
)
from tiergate.sim_nodes.catalogs import default_catalog
from tiergate.sim_nodes.commands.sim_node_cmd import node_config, replica_spec
from tiergate.sim_nodes.replica_spec import ReplicaSpec
from tiergate.sim_nodes.server import NODE_HEADER

ROOT = Path(__file__).resolve().parents[2]


def example(name: str) -> InferencePoolSpec:
    text = (ROOT / "examples" / f"{name}.yaml").read_text(encoding="utf-8")
    return InferencePool.model_validate(yaml.safe_load(text)).spec


def layout(spec: InferencePoolSpec) -> Layout:
    """The layout the operator renders: the performance model's, as `reconcile` takes it."""
    resolved = assess(spec, default_catalog()).layout
    assert resolved is not None
    return resolved


def parse(args: list[str]) -> argparse.Namespace:
    return build_parser("sim-node").parse_args(args)


_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)|\$\$")


def as_kubelet_runs(args: list[str], env: dict[str, str]) -> list[str]:
    """A container's args as the kubelet hands them over: `$(VAR)` of a defined variable
    replaced, `$$` read as `$`, any other `$(...)` left as written."""

    def sub(m: re.Match[str]) -> str:
        return "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0))

    return [_VAR.sub(sub, a) for a in args]


def kubelet_env(entries: list[dict[str, object]], pod: str) -> dict[str, str]:
    """A container's environment as the kubelet builds it: in order, each value expanded
    against the variables before it; POD_NAME from the pod's name."""
    env: dict[str, str] = {}
    for entry in entries:
        name = str(entry["name"])
        env[name] = pod if name == "POD_NAME" else as_kubelet_runs([str(entry["value"])], env)[0]
    return env


def run_as_kubelet(
    spec: InferencePoolSpec, resolved: Layout, pod: str = "pod-0"
) -> tuple[list[str], list[str], dict[str, str]]:
    """The rendered container's (command, args, environment) as the kubelet runs them."""
    manifest = deployment_manifest("p", "ns", spec, "img", resolved)
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    env = kubelet_env(container["env"], pod)
    return container["command"], as_kubelet_runs(container["args"], env), env


def node_of(spec: InferencePoolSpec, resolved: Layout) -> tuple[argparse.Namespace, dict[str, str]]:
    """The sim node's parsed arguments and environment in the rendered pod."""
    command, args, env = run_as_kubelet(spec, resolved)
    assert command == ["tiergate", "sim-node"]
    return parse(["sim-node", *args]), env


def replica_of(spec: InferencePoolSpec, resolved: Layout) -> ReplicaSpec:
    """The part of `spec` a node runs, laid out as `resolved` (the price is not the node's)."""
    data = spec.model_dump(include=set(ReplicaSpec.model_fields) - {"pricing"})
    return ReplicaSpec.model_validate(
        {**data, "chips": resolved.chips, "tensor_parallel": resolved.tensor_parallel}
    )


def everything(base: InferencePoolSpec) -> InferencePoolSpec:
    """`base` with every field a node acts on set, none to its default: an inline accelerator
    profile (the catalog's entry, repriced: it shadows it), speculative decoding, names with a
    `$` (the kubelet expands `$(...)` in args), background load, every batch limit."""
    accelerator = default_catalog().accelerator(base.accelerator)
    return InferencePoolSpec.model_validate(
        {
            **base.model_dump(by_alias=True, exclude_none=True),
            "acceleratorProfile": accelerator.model_copy(
                update={"price_per_chip_hour_usd": 1.5}
            ).model_dump(by_alias=True, exclude_none=True),
            "batching": {"maxNumSeqs": 6, "maxBatchedTokens": 2048, "chunkedPrefill": False},
            "speculativeDecoding": {
                "draftModel": "llama-3.1-8b", "tokens": 4, "acceptanceRate": 0.7125,
            },
            "servedModelName": "claude-ish",
            "aliases": ["fast-one", "price$(POD_NAME)", "a$$b"],
            "background": {"sequences": 2, "contextTokens": 1000, "turnInputTokens": 50,
                           "turnOutputTokens": 20},
            "pricing": {"perChipHourUsd": 9.0},
            "slo": {"ttftMs": 900},
        }
    )  # fmt: skip


@pytest.mark.parametrize("name", ["batched", "premium", "wafer-scale", "custom-model"])
def test_the_node_reads_back_the_spec_the_operator_renders(name: str) -> None:
    """Round trip: the pod's args, as the kubelet passes them, parsed and validated by the
    node, are the pool's spec (what a replica runs), with the envelope's layout."""
    for spec in (example(name), everything(example(name))):
        resolved = layout(spec)
        parsed, env = node_of(spec, resolved)
        served = replica_spec(parsed, env)
        assert served == replica_of(spec, resolved)
        assert served.names == spec.names and served.background == spec.background
        assert (served.chips, served.tensor_parallel) == resolved
        if spec.chips != "auto":
            assert served.chips == spec.chips
        assert (parsed.host, parsed.port) == ("0.0.0.0", 8000)
        assert node_config(parsed, served, 8000, env).node_name == "pod-0"


def test_the_spec_goes_as_one_compact_json_variable_without_what_is_not_the_node_s() -> None:
    spec = everything(example("custom-model"))

    def spec_env(spec: InferencePoolSpec) -> str:
        container = deployment_manifest("p", "ns", spec, "img", layout(spec))["spec"]["template"][
            "spec"
        ]["containers"][0]
        return str({e["name"]: e.get("value") for e in container["env"]}["TIERGATE_POOL_JSON"])

    value = spec_env(spec)
    rendered = json.loads(value.replace("$$", "$"))
    assert " " not in value
    assert rendered["modelProfile"]["hiddenSize"] == 8192
    assert rendered["acceleratorProfile"]["pricePerChipHourUsd"] == 1.5
    assert rendered["batching"] == {"maxNumSeqs": 6, "maxBatchedTokens": 2048,
                                    "chunkedPrefill": False}  # fmt: skip
    # a scale, a price, an SLO or a pod template edit leaves the pods' args (so the pods) be
    assert not {"replicas", "tier", "slo", "workload", "template", "pricing"} & set(rendered)
    edited = spec.model_copy(update={"replicas": 5, "pricing": None, "slo": None})
    assert spec_env(edited) == value


def test_the_pods_say_which_names_their_node_serves() -> None:
    spec = everything(example("batched"))
    resolved = Layout(8, 8)
    parsed, env = node_of(spec, resolved)
    served = replica_spec(parsed, env)
    assert served.names == ("claude-ish", "fast-one", "price$(POD_NAME)", "a$$b")
    template = deployment_manifest("p", "ns", spec, "img", resolved)["spec"]["template"]
    assert served_names(template["metadata"]["annotations"]) == set(served.names)


def test_pods_are_non_root_read_only_and_probed() -> None:
    spec = example("premium")
    d = deployment_manifest("frontier-premium", "ns", spec, "tiergate:0.1.0", layout(spec))
    pod = d["spec"]["template"]["spec"]
    container = pod["containers"][0]
    sc = container["securityContext"]
    assert sc["runAsNonRoot"] and sc["readOnlyRootFilesystem"]
    assert not sc["allowPrivilegeEscalation"] and sc["capabilities"] == {"drop": ["ALL"]}
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    assert container["resources"]["requests"]
    assert container["image"] == "tiergate:0.1.0" and d["spec"]["replicas"] == spec.replicas
    labels = d["spec"]["template"]["metadata"]["labels"]
    assert labels["tiergate.dev/tier"] == "premium" and labels["tiergate.dev/pool"] == (
        "frontier-premium")  # fmt: skip
    assert d["spec"]["selector"]["matchLabels"] == pool_selector_labels("frontier-premium")


def test_template_overrides_apply_but_never_replace_tiergate_labels() -> None:
    spec = InferencePoolSpec.model_validate(
        {
            **example("batched").model_dump(by_alias=True, exclude_none=True),
            "template": {
                "image": "mirror/tiergate:1",
                "nodeSelector": {"pool": "gpu"},
                "tolerations": [{"key": "gpu", "operator": "Exists"}],
                "labels": {"team": "a", "tiergate.dev/tier": "premium"},
                "resources": {"requests": {"cpu": "2"}},
            },
        }  # fmt: skip
    )
    d = deployment_manifest("p", "ns", spec, "tiergate:0.1.0", layout(spec))
    pod = d["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == "mirror/tiergate:1"
    assert pod["nodeSelector"] == {"pool": "gpu"}
    assert pod["tolerations"] == [{"key": "gpu", "operator": "Exists"}]
    assert pod["containers"][0]["resources"] == {"requests": {"cpu": "2"}}
    labels = d["spec"]["template"]["metadata"]["labels"]
    assert labels["team"] == "a" and labels["tiergate.dev/tier"] == "batched"


def test_pods_pull_with_the_operator_s_secrets_then_the_pool_s_each_once() -> None:
    base = example("batched").model_dump(by_alias=True, exclude_none=True)
    plain = InferencePoolSpec.model_validate(base)
    pod = deployment_manifest("p", "ns", plain, "tiergate:0.1.0", layout(plain))
    assert "imagePullSecrets" not in pod["spec"]["template"]["spec"]
    own = [{"name": "mirror"}, {"name": "regcred"}]
    spec = InferencePoolSpec.model_validate({**base, "template": {"imagePullSecrets": own}})
    settings = PodSettings(pull_secrets=("regcred", "corp.registry"))
    d = deployment_manifest("p", "ns", spec, "tiergate:0.1.0", layout(spec), settings=settings)
    assert d["spec"]["template"]["spec"]["imagePullSecrets"] == [
        {"name": "regcred"}, {"name": "corp.registry"}, {"name": "mirror"}
    ]  # fmt: skip


@pytest.mark.parametrize("name", ["Regcred", "reg_cred", "-regcred", "a" * 254, ""])
def test_a_pull_secret_that_is_no_secret_s_name_is_refused_in_words(name: str) -> None:
    base = example("batched").model_dump(by_alias=True, exclude_none=True)
    with pytest.raises(ValidationError) as refused:
        InferencePoolSpec.model_validate(
            {**base, "template": {"imagePullSecrets": [{"name": name}]}}
        )
    assert "is not a Secret's name" in first_problem(refused.value)
    assert first_problem(refused.value).startswith("template.imagePullSecrets.0.name: ")


def test_service_is_named_after_the_pool_with_an_http_port() -> None:
    s = service_manifest("spark-wafer", "ns", example("wafer-scale"))
    assert s["metadata"]["name"] == "spark-wafer"
    assert s["spec"]["ports"][0]["name"] == "http"
    assert s["spec"]["selector"] == pool_selector_labels("spark-wafer")


@pytest.mark.parametrize("name", ["batched", "premium", "wafer-scale", "custom-model"])
def test_the_rendered_node_starts_and_simulates_the_envelopes_replica(name: str) -> None:
    """Regression (found on a real API server): wafer-scale's `chips: auto` went to the pod as
    `auto`, the node sized it without the pool's background load and refused to start. The pod
    now gets the envelope's layout, and a node built from its args as `tiergate sim-node`
    builds it starts."""
    from tiergate.sim_nodes.server.app import create_app

    spec = example(name)
    args, env = node_of(spec, layout(spec))
    served = replica_spec(args, env)
    config = node_config(args, served, 8000, env)
    background = spec.background.sequences if spec.background else 0
    assert config.background_sequences == background and config.node_name == "pod-0"
    create_app(config)  # raises EngineCapacityError when the background does not fit
    assert served.chips == layout(spec).chips


def test_a_pod_s_container_starts_a_node_that_serves_the_pool_s_names() -> None:
    """The rendered Deployment's container, run as the kubelet runs it (the image's entrypoint
    `tiergate`, args expanded; the address moved to a free local port), is a node answering to
    every name of the pool - a `$` in one included - and to nothing else."""
    spec = everything(example("custom-model"))
    command, args, env = run_as_kubelet(spec, layout(spec), pod="team-0")
    assert command == ["tiergate", "sim-node"]
    argv = [sys.executable, "-P", "-m", "tiergate", "sim-node", *args,
            "--host", "127.0.0.1", "--port", "0"]  # fmt: skip
    with (
        tempfile.TemporaryFile() as stderr,
        subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=stderr, env={**os.environ, **env}
        ) as process,
    ):
        try:
            assert process.stdout is not None
            line = process.stdout.readline().decode()  # listening host=... port=... (or EOF)
            stderr.seek(0)
            assert line.startswith("listening "), stderr.read().decode()
            port = dict(item.split("=", 1) for item in line.split()[1:])["port"]
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while not ready(url):
                assert process.poll() is None and time.monotonic() < deadline, "not ready"
                time.sleep(0.1)
            models = httpx.get(f"{url}/v1/models", timeout=30).json()
            assert [m["id"] for m in models["data"]] == list(spec.names)
            for name in (*spec.names, spec.model):
                reply = httpx.post(
                    f"{url}/v1/chat/completions",
                    json={"model": name, "messages": [{"role": "user", "content": "hi"}],
                          "max_tokens": 2},
                    timeout=30,
                )  # fmt: skip
                assert reply.status_code == (200 if name in spec.names else 404), reply.text
                assert reply.headers[NODE_HEADER] == "team-0"
        finally:
            process.terminate()
            process.wait(30)


def ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/ready", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False
