"""What the pods are told: args, environment, ports, probes, the router's config and tenants.

The router's config and tenants files are checked with the router's own loaders, so the chart
and the router cannot drift apart unnoticed.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_helpers import (
    CHART,
    NAMESPACE,
    OPERATOR,
    RELEASE,
    ROUTER,
    Helm,
    Manifest,
    one,
    pod_specs,
)

from tiergate.common.connection_limits import IDLE_TIMEOUT_S
from tiergate.pools import SECRET_NAME
from tiergate.router.config import MEDIA_DOMAIN, READ_TIMEOUT_S, WHOLE_REPLY_TIMEOUT_S, RouterConfig
from tiergate.router.tenants.registry import TenantRegistry, parse_tenants

CONFIG_PATH = "/etc/tiergate/router.yaml"
VARIANT_IMAGE = (
    "registry.example.com/platform/tiergate@sha256:"
    "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
)


def router_flags(pools_namespace: str = NAMESPACE) -> list[str]:
    """The operator's flags that say where the routers run, whose queues it reads."""
    return [
        "--router-namespace", NAMESPACE,
        "--router-selector", f"app.kubernetes.io/component=router,app.kubernetes.io/instance="
        f"{RELEASE},app.kubernetes.io/name=tiergate",
        "--router-metrics-port", "8090",
        "--router-pools-namespace", pools_namespace,
    ]  # fmt: skip


def container(manifests: list[Manifest], kind: str, name: str) -> dict[str, Any]:
    spec = one(manifests, kind, name)["spec"]
    pod = spec["template"]["spec"] if kind == "Deployment" else spec
    (only,) = pod["containers"]
    return dict(only)


def env_of(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}


def router_config(manifests: list[Manifest]) -> dict[str, Any]:
    data = one(manifests, "ConfigMap", ROUTER)["data"]["router.yaml"]
    config = yaml.safe_load(data)
    assert isinstance(config, dict)
    return config


def validate_with_router(config: dict[str, Any]) -> RouterConfig:
    """The router's own schema. `discovery` is being added to it on another branch: until that
    lands, the rest is validated and `discovery` is checked by shape (test below)."""
    if "discovery" not in RouterConfig.model_fields:
        config = {k: v for k, v in config.items() if k != "discovery"}
    return RouterConfig.model_validate(config)


