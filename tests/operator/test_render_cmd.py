"""`tiergate render POOL.yaml`: what the operator's reconcile applies for the pool, printed
without a cluster; a bad file is one line and exit status 2."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from operator_helpers import CATALOG, IMAGE, FakeCluster, clock, pool

from tiergate.cli import main
from tiergate.operator.reconcile import reconcile
from tiergate.operator.render import GENERATION_ANNOTATION, PodSettings


def rendered(tmp_path: Path, obj: dict[str, Any], capsys: pytest.CaptureFixture[str],
             *flags: str) -> list[dict[str, Any]]:  # fmt: skip
    path = tmp_path / "pool.yaml"
    path.write_text(yaml.safe_dump(obj), encoding="utf-8")
    assert main(["render", str(path), *flags]) == 0
    return list(yaml.safe_load_all(capsys.readouterr().out))


def as_rendered(applied: dict[str, Any]) -> dict[str, Any]:
    """An object the operator applied, without what it adds at apply time: its owner reference
    to the stored pool, and (on the Deployment) the generation it was applied from."""
    obj = copy.deepcopy(applied)
    meta = obj["metadata"]
    assert meta.pop("ownerReferences")[0]["kind"] == "InferencePool"
    annotations = meta.pop("annotations", {})
    assert set(annotations) <= {GENERATION_ANNOTATION}
    return obj


@pytest.mark.parametrize(
    "obj",
    [
        pool("premium"),
        pool("wafer-scale"),
        pool("batched", engine="vllm", model="llama-3.1-70b", accelerator="h100-sxm",
             huggingFaceTokenSecretRef={"name": "hf", "key": "token"}),
        pool("batched", engine="sglang", model="llama-3.1-70b", accelerator="h200"),
    ],
    ids=["premium", "wafer-scale", "vllm", "sglang"],
)  # fmt: skip
def test_render_prints_what_reconcile_applies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], obj: dict[str, Any]
) -> None:
    cluster = FakeCluster()
    reconcile(copy.deepcopy(obj), cluster, CATALOG, IMAGE, clock())
    assert [o["kind"] for o in cluster.applied] == ["Deployment", "Service"]
    printed = rendered(tmp_path, obj, capsys, "--image", "tiergate:0.1.0")
    assert printed == [as_rendered(o) for o in cluster.applied]
    assert printed[0]["metadata"]["namespace"] == "team-a"


def test_render_takes_the_operator_s_settings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    obj = pool("batched", engine="vllm", model="llama-3.1-8b", accelerator="h100-sxm")
    printed = rendered(tmp_path, obj, capsys, "--vllm-image", "mirror/vllm:1",
                       "--model-cache-claim", "weights", "--namespace", "other",
                       "--image-pull-secret", "mirror-pull")  # fmt: skip
    deployment = printed[0]
    pod = deployment["spec"]["template"]["spec"]
    assert deployment["metadata"]["namespace"] == "other"
    assert pod["containers"][0]["image"] == "mirror/vllm:1"
    cache = next(v for v in pod["volumes"] if v["name"] == "model-cache")
    assert cache["persistentVolumeClaim"] == {"claimName": "weights"}
    assert pod["imagePullSecrets"] == [{"name": "mirror-pull"}]
    cluster = FakeCluster()
    settings = PodSettings(model_cache_claim="weights", pull_secrets=("mirror-pull",))
    reconcile(copy.deepcopy(obj), cluster, CATALOG, IMAGE, clock(), pods=settings)
    applied = cluster.applied[0]["spec"]["template"]["spec"]
    assert next(v for v in applied["volumes"] if v["name"] == "model-cache") == cache
    assert applied["imagePullSecrets"] == pod["imagePullSecrets"]


def named(name: str, **metadata: str) -> dict[str, Any]:
    obj = pool("premium")
    return {**obj, "metadata": {**obj["metadata"], "name": name, **metadata}}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("kind: [", "is not valid YAML"),
        ("kind: Deployment\n", "expected an InferencePool"),
        (yaml.safe_dump(pool("wafer-scale", engine="vllm")), "engine vllm runs on GPUs"),
        (yaml.safe_dump(pool("premium", model="gpt-17")), "gpt-17"),
        (yaml.safe_dump({**pool("premium"), "metadata": {}}), "no metadata.name"),
        (yaml.safe_dump(named("Chat_Pool")), "must start with a letter"),
        (yaml.safe_dump(named("p" * 64)), "at most 63 characters"),
        (yaml.safe_dump(named("chat", namespace="Team_A")), "'Team_A': a namespace is"),
        (yaml.safe_dump(pool("premium", replicas=10**23)), "less than or equal to 2147483647"),
        (yaml.safe_dump(pool("premium", template={"labels": {"team": "team a"}})),
         "spec.template.labels.team: 'team a' is not a label value"),
        (yaml.safe_dump(pool("premium", template={"resources": {"limits": {"cpu": "two"}}})),
         "spec.template.resources.limits.cpu: 'two' is not a Kubernetes quantity"),
    ],
    ids=["yaml", "kind", "wafer-vllm", "unknown-model", "no-name", "bad-name", "long-name",
         "bad-namespace", "replicas", "label-value", "quantity"],
)  # fmt: skip
def test_a_bad_pool_file_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    path = tmp_path / "pool.yaml"
    path.write_text(text, encoding="utf-8")
    assert main(["render", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tiergate render: error: "), captured.err
    assert message in lines[0]


def test_an_image_the_operator_would_refuse_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "pool.yaml"
    path.write_text(yaml.safe_dump(pool("premium", template={"image": "x/miner:1"})))
    assert main(["render", str(path)]) == 2
    assert "x/miner:1 is not allowed" in capsys.readouterr().err


def test_a_namespace_flag_that_cannot_name_a_namespace_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "pool.yaml"
    path.write_text(yaml.safe_dump(pool("premium")), encoding="utf-8")
    assert main(["render", str(path), "--namespace", "team.a"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("tiergate render: error: namespace 'team.a': a namespace is")
