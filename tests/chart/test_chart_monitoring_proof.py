"""The chart's dashboard and alerts, proven on a real Prometheus: `tiergate up` runs the three
seed tiers, a real Prometheus scrapes the router (on its metrics port), every sim node
(labelled with pool and tier, as the chart's PodMonitor labels them) and the operator's
metrics endpoint (served here without a cluster), and loads the chart's rendered
PrometheusRule; a short mixed load goes through the router. Then every dashboard query returns
data, every alert's expression passes `promtool check rules` and evaluates, the alerts the
load should not trigger are quiet, and four fire on purpose: a tenant's budget spent, a
failed reconciliation, a pool the operator reports degraded, and a pool whose only node was
stopped (held while the operator says the pool is starting).
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from chart_helpers import CHART, Helm, find
from loopback_ports import free_ports
from polling_helpers import until
from process_tree import children
from prometheus_server import PrometheusMissing, PrometheusServer, binaries, check_rules

from tiergate.local.up_cmd import default_config_text
from tiergate.operator.metrics import OperatorMetrics

#: Real processes and servers, or seconds of work: left out of `make test-fast`.
pytestmark = pytest.mark.slow

DASHBOARD = CHART / "dashboards" / "tiergate.json"
#: What Grafana would put in for the template variables: every tier, pool and tenant; a rate
#: window of several of this Prometheus' 1 s scrapes.
VARIABLES = {"$tier": ".*", "$pool": ".*", "$tenant": ".*", "$__rate_interval": "10s"}
TENANTS = """
tenants:
  - {name: alice, apiKeys: [alice-key-0123456789], budgetUsd: 1000, budgetPeriod: day}
  - {name: bob, apiKeys: [bob-key-0123456789], allowedTiers: [batched]}
  - {name: carol, apiKeys: [carol-key-0123456789], budgetUsd: 0.000001, budgetPeriod: day}
"""
#: The namespace of the pools the router serves (its discovery namespace).
NAMESPACE = "team-pools"
#: Alerts the load is meant to trigger: carol spends more than her budget with one request.
EXPECTED = {("TiergateBudgetNearExhaustion", "carol")}


@dataclass
class Node:
    pool: str
    tier: str
    port: int


@dataclass
class System:
    router: str
    #: host:port of the router's metrics port, where Prometheus scrapes it.
    metrics: str
    up: subprocess.Popen[bytes]
    nodes: list[Node]


@pytest.fixture(scope="module")
def prometheus_binaries() -> tuple[Path, Path]:
    try:
        return binaries()
    except PrometheusMissing as missing:
        pytest.fail(str(missing), pytrace=False)


@pytest.fixture(scope="module")
def rules_file(helm: Helm, prometheus_binaries: tuple[Path, Path], tmp_path_factory: Any) -> Path:
    """The chart's PrometheusRule as a Prometheus rule file, every `for` set to 0s (a value,
    not a special case), checked by promtool."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    sets = ["monitoring.rules.enabled=true"]
    sets += [f"monitoring.rules.for.{name}=0s" for name in values["monitoring"]["rules"]["for"]]
    (rule,) = find(helm.template(sets=sets), "PrometheusRule")
    path = tmp_path_factory.mktemp("rules") / "tiergate-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    check_rules(prometheus_binaries[1], path)
    return path


