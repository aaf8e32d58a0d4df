"""`discovery.kubernetes` in the router's configuration, and how the commands pick a source."""

from __future__ import annotations

from pathlib import Path

import pytest
from polling_helpers import settled

from tiergate.cli import main
from tiergate.router.build import router_source
from tiergate.router.config import ConfigError, Discovery, KubernetesDiscovery, parse_config
from tiergate.router.discovery.kube import KubeSource
from tiergate.router.discovery.kube_client import resolve_namespace
from tiergate.router.discovery.view import FileSource

#: Real processes and servers, or seconds of work: left out of `make test-fast`.
pytestmark = pytest.mark.slow

POOL = "{name: a, tier: batched, model: llama-3.1-8b, accelerator: h100-sxm}"
KUBE = "discovery:\n  kubernetes:\n    namespace: inference\n"
KUBECONFIG = """
apiVersion: v1
kind: Config
clusters:
  - name: test
    cluster: {server: "http://127.0.0.1:9"}
users:
  - name: test
    user: {token: not-a-real-token}
contexts:
  - name: test
    context: {cluster: test, user: test, namespace: from-context}
current-context: test
"""


def test_kubernetes_discovery_needs_no_pools() -> None:
    config = parse_config(KUBE)
    assert config.discovery.kubernetes == KubernetesDiscovery(namespace="inference")
    assert config.pools == []
    assert parse_config("discovery: {kubernetes: {}}").discovery.kubernetes is not None
    assert parse_config(f"pools: [{POOL}]").discovery.kubernetes is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            f"{KUBE}pools: [{POOL}]",
            "router.yaml: pools must be empty when discovery.kubernetes is set "
            "(pools then come from InferencePool objects)",
        ),
        ("router: {port: 8080}", "router.yaml: pools: required unless discovery.kubernetes is set"),
        (
            "discovery: {kubernetes: {namespace: Not_A_Name}}",
            "router.yaml: discovery.kubernetes.namespace: String should match pattern",
        ),
        (
            "discovery: {kubernetes: {nameSpace: x}}",
            "router.yaml: discovery.kubernetes.nameSpace: Extra inputs are not permitted",
        ),
        ("discovery: {consul: {}}", "router.yaml: discovery.consul: Extra inputs"),
    ],
)
def test_discovery_mistakes_are_one_clear_line(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config(text, "router.yaml")
    assert str(raised.value).startswith(message)
    assert "\n" not in str(raised.value)


def test_every_discovery_field_is_documented() -> None:
    for model in (Discovery, KubernetesDiscovery):
        assert model.__doc__
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name}"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().err


def test_the_commands_refuse_pools_with_kubernetes_discovery_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "router.yaml"
    path.write_text(f"{KUBE}pools: [{POOL}]")
    code, err = run(capsys, "router", "--config", str(path))
    assert code == 2
    assert err.strip().splitlines() == [
        f"tiergate router: error: {path}: pools must be empty when discovery.kubernetes is set "
        "(pools then come from InferencePool objects)"
    ]
    path.write_text(KUBE)
    code, err = run(capsys, "up", "--config", str(path))
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "tiergate router --config FILE" in err


def test_no_kubernetes_api_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing-kubeconfig"))
    path = tmp_path / "router.yaml"
    path.write_text(KUBE)
    code, err = run(capsys, "router", "--config", str(path))
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "discovery.kubernetes: no Kubernetes API" in err


def test_the_file_picks_the_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    path = tmp_path / "router.yaml"
    path.write_text(KUBE)
    config, source = router_source(path)  # builds the client; no request is made yet
    assert isinstance(source, KubeSource) and not source.synced
    assert source.namespace == "inference" and config.pools == []

    path.write_text(f"pools: [{POOL}]")
    config, source = router_source(path)
    assert isinstance(source, FileSource) and source.synced
    assert list(source.view.pools) == ["a"]


def test_a_hot_reload_cannot_switch_to_kubernetes(tmp_path: Path) -> None:
    path = tmp_path / "router.yaml"
    path.write_text(f"pools: [{POOL}]")
    _, source = router_source(path)
    assert isinstance(source, FileSource)
    path.write_text(KUBE)
    assert not settled(source.reload_if_changed)
    assert source.file.reload_errors == 1 and list(source.view.pools) == ["a"]


def test_the_namespace_is_configured_else_the_pods_own_else_default(tmp_path: Path) -> None:
    pod_namespace = tmp_path / "namespace"
    assert resolve_namespace("inference", pod_namespace) == "inference"
    assert resolve_namespace(None, pod_namespace) == "default"
    pod_namespace.write_text("tiergate-system\n")
    assert resolve_namespace(None, pod_namespace) == "tiergate-system"
    assert resolve_namespace("inference", pod_namespace) == "inference"
