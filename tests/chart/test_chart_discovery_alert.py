"""The chart's TiergateDiscoveryFailing alert, as Prometheus evaluates it (`promtool test
rules`): quiet while the router's watches work or fail for less than a minute, firing once
they have failed past it for the rule's `for`."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from chart_helpers import Helm, find
from prometheus_server import PrometheusMissing, binaries

ALERT = "TiergateDiscoveryFailing"


@pytest.fixture(scope="module")
def promtool() -> Path:
    try:
        return binaries()[1]
    except PrometheusMissing as exc:
        pytest.fail(str(exc))


def test_the_alert_fires_after_a_minute_of_failed_watches_and_its_for(
    helm: Helm, promtool: Path, tmp_path: Path
) -> None:
    (rule,) = find(helm.template(sets=["monitoring.rules.enabled=true"]), "PrometheusRule")
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    # Scraped every minute: the pods watch fails from minute 1 on (0, 60, 120... seconds);
    # the inferencepools watch fails once for 30 s and recovers.
    failing = " ".join(str(60 * i) for i in range(12))
    (alert,) = [r for g in rule["spec"]["groups"] for r in g["rules"] if r.get("alert") == ALERT]
    assert alert["annotations"]["runbook_url"].endswith("#tiergatediscoveryfailing")
    fired = {
        "exp_labels": {"severity": "critical", "resource": "pods", "job": "router"},
        "exp_annotations": {
            "summary": alert["annotations"]["summary"],
            "description": "A router has failed to list and watch pods for 4m 0s: it routes to "
            "the pools and endpoints it saw then, pods deleted since included.",
            "runbook_url": alert["annotations"]["runbook_url"],
        },
    }
    tests = {
        "rule_files": [str(rules)],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [
                {"series": 'tiergate_discovery_failing_seconds{resource="pods",job="router"}',
                 "values": f"0 {failing}"},
                {"series": 'tiergate_discovery_failing_seconds{resource="inferencepools",'
                           'job="router"}', "values": "0 30 0 0 0 0 0 0 0 0 0 0 0"},
            ],
            "alert_rule_test": [
                # 60 s failing at minute 2 is not yet past a minute; past it from minute 3,
                # for the default 2m: firing at minute 5, not at 4.
                {"eval_time": "2m", "alertname": ALERT, "exp_alerts": []},
                {"eval_time": "4m", "alertname": ALERT, "exp_alerts": []},
                {"eval_time": "5m", "alertname": ALERT, "exp_alerts": [fired]},
            ],
        }],
    }  # fmt: skip
    spec = tmp_path / "test.yaml"
    spec.write_text(yaml.safe_dump(tests))
    result = subprocess.run(
        [str(promtool), "test", "rules", str(spec)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