@pytest.fixture(scope="module")
def system(tmp_path_factory: Any) -> Iterator[System]:
    """`tiergate up` with the embedded default's pools, a ledger and tenants of its own."""
    root = tmp_path_factory.mktemp("up")
    (root / "tenants.yaml").write_text(TENANTS)
    config = yaml.safe_load(default_config_text())
    config["router"].update(
        ledgerPath=str(root / "ledger.sqlite"), tenantsFile=str(root / "tenants.yaml")
    )
    (root / "up.yaml").write_text(yaml.safe_dump(config))
    replicas = [(p["name"], p["tier"]) for p in config["pools"] for _ in range(p["replicas"])]
    first_node = free_ports(len(replicas) + 2)  # the nodes', then the router's two
    router_port = first_node + len(replicas)
    metrics_port = router_port + 1
    log = (root / "up.log").open("wb")
    argv = [sys.executable, "-P", "-m", "tiergate", "up", "--config", str(root / "up.yaml"),
            "--port", str(router_port), "--metrics-port", str(metrics_port),
            "--first-node-port", str(first_node)]  # fmt: skip
    up = subprocess.Popen(argv, stdout=log, stderr=log)
    log.close()
    router = f"http://127.0.0.1:{router_port}"

    def ready() -> bool:
        assert up.poll() is None, f"tiergate up exited: {(root / 'up.log').read_text()[-2000:]}"
        try:
            return httpx.get(router + "/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        until(ready, "tiergate up did not become ready", within_s=120)
        nodes = [Node(pool, tier, first_node + i) for i, (pool, tier) in enumerate(replicas)]
        yield System(router, f"127.0.0.1:{metrics_port}", up, nodes)
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(timeout=30)
        except subprocess.TimeoutExpired:
            up.kill()
            up.wait()


@dataclass
class Operator:
    metrics: OperatorMetrics
    target: str


@pytest.fixture(scope="module")
def operator() -> Iterator[Operator]:
    """The operator's metrics endpoint, as `tiergate operator --metrics-port` serves it."""
    port = free_ports(1)
    metrics = OperatorMetrics()
    server = metrics.serve(port, host="127.0.0.1")
    try:
        yield Operator(metrics, f"127.0.0.1:{port}")
    finally:
        server.shutdown()
        server.server_close()


def router_relabelings(helm: Helm) -> list[dict[str, Any]]:
    """The router ServiceMonitor's relabelings, as the Prometheus Operator writes them into
    the scrape config (with `router.discoveryNamespace`: the router serves that namespace's
    pools)."""
    sets = ["router.serviceMonitor.enabled=true", f"router.discoveryNamespace={NAMESPACE}"]
    (monitor,) = find(helm.template(sets=sets), "ServiceMonitor")
    keys = {"sourceLabels": "source_labels", "targetLabel": "target_label"}
    return [
        {keys.get(key, key): value for key, value in relabeling.items()}
        for relabeling in monitor["spec"]["endpoints"][0]["relabelings"]
    ]


@pytest.fixture(scope="module")
def prometheus(
    helm: Helm, system: System, operator: Operator, rules_file: Path, tmp_path_factory: Any
) -> Iterator[PrometheusServer]:
    scrape_configs = [
        {"job_name": "tiergate-operator", "static_configs": [{"targets": [operator.target]}]},
        {"job_name": "tiergate-router", "static_configs": [{"targets": [system.metrics]}],
         "relabel_configs": router_relabelings(helm)},
        {"job_name": "tiergate-sim-nodes",
         "static_configs": [{"targets": [f"127.0.0.1:{n.port}"],
                             "labels": {"pool": n.pool, "tier": n.tier}} for n in system.nodes]},
    ]  # fmt: skip
    server = PrometheusServer(
        tmp_path_factory.mktemp("prometheus"), scrape_configs, rule_files=[rules_file]
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


def ask(router: str, key: str, tier: str | None, model: str, stream: bool) -> int:
    headers = {"authorization": f"Bearer {key}"}
    if tier is not None:
        headers["x-tiergate-tier"] = tier
    body = {"model": model, "messages": [{"role": "user", "content": "Say hello."}],
            "max_tokens": 12, "stream": stream}  # fmt: skip
    with httpx.stream("POST", router + "/v1/chat/completions", json=body, headers=headers,
                      timeout=120) as reply:  # fmt: skip
        reply.read()
        return reply.status_code


@dataclass
class Load:
    start_s: float
    end_s: float
    statuses: dict[str, list[int]]


@pytest.fixture(scope="module")
def load(system: System, prometheus: PrometheusServer) -> Load:
    """A mixed load: every tier, streamed and not, three tenants; bob asks for a tier he may
    not use (refused), carol's budget runs out after her first request (refused)."""
    until(lambda: bool(prometheus.query('up{job="tiergate-router"} == 1')), "router not scraped")
    start_s = time.time()
    plan = []
    for i in range(60):
        tier, model = [("batched", "frontier"), ("premium", "frontier"),
                       (None, "frontier-spark")][i % 3]  # fmt: skip
        plan.append(("alice", "alice-key-0123456789", tier, model, i % 2 == 0))
    plan += [("bob", "bob-key-0123456789", "premium", "frontier", False)] * 3
    plan += [("carol", "carol-key-0123456789", "batched", "frontier", False)] * 3
    statuses: dict[str, list[int]] = {}
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = [(who, pool.submit(ask, system.router, key, tier, model, stream))
                   for who, key, tier, model, stream in plan]  # fmt: skip
        for who, future in futures:
            statuses.setdefault(who, []).append(future.result())
    assert set(statuses["alice"]) == {200}, statuses
    assert set(statuses["bob"]) == {403}, statuses
    assert 429 in statuses["carol"], statuses
    sent = len(plan)

    def scraped() -> bool:
        found = prometheus.query("sum(tiergate_requests_total)")
        return bool(found) and float(found[0]["value"][1]) >= sent

    until(scraped, "Prometheus did not scrape the load's requests", within_s=30)
    end_s = time.time()
    targets = 2 + len(system.nodes)  # the router, the operator, the nodes
    until(lambda: len(prometheus.query("up == 1")) == targets, "a scrape target is down")

    def scraped_since_end(scrapes: int) -> bool:
        # Every target scraped a few times more: each rate() window over the load's end holds
        # two samples at least, of every series the load created.
        found = prometheus.query(f"min(timestamp(up)) > {end_s + scrapes}")
        return bool(found)

    until(lambda: scraped_since_end(3), "targets not scraped after the load", within_s=30)
    return Load(start_s, end_s, statuses)


def panel_queries() -> list[tuple[str, str]]:
    """(panel title, query with the template variables filled in) of every dashboard panel."""
    board = json.loads(DASHBOARD.read_text())
    queries = []
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            expr = fill(target["expr"])
            assert "$" not in expr, f"{panel['title']}: a variable left in {expr}"
            queries.append((f"{panel['title']} [{target['refId']}]", expr))
    return queries


def fill(expr: str) -> str:
    for name, value in sorted(VARIABLES.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(name, value)
    return expr


def has_values(series: list[dict[str, Any]]) -> bool:
    return any(not math.isnan(float(v)) for s in series for _, v in s.get("values", []))


def test_every_dashboard_query_returns_data(prometheus: PrometheusServer, load: Load) -> None:
    queries = panel_queries()
    assert len(queries) >= 20
    empty = []
    for title, expr in queries:
        series = prometheus.query_range(expr, load.start_s - 5, time.time())
        if not has_values(series):
            empty.append(f"{title}: {expr}")
    assert not empty, "panels without data:\n" + "\n".join(empty)


def test_every_template_variable_lists_values(prometheus: PrometheusServer, load: Load) -> None:
    board = json.loads(DASHBOARD.read_text())
    variables = [v for v in board["templating"]["list"] if v["type"] == "query"]
    assert {v["name"] for v in variables} == {"tier", "pool", "tenant"}
    for variable in variables:
        found = re.fullmatch(r"label_values\((.+), (\w+)\)", fill(variable["query"]))
        assert found, variable["query"]
        selector, label = found.groups()
        values = prometheus.api(f"label/{label}/values", **{"match[]": selector})
        assert values, f"variable {variable['name']}: no values of {label} in {selector}"


def alert_rules(rules_file: Path) -> list[dict[str, Any]]:
    groups = yaml.safe_load(rules_file.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def test_alerts_the_load_should_not_trigger_are_quiet(
    prometheus: PrometheusServer, rules_file: Path, load: Load
) -> None:
    rules = alert_rules(rules_file)
    assert {r["alert"] for r in rules} == {
        "TiergateTierSLOBurn", "TiergatePoolNoReadyEndpoint", "TiergatePoolDegraded",
        "TiergateEndpointsEjected",
        "TiergateLedgerBacklogGrowing", "TiergateLedgerRecordsDropped",
        "TiergateBudgetNearExhaustion", "TiergateOperatorReconcileErrors",
        "TiergateAutoscalerCannotAct", "TiergateDiscoveryFailing",
    }  # fmt: skip
    noisy = []
    for rule in rules:
        for series in prometheus.query(rule["expr"]):
            key = (rule["alert"], series["metric"].get("tenant"))
            if key not in EXPECTED:
                noisy.append(f"{rule['alert']} {series['metric']} = {series['value'][1]}")
    assert not noisy, "alerts the load should not trigger:\n" + "\n".join(noisy)

    def firing() -> set[tuple[str, str | None]]:
        return {(a["labels"]["alertname"], a["labels"].get("tenant")) for a in prometheus.firing()}

    until(lambda: firing() == EXPECTED, f"firing: {firing()}, expected {EXPECTED}", within_s=30)
    (budget,) = prometheus.firing()
    assert budget["annotations"]["runbook_url"].endswith("#tiergatebudgetnearexhaustion")


def test_a_failed_reconciliation_fires_the_operator_alert(
    operator: Operator, prometheus: PrometheusServer, load: Load
) -> None:
    operator.metrics.count("resync", "error")

    def fired() -> bool:
        names = {a["labels"]["alertname"] for a in prometheus.firing()}
        return "TiergateOperatorReconcileErrors" in names

    until(fired, "TiergateOperatorReconcileErrors did not fire", within_s=30)


def test_an_autoscaler_that_cannot_act_fires_its_alert(
    operator: Operator, prometheus: PrometheusServer, load: Load
) -> None:
    ALERT = "TiergateAutoscalerCannotAct"  # noqa: N806
    operator.metrics.count_decision("Holding")  # acting as it should: no alert
    operator.metrics.count_decision("SloUnreachable")

    def fired() -> dict[str, Any] | None:
        alerts = prometheus.firing()
        return next((a for a in alerts if a["labels"]["alertname"] == ALERT), None)

    until(lambda: fired() is not None, f"{ALERT} did not fire", within_s=30)
    alert = fired()
    assert alert is not None
    assert alert["annotations"]["runbook_url"].endswith("#tiergateautoscalercannotact")


def test_a_pool_the_operator_reports_degraded_fires_its_alert(
    operator: Operator, prometheus: PrometheusServer, load: Load
) -> None:
    """Pods that cannot start fire it; a cold start and a settled rollout do not."""
    conditions = operator.metrics.pool_conditions

    def degraded() -> set[str]:
        return {
            a["labels"]["pool"]
            for a in prometheus.firing()
            if a["labels"]["alertname"] == "TiergatePoolDegraded"
        }

    settled = {"type": "Progressing", "status": "False", "reason": "Settled"}
    starting = {"type": "Degraded", "status": "False", "reason": "Starting"}
    conditions.record(
        "gpu-pools",
        "cold",
        "batched",
        [starting, {**settled, "status": "True", "reason": "RollingOut"}],
    )
    conditions.record("gpu-pools", "fine", "batched", [settled])
    conditions.record("gpu-pools", "stuck", "premium", [
        {"type": "Degraded", "status": "True", "reason": "PodsCannotStart"},
        {"type": "Progressing", "status": "True", "reason": "RollingOut"},
    ])  # fmt: skip
    conditions.record("gpu-pools", "refused", "premium", [
        {"type": "Degraded", "status": "False", "reason": "AsExpected"},
        {"type": "Progressing", "status": "False", "reason": "ApplyRejected"},
    ])  # fmt: skip
    until(lambda: degraded() == {"stuck", "refused"}, f"TiergatePoolDegraded: {degraded()}")
    for name in ("cold", "fine", "stuck", "refused"):
        conditions.forget("gpu-pools", name)


def test_a_stopped_node_fires_no_ready_endpoint_for_its_pool(
    system: System, operator: Operator, prometheus: PrometheusServer, rules_file: Path, load: Load
) -> None:
    """The wafer-scale pool has one node: stopped (SIGTERM, so `tiergate up` does not restart
    it), the router's scrapes of it fail and its pool has no ready endpoint. While the operator
    reports the pool's pods starting (a cold start) the alert holds; once it reports them
    rolled out and not ready, it fires."""
    (node,) = [n for n in system.nodes if n.tier == "wafer-scale"]
    conditions = operator.metrics.pool_conditions
    starting = {"type": "Degraded", "status": "False", "reason": "Starting"}
    conditions.record(NAMESPACE, node.pool, node.tier, [starting])
    pids = [pid for pid in children(system.up.pid) if f"--port\0{node.port}\0" in cmdline(pid)]
    assert len(pids) == 1, f"no single sim node process on port {node.port}: {pids}"
    os.kill(pids[0], signal.SIGTERM)

    no_ready = f'tiergate_pool_endpoints{{state="ready", pool="{node.pool}"}} == 0'
    until(lambda: bool(prometheus.query(no_ready)), f"{node.pool} still has a ready endpoint",
          within_s=60)  # fmt: skip
    until(lambda: bool(prometheus.query(
        f'tiergate_operator_pool_condition{{pool="{node.pool}", reason="Starting"}}')),
        "the operator's conditions not scraped")  # fmt: skip
    (rule,) = [r for r in alert_rules(rules_file) if r["alert"] == "TiergatePoolNoReadyEndpoint"]
    assert prometheus.query(rule["expr"]) == [], "the alert's expression holds a starting pool"
    assert prometheus.query(rule["expr"].replace('reason="Starting"', 'reason="Nothing"')), (
        "without the operator's word the expression should hold the pool: the test proves nothing"
    )

    not_ready = {"type": "Degraded", "status": "True", "reason": "NoReplicaReady"}
    conditions.record(NAMESPACE, node.pool, node.tier, [not_ready])
    # A pool of the same name starting in another namespace holds nothing back here.
    conditions.record("elsewhere", node.pool, node.tier, [starting])

    def pool_alert() -> bool:
        return any(
            a["labels"]["alertname"] == "TiergatePoolNoReadyEndpoint"
            and a["labels"].get("pool") == node.pool
            for a in prometheus.firing()
        )

    until(pool_alert, f"TiergatePoolNoReadyEndpoint did not fire for {node.pool}", within_s=60)
    others = {
        a["labels"].get("pool")
        for a in prometheus.firing()
        if a["labels"]["alertname"] == "TiergatePoolNoReadyEndpoint"
    }
    assert others == {node.pool}


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text() + "\0"
    except OSError:
        return ""


def test_runbook_links_point_at_sections_of_the_runbook_page(rules_file: Path) -> None:
    page = (CHART.parents[1] / "docs" / "runbooks.md").read_text()
    anchors = {re.sub(r"[^a-z0-9-]", "", h.lower()) for h in re.findall(r"^## (.+)$", page, re.M)}
    for rule in alert_rules(rules_file):
        anchor = rule["annotations"]["runbook_url"].rsplit("#", 1)[1]
        assert anchor in anchors, f"{rule['alert']}: no section #{anchor} in docs/runbooks.md"
