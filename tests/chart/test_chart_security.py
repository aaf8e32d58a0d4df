"""Every pod the chart creates (operator, router, helm test) is locked down the same way."""

from __future__ import annotations

from chart_helpers import Manifest, pod_specs


def test_there_are_pods_to_check(any_manifests: list[Manifest]) -> None:
    where = {w.split("/")[0] for w, _ in pod_specs(any_manifests)}
    assert where == {"Deployment", "Pod"} and len(pod_specs(any_manifests)) == 3


def test_pods_run_non_root_with_runtime_default_seccomp(any_manifests: list[Manifest]) -> None:
    for where, spec in pod_specs(any_manifests):
        context = spec["securityContext"]
        assert context["runAsNonRoot"] is True, where
        assert isinstance(context["runAsUser"], int) and context["runAsUser"] > 0, where
        assert context["seccompProfile"] == {"type": "RuntimeDefault"}, where
        for flag in ("hostNetwork", "hostPID", "hostIPC"):
            assert not spec.get(flag), where


def test_containers_are_read_only_unprivileged_and_capability_free(
    any_manifests: list[Manifest],
) -> None:
    for where, spec in pod_specs(any_manifests):
        for container in spec["containers"] + spec.get("initContainers", []):
            context = container["securityContext"]
            assert context["readOnlyRootFilesystem"] is True, where
            assert context["allowPrivilegeEscalation"] is False, where
            assert context["capabilities"] == {"drop": ["ALL"]}, where
            assert context["runAsNonRoot"] is True and context["runAsUser"] > 0, where
            assert context["seccompProfile"] == {"type": "RuntimeDefault"}, where
            assert not context.get("privileged"), where


def test_containers_have_requests_and_limits(any_manifests: list[Manifest]) -> None:
    for where, spec in pod_specs(any_manifests):
        for container in spec["containers"]:
            resources = container["resources"]
            for section in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(resources[section]), (where, section)


def test_tmp_is_a_writable_empty_dir_and_home(any_manifests: list[Manifest]) -> None:
    """With a read-only root, /tmp (HOME, TMPDIR) must be a volume of its own."""
    for where, spec in pod_specs(any_manifests):
        volumes = {v["name"]: v for v in spec["volumes"]}
        for container in spec["containers"]:
            mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
            assert "emptyDir" in volumes[mounts["/tmp"]["name"]], where
            assert not mounts["/tmp"].get("readOnly"), where
            env = {e["name"]: e.get("value") for e in container["env"]}
            assert env["HOME"] == "/tmp" and env["TMPDIR"] == "/tmp", where
            assert env["PYTHONDONTWRITEBYTECODE"] == "1", where


def test_the_test_pod_has_no_api_credentials(any_manifests: list[Manifest]) -> None:
    pods = [spec for where, spec in pod_specs(any_manifests) if where.startswith("Pod/")]
    assert [spec["automountServiceAccountToken"] for spec in pods] == [False]
