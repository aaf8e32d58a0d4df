"""The chart's monitoring objects: the dashboard ConfigMap, the PodMonitors and the
PrometheusRule; each off by default, each shaped by its values. The dashboard's JSON is what
tools/dashboard.py writes. (test_chart_monitoring_proof.py runs them on a real Prometheus.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from chart_helpers import (
    CHART,
    NAMESPACE,
    OPERATOR,
    RELEASE,
    Helm,
    HelmFailed,
    Manifest,
    find,
    one,
)

from tiergate.pools.sim_node_pods import HTTP_PORT_NAME, POOL_LABEL, SIM_NODE_NAME

FULLNAME = f"{RELEASE}-tiergate"
MONITORING_KINDS = ("PodMonitor", "PrometheusRule")


def test_the_dashboard_json_is_what_its_generator_writes() -> None:
    result = subprocess.run(
        [sys.executable, "-P", str(CHART.parents[1] / "tools" / "dashboard.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_monitoring_is_off_by_default(default_manifests: list[Manifest]) -> None:
    for kind in MONITORING_KINDS:
        assert not find(default_manifests, kind)
    assert not find(default_manifests, "ConfigMap", f"{FULLNAME}-dashboard")


def test_the_dashboard_configmap_carries_the_json_and_the_sidecar_label(helm: Helm) -> None:
    manifests = helm.template(
        sets=["monitoring.dashboard.enabled=true", "monitoring.dashboard.labels.team=ml"]
    )
    config_map = one(manifests, "ConfigMap", f"{FULLNAME}-dashboard")
    assert config_map["metadata"]["namespace"] == NAMESPACE
    labels = config_map["metadata"]["labels"]
    assert labels["grafana_dashboard"] == "1" and labels["team"] == "ml"
    shipped = json.loads(config_map["data"]["tiergate.json"])
    assert shipped == json.loads((CHART / "dashboards" / "tiergate.json").read_text())


def test_the_sidecar_label_is_configurable(helm: Helm, tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(
        "monitoring:\n  dashboard:\n    enabled: true\n"
        "    labels: {grafana_dashboard: null, dashboards: tiergate}\n"
    )
    manifests = helm.template(values=[values])
    labels = one(manifests, "ConfigMap", f"{FULLNAME}-dashboard")["metadata"]["labels"]
    assert labels["dashboards"] == "tiergate" and "grafana_dashboard" not in labels


def test_pod_monitors_label_the_nodes_by_pool_and_tier_and_find_the_operator(
    variant_manifests: list[Manifest],
) -> None:
    nodes = one(variant_manifests, "PodMonitor", f"{FULLNAME}-sim-nodes")
    assert nodes["metadata"]["labels"]["release"] == "prometheus"
    assert nodes["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}
    assert nodes["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": SIM_NODE_NAME}
    (endpoint,) = nodes["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == HTTP_PORT_NAME and endpoint["interval"] == "15s"
    copied = {r["targetLabel"]: r["sourceLabels"] for r in endpoint["relabelings"]}
    pod_label = "__meta_kubernetes_pod_label_" + POOL_LABEL.replace(".", "_").replace("/", "_")
    assert copied == {
        "pool": [pod_label],
        "tier": ["__meta_kubernetes_pod_label_tiergate_dev_tier"],
    }
    operator = one(variant_manifests, "PodMonitor", OPERATOR)
    (endpoint,) = operator["spec"]["podMetricsEndpoints"]
    deployment = one(variant_manifests, "Deployment", OPERATOR)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert endpoint["port"] == "metrics" and ports["metrics"] == 8082
    args = container["args"]
    assert args[args.index("--metrics-port") + 1] == "8082"


def rules(manifests: list[Manifest]) -> list[dict[str, object]]:
    (rule,) = find(manifests, "PrometheusRule")
    return [r for group in rule["spec"]["groups"] for r in group["rules"]]


def test_every_alert_links_its_runbook_and_has_a_severity(helm: Helm) -> None:
    manifests = helm.template(sets=["monitoring.rules.enabled=true"])
    (rule,) = find(manifests, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["app.kubernetes.io/component"] == "monitoring"
    for alert in rules(manifests):
        annotations, labels = alert["annotations"], alert["labels"]
        assert isinstance(annotations, dict) and isinstance(labels, dict)
        name = str(alert["alert"])
        assert annotations["runbook_url"] == f"https://tiergate.dev/runbooks/#{name.lower()}"
        assert annotations["summary"] and annotations["description"]
        assert labels["severity"] in ("warning", "critical")


def test_objectives_windows_and_for_durations_are_values(variant_manifests: list[Manifest]) -> None:
    alerts = rules(variant_manifests)
    slo = [a for a in alerts if a["alert"] == "TiergateTierSLOBurn"]
    # The variant sets premium's objective and removes wafer-scale's; batched keeps its own.
    exprs = sorted(" ".join(str(a["expr"]).split()) for a in slo)
    assert len(exprs) == 2
    assert exprs[0].endswith("> 5") and 'tier="batched"' in exprs[0]
    assert exprs[1].endswith("> 1.5") and 'tier="premium"' in exprs[1]
    by_name = {a["alert"]: a for a in alerts}
    assert by_name["TiergatePoolNoReadyEndpoint"]["for"] == "1m"
    assert by_name["TiergateEndpointsEjected"]["for"] == "10m"
    url = by_name["TiergateBudgetNearExhaustion"]["annotations"]["runbook_url"]  # type: ignore[index]
    assert url == "https://docs.example.com/tiergate/runbooks/#tiergatebudgetnearexhaustion"
    (rule,) = find(variant_manifests, "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "prometheus"


@pytest.mark.parametrize(
    "assignment",
    [
        "monitoring.rules.ttftP99ObjectiveSeconds.turbo=1",
        "monitoring.rules.ttftP99ObjectiveSeconds.premium=0",
        "monitoring.rules.for.tierSloBurn=soon",
        "monitoring.rules.budgetUseRatio=1.5",
        "monitoring.rules.runbookBaseUrl=runbooks.md",
        "monitoring.rules.extra=1",
    ],
)
def test_the_schema_refuses_bad_monitoring_values(helm: Helm, assignment: str) -> None:
    with pytest.raises(HelmFailed, match="values don't meet the specifications"):
        helm.template(sets=["monitoring.rules.enabled=true", assignment])


def test_values_document_every_alert_duration() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    durations = values["monitoring"]["rules"]["for"]
    schema = json.loads((CHART / "values.schema.json").read_text())
    rules_schema = schema["properties"]["monitoring"]["properties"]["rules"]
    assert set(durations) == set(rules_schema["properties"]["for"]["required"])
