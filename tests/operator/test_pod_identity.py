"""The user and group a pool's pods run as: the operator's --run-as-user / --run-as-group (the
chart passes its runAsUser / runAsGroup through $TIERGATE_RUN_AS_USER / $TIERGATE_RUN_AS_GROUP),
10001 without them; `tiergate render` prints the default."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kopf
import pytest
import yaml
from cli_status import run_cli
from operator_helpers import CATALOG, IMAGE, FakeCluster, pool

from tiergate.cli import build_parser
from tiergate.operator import handlers
from tiergate.operator.commands.operator_cmd import pod_settings
from tiergate.operator.render import DEFAULT_RUN_AS, PodSettings, RunAs

#: An id from the range OpenShift assigns a namespace (openshift.io/sa.scc.uid-range).
ASSIGNED = RunAs(user=1000680000, group=1000680001)


def identity(deployment: dict[str, Any]) -> tuple[Any, ...]:
    """(pod runAsUser, pod fsGroup, container runAsUser, container runAsGroup)."""
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    return (
        pod["securityContext"]["runAsUser"],
        pod["securityContext"]["fsGroup"],
        container["securityContext"]["runAsUser"],
        container["securityContext"]["runAsGroup"],
    )


def applied_deployment(memo: handlers.OperatorMemo, cluster: FakeCluster, **spec: Any) -> Any:
    handlers.inferencepool_resync(body=kopf.Body(pool(**spec)), patch=kopf.Patch(), memo=memo)
    (deployment,) = [m for m in cluster.applied if m["kind"] == "Deployment"]
    return deployment


def test_the_default_is_the_image_s_own_user() -> None:
    assert DEFAULT_RUN_AS == RunAs(user=10001, group=10001)
    cluster = FakeCluster()
    memo = handlers.OperatorMemo(catalog=CATALOG, images=IMAGE, cluster=cluster)
    assert identity(applied_deployment(memo, cluster)) == (10001, 10001, 10001, 10001)


@pytest.mark.parametrize(
    "spec",
    [{}, {"engine": "vllm", "model": "llama-3.1-70b", "accelerator": "h100-sxm"}],
    ids=["sim", "vllm"],
)
def test_the_operator_s_identity_reaches_every_pool_s_pods(spec: dict[str, Any]) -> None:
    cluster = FakeCluster()
    memo = handlers.OperatorMemo(
        catalog=CATALOG, images=IMAGE, cluster=cluster, pods=PodSettings(run_as=ASSIGNED)
    )
    deployment = applied_deployment(memo, cluster, **spec)
    assert identity(deployment) == (1000680000, 1000680001, 1000680000, 1000680001)
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True


def test_the_flags_default_to_the_environment_the_chart_sets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parser = build_parser("operator")
    assert pod_settings(parser.parse_args(["operator"])).run_as == DEFAULT_RUN_AS
    flags = ["operator", "--run-as-user", "1000680000", "--run-as-group", "1000680001"]
    assert pod_settings(parser.parse_args(flags)).run_as == ASSIGNED
    monkeypatch.setenv("TIERGATE_RUN_AS_USER", "1000680000")
    monkeypatch.setenv("TIERGATE_RUN_AS_GROUP", "1000680001")
    assert pod_settings(build_parser("operator").parse_args(["operator"])).run_as == ASSIGNED


@pytest.mark.parametrize("value", ["0", "-5", "root", "2147483648"])
def test_an_id_kubernetes_would_refuse_is_refused_by_the_operator(
    capsys: pytest.CaptureFixture[str], value: str
) -> None:
    status, _, err = run_cli(capsys, "operator", "--image", "t:1", "--run-as-user", value)
    assert status == 2 and "--run-as-user" in err


def test_render_prints_the_default_whatever_the_environment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`tiergate render` has no cluster and no chart: it renders the image's own user, and
    the operator's environment does not change that."""
    monkeypatch.setenv("TIERGATE_RUN_AS_USER", "1000680000")
    monkeypatch.setenv("TIERGATE_RUN_AS_GROUP", "1000680001")
    path = tmp_path / "pool.yaml"
    path.write_text(yaml.safe_dump(pool()), encoding="utf-8")
    status, out, _ = run_cli(capsys, "render", str(path))
    assert status == 0
    deployment = next(yaml.safe_load_all(out))
    assert identity(deployment) == (10001, 10001, 10001, 10001)


@pytest.mark.parametrize("command", ["operator", "render"])
@pytest.mark.parametrize("name", ["Regcred", "reg_cred", "x-", "a" * 254])
def test_a_pull_secret_kubernetes_would_refuse_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str, name: str
) -> None:
    path = tmp_path / "pool.yaml"
    path.write_text(yaml.safe_dump(pool()), encoding="utf-8")
    where = ["--image", "t:1"] if command == "operator" else [str(path)]
    status, out, err = run_cli(capsys, command, *where, "--image-pull-secret", name)
    assert status == 2 and not out
    assert "--image-pull-secret" in err and "is not a Secret's name" in err
    assert "Traceback" not in err