def test_operator_watches_the_release_namespace_by_default(
    default_manifests: list[Manifest],
) -> None:
    operator = container(default_manifests, "Deployment", OPERATOR)
    assert operator["image"] == "tiergate:0.1.0"
    assert operator["args"] == [
        "operator", "--health-port", "8081", "--metrics-port", "8082",
        "--autoscale-interval", "15", "--namespace", NAMESPACE, *router_flags(),
    ]  # fmt: skip
    assert env_of(operator)["TIERGATE_IMAGE"] == operator["image"]
    assert env_of(operator)["POD_ID"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert operator["ports"] == [
        {"name": "health", "containerPort": 8081, "protocol": "TCP"},
        {"name": "metrics", "containerPort": 8082, "protocol": "TCP"},
    ]
    assert operator["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}


def test_the_operator_gets_the_engines_images_and_model_cache_from_the_values(
    default_manifests: list[Manifest], helm: Helm
) -> None:
    from tiergate.cli import build_parser
    from tiergate.operator.images import DEFAULT_SGLANG_IMAGE, DEFAULT_VLLM_IMAGE

    env = env_of(container(default_manifests, "Deployment", OPERATOR))
    # The chart's defaults are the operator's own (the releases its flags are rendered for).
    assert env["TIERGATE_VLLM_IMAGE"] == DEFAULT_VLLM_IMAGE
    assert env["TIERGATE_SGLANG_IMAGE"] == DEFAULT_SGLANG_IMAGE
    assert "TIERGATE_MODEL_CACHE_CLAIM" not in env
    manifests = helm.template(
        sets=[
            "engines.vllm.image=mirror/vllm:1",
            "engines.modelCache.persistentVolumeClaim=weights",
        ]
    )
    operator = container(manifests, "Deployment", OPERATOR)
    env = env_of(operator)
    assert env["TIERGATE_VLLM_IMAGE"] == "mirror/vllm:1"
    assert env["TIERGATE_MODEL_CACHE_CLAIM"] == "weights"
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            if isinstance(value, str):
                patch.setenv(name, value)
        parsed = build_parser("operator").parse_args(operator["args"])
    assert (parsed.vllm_image, parsed.model_cache_claim) == ("mirror/vllm:1", "weights")


def test_the_pools_pods_pull_with_the_chart_s_pull_secrets(helm: Helm) -> None:
    from tiergate.cli import build_parser
    from tiergate.operator.commands.operator_cmd import pod_settings

    manifests = helm.template(
        sets=["imagePullSecrets[0].name=regcred", "imagePullSecrets[1].name=mirror.pull"]
    )
    operator = container(manifests, "Deployment", OPERATOR)
    parsed = build_parser("operator").parse_args(operator["args"])
    assert pod_settings(parsed).pull_secrets == ("regcred", "mirror.pull")
    # the operator's own pod pulls with them too; the schema takes every Secret name the
    # operator does
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["properties"]["imagePullSecrets"]["items"]["properties"]["name"]["pattern"] == (
        SECRET_NAME
    )
    pods = dict(pod_specs(manifests))
    assert pods[f"Deployment/{OPERATOR}"]["imagePullSecrets"] == [
        {"name": "regcred"}, {"name": "mirror.pull"}
    ]  # fmt: skip


def test_operator_gets_one_namespace_flag_per_watched_namespace(
    variant_manifests: list[Manifest],
) -> None:
    operator = container(variant_manifests, "Deployment", OPERATOR)
    assert operator["args"] == [
        "operator", "--health-port", "8081", "--metrics-port", "8082",
        "--autoscale-interval", "15", "--namespace", "team-a", "--namespace", "team-b",
        "--image-pull-secret", "regcred", *router_flags("pools"),
    ]  # fmt: skip
    # Sim nodes run the very image the operator runs, digest and all.
    assert operator["image"] == env_of(operator)["TIERGATE_IMAGE"] == VARIANT_IMAGE
    assert operator["imagePullPolicy"] == "Always"


def test_operator_cluster_wide_and_allowed_images_become_its_flags(helm: Helm) -> None:
    manifests = helm.template(
        sets=[
            "operator.clusterWide=true",
            "operator.allowedImages={mirror.example.com/tiergate:0.1.0,lab/tiergate@sha256:ab}",
        ]
    )
    args = container(manifests, "Deployment", OPERATOR)["args"]
    assert args[7:] == [
        "--all-namespaces",
        "--allowed-image", "mirror.example.com/tiergate:0.1.0",
        "--allowed-image", "lab/tiergate@sha256:ab", *router_flags(),
    ]  # fmt: skip
    from tiergate.cli import build_parser
    from tiergate.operator.commands.operator_cmd import image_policy
    from tiergate.operator.images import ImagePolicy

    parsed = build_parser("operator").parse_args(args)
    parsed.image = env_of(container(manifests, "Deployment", OPERATOR))["TIERGATE_IMAGE"]
    assert image_policy(parsed) == ImagePolicy(
        "tiergate:0.1.0",
        frozenset({"mirror.example.com/tiergate:0.1.0", "lab/tiergate@sha256:ab"}),
    )


def test_the_autoscaler_s_interval_is_a_value_the_operator_parses(helm: Helm) -> None:
    from tiergate.cli import build_parser
    from tiergate.operator.commands.operator_cmd import autoscale_interval

    manifests = helm.template(sets=["operator.autoscaleIntervalSeconds=5"])
    args = container(manifests, "Deployment", OPERATOR)["args"]
    assert args[5:7] == ["--autoscale-interval", "5"]
    assert autoscale_interval(build_parser("operator").parse_args(args)) == 5


def test_the_pools_pods_run_as_the_chart_s_user_and_group(
    default_manifests: list[Manifest], helm: Helm, tmp_path: Path
) -> None:
    """runAsUser / runAsGroup reach the pods the operator renders for pools, through the
    environment its flags default to; ids as large as the ranges OpenShift assigns, read from
    a values file (where YAML numbers reach the templates as floats), stay whole numbers."""
    from tiergate.cli import build_parser
    from tiergate.operator.commands.operator_cmd import pod_settings
    from tiergate.operator.render import DEFAULT_RUN_AS, RunAs

    def operator_run_as(manifests: list[Manifest]) -> RunAs:
        operator = container(manifests, "Deployment", OPERATOR)
        with pytest.MonkeyPatch.context() as patch:
            for name, value in env_of(operator).items():
                if isinstance(value, str):
                    patch.setenv(name, value)
            return pod_settings(build_parser("operator").parse_args(operator["args"])).run_as

    assert operator_run_as(default_manifests) == DEFAULT_RUN_AS
    values = tmp_path / "ids.yaml"
    values.write_text("runAsUser: 1000680000\nrunAsGroup: 1000680001\n", encoding="utf-8")
    manifests = helm.template(values=[values])
    assert operator_run_as(manifests) == RunAs(user=1000680000, group=1000680001)
    for where, spec in pod_specs(manifests):
        context = spec["securityContext"]
        ids = (context["runAsUser"], context["runAsGroup"], context["fsGroup"])
        for c in spec["containers"]:
            ids += (c["securityContext"]["runAsUser"], c["securityContext"]["runAsGroup"])
        # Not 1.00068e+09, which the API server refuses for an integer field.
        assert [type(i) for i in ids] == [int] * len(ids), (where, ids)
        assert ids[:3] == (1000680000, 1000680001, 1000680001), where
        assert ids[3:] == (1000680000, 1000680001) * len(spec["containers"]), where


def test_operator_is_never_two_at_once(default_manifests: list[Manifest]) -> None:
    assert one(default_manifests, "Deployment", OPERATOR)["spec"]["strategy"]["type"] == "Recreate"


def test_router_container_contract(default_manifests: list[Manifest]) -> None:
    router = container(default_manifests, "Deployment", ROUTER)
    assert router["args"] == ["router", "--config", CONFIG_PATH, "--log-level", "info"]
    assert router["ports"] == [
        {"name": "http", "containerPort": 8080, "protocol": "TCP"},
        {"name": "metrics", "containerPort": 8090, "protocol": "TCP"},
    ]
    assert router["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert router["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    service = one(default_manifests, "Service", ROUTER)["spec"]
    assert service["type"] == "ClusterIP"
    assert service["ports"] == [  # the tenants' Service: no metrics port
        {"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"}
    ]
    metrics = one(default_manifests, "Service", ROUTER + "-metrics")["spec"]
    assert (metrics["type"], metrics["selector"]) == ("ClusterIP", service["selector"])
    assert metrics["ports"] == [
        {"name": "metrics", "port": 8090, "targetPort": "metrics", "protocol": "TCP"}
    ]


def test_router_config_without_tenants_is_open_mode(default_manifests: list[Manifest]) -> None:
    config = router_config(default_manifests)
    assert config["router"] == {
        "host": "0.0.0.0",
        "port": 8080,
        "metricsPort": 8090,
        "ledgerPath": "/var/lib/tiergate/ledger.sqlite",
        "ledgerRetentionDays": 90,
        "ledgerMaxSize": "768Mi",
        "admissionOrder": "fair",
        "upstreamReadTimeoutS": 300,
        "wholeReplyTimeoutS": 600,
        "shutdownGraceS": 120,
    }
    assert config["discovery"] == {"kubernetes": {"namespace": NAMESPACE}}
    assert config["pools"] == []
    parsed = validate_with_router(config)
    assert parsed.router.tenants_file is None and parsed.router.port == 8080
    assert parsed.router.metrics_port == 8090 and parsed.router.metrics_bind_host() == "0.0.0.0"
    assert parsed.router.ledger_max_size == 768 * 2**20
    # The chart's timeouts are the router's own defaults.
    assert parsed.router.upstream_read_timeout_s == READ_TIMEOUT_S
    assert parsed.router.whole_reply_timeout_s == WHOLE_REPLY_TIMEOUT_S
    assert parsed.router.allowed_media_domains == ()  # no media URL is fetched
    # Streams get two minutes to finish when a pod stops, within the pod's own grace period.
    assert parsed.router.shutdown_grace_s == 120
    pod = one(default_manifests, "Deployment", ROUTER)["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] > parsed.router.shutdown_grace_s


def test_ledger_limits_can_be_switched_off(helm: Helm) -> None:
    manifests = helm.template(
        sets=["router.ledger.retentionDays=null"], set_strings=["router.ledger.maxSize="]
    )
    router = validate_with_router(router_config(manifests)).router
    assert (router.ledger_retention_days, router.ledger_max_size) == (None, None)


def test_router_config_with_tenants_and_a_discovery_namespace(
    variant_manifests: list[Manifest],
) -> None:
    config = router_config(variant_manifests)
    assert config["router"]["tenantsFile"] == "/etc/tiergate/tenants"
    assert config["discovery"] == {"kubernetes": {"namespace": "pools"}}
    router = validate_with_router(config).router
    assert str(router.tenants_file) == "/etc/tiergate/tenants"
    assert router.admission_order == "fcfs"
    assert router.whole_reply_timeout_s == 1800
    assert router.allowed_media_domains == ("images.example.com", "*.cdn.example.net")


def test_the_chart_checks_media_domains_as_the_router_does() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    items = schema["properties"]["router"]["properties"]["allowedMediaDomains"]["items"]
    assert items["pattern"] == f"^({MEDIA_DOMAIN.pattern})$"


def test_router_policy_values_become_the_router_s_policy(
    default_manifests: list[Manifest], variant_manifests: list[Manifest]
) -> None:
    assert "policy" not in router_config(default_manifests)["router"]  # the router's default
    policy = validate_with_router(router_config(variant_manifests)).router.policy
    assert policy.summary() == (
        "filters=random-sample,ejected-filter scorers=load*2,predicted-latency-scorer*1 "
        "picker=weighted-random-picker"
    )
    assert policy.scorers[1].parameters == {"otherContextTokens": 30000}


def test_router_connection_values_become_the_router_s_limits(
    default_manifests: list[Manifest], variant_manifests: list[Manifest]
) -> None:
    assert "connections" not in router_config(default_manifests)["router"]  # the router's own
    connections = validate_with_router(router_config(variant_manifests)).router.connections
    limits = connections.limits()
    assert (limits.header_timeout_s, limits.body_timeout_s, limits.idle_timeout_s) == (
        10,
        60,
        IDLE_TIMEOUT_S,
    )
    assert connections.max_connections == 4000


def config_volume(manifests: list[Manifest]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the /etc/tiergate mount, its volume) of the router."""
    pod = one(manifests, "Deployment", ROUTER)["spec"]["template"]["spec"]
    (mount,) = [
        m for m in pod["containers"][0]["volumeMounts"] if m["mountPath"] == "/etc/tiergate"
    ]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    return mount, volume


def test_inline_tenants_become_a_secret_the_router_can_load(
    variant_manifests: list[Manifest],
) -> None:
    secret = one(variant_manifests, "Secret", f"{ROUTER}-tenants")
    text = base64.b64decode(secret["data"]["tenants.yaml"]).decode()
    registry: TenantRegistry = parse_tenants(yaml.safe_load(text), source="chart")
    team_a = registry.authenticate("Bearer sk-team-a-test-key")
    assert (team_a.name, team_a.weight, team_a.max_queued) == ("team-a", 2, 32)
    assert (team_a.spill.to, team_a.spill.max_output_usd_per_million) == (("premium",), 25)
    team_b = registry.authenticate("Bearer sk-team-b-test-key")
    assert team_b.allowed_tiers == ("wafer-scale",) and team_b.budget_usd == 50
    # Mounted where tenantsFile points: the router reads tenants.yaml inside that folder.
    mount, volume = config_volume(variant_manifests)
    assert mount["readOnly"] is True
    sources = volume["projected"]["sources"]
    assert sources[0]["configMap"] == {
        "name": ROUTER,
        "items": [{"key": "router.yaml", "path": "router.yaml"}],
    }
    assert sources[1]["secret"] == {
        "name": f"{ROUTER}-tenants",
        "items": [{"key": "tenants.yaml", "path": "tenants/tenants.yaml"}],
    }


def test_existing_tenants_secret_is_mounted_by_its_key(helm: Helm) -> None:
    manifests = helm.template(
        sets=["router.tenants.existingSecret=keys", "router.tenants.existingSecretKey=t.yaml"]
    )
    assert not [m for m in manifests if m["kind"] == "Secret"]
    _, volume = config_volume(manifests)
    assert volume["projected"]["sources"][1]["secret"] == {
        "name": "keys",
        "items": [{"key": "t.yaml", "path": "tenants/tenants.yaml"}],
    }
    assert router_config(manifests)["router"]["tenantsFile"] == "/etc/tiergate/tenants"


def ledger_volume(manifests: list[Manifest]) -> dict[str, Any]:
    pod = one(manifests, "Deployment", ROUTER)["spec"]["template"]["spec"]
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "ledger"]
    assert mount["mountPath"] == "/var/lib/tiergate"
    (volume,) = [v for v in pod["volumes"] if v["name"] == "ledger"]
    return dict(volume)


def test_ledger_is_an_empty_dir_by_default(default_manifests: list[Manifest]) -> None:
    assert ledger_volume(default_manifests) == {"name": "ledger", "emptyDir": {}}


def test_ledger_persistence_uses_a_kept_claim(persistent_manifests: list[Manifest]) -> None:
    claim = one(persistent_manifests, "PersistentVolumeClaim", f"{ROUTER}-ledger")
    assert claim["spec"]["resources"]["requests"]["storage"] == "5Gi"
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert ledger_volume(persistent_manifests)["persistentVolumeClaim"] == {
        "claimName": f"{ROUTER}-ledger"
    }
    strategy = one(persistent_manifests, "Deployment", ROUTER)["spec"]["strategy"]
    assert strategy == {"type": "Recreate"}


def test_helm_test_pod_sends_one_request_through_the_router(
    default_manifests: list[Manifest], variant_manifests: list[Manifest]
) -> None:
    pod = one(default_manifests, "Pod", f"{RELEASE}-tiergate-test-request")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    args = container(default_manifests, "Pod", f"{RELEASE}-tiergate-test-request")["args"]
    assert args[:3] == ["bench", "--router", f"http://{ROUTER}.{NAMESPACE}.svc:8080"]
    flags = dict(zip(args[3::2], args[4::2], strict=True))
    assert flags["--requests"] == "1" and flags["--concurrency"] == "1"
    assert flags["--mix"] == "batched=1"
    variant = container(variant_manifests, "Pod", f"{RELEASE}-tiergate-test-request")
    assert "--mix" in variant["args"] and "premium=1" in variant["args"]
    assert env_of(variant)["TIERGATE_API_KEY"] == {
        "secretKeyRef": {"name": "tiergate-test-key", "key": "api-key"}
    }


def test_the_real_cli_accepts_the_router_and_test_pod_arguments(
    default_manifests: list[Manifest],
) -> None:
    """The chart's command lines parse with `tiergate router` and `tiergate bench` as they are
    (`tiergate operator`'s: test_chart_rbac, against what the chart grants it)."""
    from tiergate.cli import build_parser

    router_args = container(default_manifests, "Deployment", ROUTER)["args"]
    parsed = build_parser("router").parse_args(router_args)
    assert str(parsed.config) == CONFIG_PATH and parsed.log_level == "info"
    bench_args = container(default_manifests, "Pod", f"{RELEASE}-tiergate-test-request")["args"]
    parsed = build_parser("bench").parse_args(bench_args)
    assert parsed.requests == 1 and parsed.concurrency == 1


def notes(helm: Helm, *sets: str) -> str:
    args = ["install", RELEASE, str(CHART)]
    args += ["--dry-run=client", "--namespace", NAMESPACE]
    for assignment in sets:
        args += ["--set", assignment]
    out = helm.run(*args)
    return out.split("NOTES:", 1)[1]


def test_notes_show_a_first_request_and_warn_when_unauthenticated(helm: Helm) -> None:
    text = notes(helm)
    assert f"kubectl port-forward -n {NAMESPACE} svc/{ROUTER} 8080:8080" in text
    assert "/v1/chat/completions" in text and "x-tiergate-tier" in text
    assert "kubectl apply" in text and "examples/" in text
    assert "AUTHENTICATION IS OFF" in text


def test_notes_say_which_namespaces_are_watched_and_that_others_are_ignored(
    helm: Helm,
) -> None:
    text = notes(helm)
    assert f"reconciles InferencePools in namespace {NAMESPACE} only" in text
    assert "InferencePools in any other namespace are ignored" in text
    assert f"kubectl apply -n {NAMESPACE} -f examples/" in text
    assert "WARNING: the router discovers pools in" not in text
    listed = notes(helm, "operator.watchNamespaces={team-a,team-b}")
    assert "reconciles InferencePools in namespaces team-a, team-b only" in listed
    # The router looks in the release namespace, which is not watched: pools there never run.
    assert f"WARNING: the router discovers pools in {NAMESPACE}, which the operator" in listed
    everywhere = notes(helm, "operator.clusterWide=true")
    assert "reconciles InferencePools in all namespaces (operator.clusterWide)" in everywhere
    assert "are ignored" not in everywhere


def test_notes_show_where_the_logs_are(helm: Helm) -> None:
    text = notes(helm)
    assert f"kubectl logs -n {NAMESPACE} deploy/{OPERATOR}" in text
    assert f"kubectl logs -n {NAMESPACE} deploy/{ROUTER}" in text


def test_notes_with_tenants_ask_for_a_key_instead(helm: Helm) -> None:
    text = notes(helm, "router.tenants.existingSecret=keys")
    assert "AUTHENTICATION IS OFF" not in text
    assert "Authorization: Bearer" in text and "tests.apiKeySecret" in text
