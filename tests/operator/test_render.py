"""Rendered manifests: the sim node's flags reproduce the spec, pods are locked down and carry
the router's contract (the labels and port name of `api.sim_node_pods`), and the Service is
named after the pool, port `http`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import yaml

from tiergate.cli import build_parser
from tiergate.operator.api import (
    InferencePool,
    InferencePoolSpec,
    Layout,
    pool_selector_labels,
    served_names,
)
from tiergate.operator.render import deployment_manifest, service_manifest, sim_node_args
from tiergate.operator.status import assess
from tiergate.sim_nodes.catalogs import default_catalog
from tiergate.sim_nodes.commands.common import spec_from_args

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


@pytest.mark.parametrize("name", ["batched", "premium", "wafer-scale", "custom-model"])
def test_sim_node_flags_reproduce_the_spec(name: str) -> None:
    spec = example(name)
    resolved = layout(spec)
    parsed = parse([a.replace("$(POD_NAME)", "pod-0") for a in sim_node_args(spec, resolved)])
    served = spec_from_args(parsed)
    fields = ("model", "accelerator", "model_profile", "accelerator_profile", "weight_dtype",
              "kv_dtype", "batching", "speculative_decoding")  # fmt: skip
    for field in fields:
        assert getattr(served, field) == getattr(spec, field), field
    assert (served.chips, served.tensor_parallel) == resolved
    if spec.chips != "auto":
        assert served.chips == spec.chips
    background = spec.background.sequences if spec.background else 0
    assert (parsed.background_sequences or 0) == background  # unset: none
    assert (parsed.host, parsed.port, parsed.node_name) == ("0.0.0.0", 8000, "pod-0")


def test_speculative_decoding_and_names_reach_the_node() -> None:
    spec = InferencePoolSpec.model_validate(
        {
            **example("batched").model_dump(by_alias=True, exclude_none=True),
            "speculativeDecoding": {
                "draftModel": "llama-3.2-1b",
                "tokens": 4,
                "acceptanceRate": 0.7,
            },
            "servedModelName": "claude-ish",
            "aliases": ["fast-one"],
        }  # fmt: skip
    )
    parsed = parse(sim_node_args(spec, Layout(8, 8)))  # flags only: the draft is not in the catalog
    assert (parsed.draft_model, parsed.speculative_tokens, parsed.acceptance_rate) == (
        "llama-3.2-1b", 4, 0.7)  # fmt: skip
    assert parsed.served_model_name == ["claude-ish", "fast-one"]
    # ... and the pods say so, for the router: the names the node was started with
    template = deployment_manifest("p", "ns", spec, "img", Layout(8, 8))["spec"]["template"]
    assert served_names(template["metadata"]["annotations"]) == set(parsed.served_model_name)


def test_inline_profiles_reach_the_node_as_compact_json_flags() -> None:
    spec = example("custom-model")
    accelerator = (
        default_catalog()
        .accelerator("h100-sxm")
        .model_copy(update={"name": "lab-gpu", "price_per_chip_hour_usd": 1.5})
    )
    spec = spec.model_copy(update={"accelerator": "lab-gpu", "accelerator_profile": accelerator})
    args = sim_node_args(spec, layout(spec))
    model_json = args[args.index("--model-profile-json") + 1]
    assert json.loads(model_json)["hiddenSize"] == 8192 and " " not in model_json
    accelerator_json = args[args.index("--accelerator-profile-json") + 1]
    assert json.loads(accelerator_json)["pricePerChipHourUsd"] == 1.5
    parsed = parse(args)
    assert (parsed.model_profile_json, parsed.accelerator_profile_json) == (
        spec.model_profile, accelerator)  # fmt: skip
    assert "--model-profile-json" not in sim_node_args(example("batched"), Layout(8, 8))


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


def test_service_is_named_after_the_pool_with_an_http_port() -> None:
    s = service_manifest("spark-wafer", "ns", example("wafer-scale"))
    assert s["metadata"]["name"] == "spark-wafer"
    assert s["spec"]["ports"][0]["name"] == "http"
    assert s["spec"]["selector"] == pool_selector_labels("spark-wafer")


@pytest.mark.parametrize("name", ["batched", "premium", "wafer-scale", "custom-model"])
def test_the_rendered_node_starts_and_simulates_the_envelopes_replica(name: str) -> None:
    """Regression (found on a real API server): wafer-scale's `chips: auto` went to the pod as
    `auto`, the node sized it without the pool's background load and refused to start. The pod
    now gets the envelope's layout, and a node built from its args starts."""
    from tiergate.sim_nodes.server.app import create_app
    from tiergate.sim_nodes.server.config import NodeConfig

    spec = example(name)
    args = parse([a.replace("$(POD_NAME)", "pod-0") for a in sim_node_args(spec, layout(spec))])
    config = NodeConfig(
        serving=spec_from_args(args),
        background_sequences=args.background_sequences or 0,
        background_context_tokens=args.background_context_tokens or 0,
    )
    create_app(config)  # raises EngineCapacityError when the background does not fit
    assert args.chips == layout(spec).chips
