"""Bad values stop `helm template` with a message naming the field (values.schema.json and the
templates' own cross-field checks)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from chart_helpers import CHART, Helm, HelmFailed

from tiergate.common.tiers import TIERS

ROOT = CHART.parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import chart_schema  # noqa: E402  (a tool, beside the repository's other generators)

#: Real processes and servers, or seconds of work: left out of `make test-fast`.
pytestmark = pytest.mark.slow

TENANT = "router.tenants.inline[0]"
A_TENANT = [f"{TENANT}.name=team-a", f"{TENANT}.apiKeys[0]=sk-a"]


@pytest.mark.parametrize(
    ("sets", "field"),
    [
        (["router.replicas=-1"], "/router/replicas"),
        (["operator.replicas=two"], "/operator/replicas"),
        (["operator.watchNamespaces=x"], "/operator/watchNamespaces"),
        (["operator.watchNamespaces={Team_A}"], "/operator/watchNamespaces/0"),
        (["operator.watchNamespaces={a,a}"], "/operator/watchNamespaces"),
        (["operator.clusterWide=yes"], "/operator/clusterWide"),
        (["operator.allowedImages={a b}"], "/operator/allowedImages/0"),
        (["operator.autoscaleIntervalSeconds=0"], "/operator/autoscaleIntervalSeconds"),
        (["operator.autoscaleIntervalSeconds=3601"], "/operator/autoscaleIntervalSeconds"),
        (["operator.autoscaleIntervalSeconds=fast"], "/operator/autoscaleIntervalSeconds"),
        (["networkPolicy.enabled=maybe"], "/networkPolicy/enabled"),
        (["networkPolicy.extraFrom[0].pods=x"], "/networkPolicy/extraFrom/0"),
        (["notAValue=1"], "notAValue"),
        (["router.colour=blue"], "colour"),
        (["router.autoscaling.enabled=yes"], "/router/autoscaling/enabled"),
        (["router.service.port=70000"], "/router/service/port"),
        (["router.logLevel=loud"], "/router/logLevel"),
        (["router.ledger.maxSize=lots"], "/router/ledger/maxSize"),
        (["router.ledger.maxSize=1Pi"], "/router/ledger/maxSize"),
        (["router.ledger.retentionDays=0"], "/router/ledger/retentionDays"),
        (["image.pullPolicy=Sometimes"], "/image/pullPolicy"),
        (["engines.vllm.image=a b"], "/engines/vllm/image"),
        (
            ["engines.modelCache.persistentVolumeClaim=Bad_Name"],
            "/engines/modelCache/persistentVolumeClaim",
        ),
        (["engines.tgi.image=x"], "tgi"),
        (["runAsUser=0"], "/runAsUser"),
        (["runAsGroup=2147483648"], "/runAsGroup"),  # past Kubernetes' int32
        (["tests.tier=fast"], "/tests/tier"),
        ([*A_TENANT, f"{TENANT}.allowedTiers={{batched,turbo}}"], "/allowedTiers/1"),
        ([*A_TENANT, f"{TENANT}.spillOver.to={{turbo}}"], "/spillOver/to/0"),
        (
            [
                *A_TENANT,
                f"{TENANT}.spillOver.to={{batched}}",
                f"{TENANT}.spillOver.notForTools={{x}}",
            ],
            "/spillOver/notForTools/0",
        ),
        (
            ["monitoring.rules.ttftP99ObjectiveSeconds.turbo=1"],
            "invalid propertyName 'turbo'",
        ),
        ([*A_TENANT, f"{TENANT}.requestsPerMinute=0"], "/requestsPerMinute"),
        ([*A_TENANT, f"{TENANT}.budgetPeriod=year"], "/budgetPeriod"),
        ([*A_TENANT, f"{TENANT}.apiKeySha256[0]=not-a-digest"], "/apiKeySha256/0"),
        ([f"{TENANT}.name=team-a"], "/router/tenants/inline/0"),  # no key at all
        (["router.policy.picker.type=fastest"], "/router/policy/picker"),
        (
            [
                "router.policy.filters[0].type=random-sample",
                "router.policy.filters[0].parameters.size=0",
            ],
            "/router/policy/filters/0",
        ),
        (
            [
                "router.policy.scorers[0].type=queue-depth-scorer",
                "router.policy.scorers[0].weight=0",
            ],
            "/router/policy/scorers/0",
        ),
        (["router.policy.scorer=x"], "additional properties 'scorer' not allowed"),
        (["router.connections.headerTimeoutS=0"], "/router/connections/headerTimeoutS"),
        (["router.connections.maxConnections=0"], "/router/connections/maxConnections"),
        (["router.connections.idleTimeout=5"], "additional properties 'idleTimeout' not allowed"),
        (["router.allowedMediaDomains={Images.example.com}"], "/router/allowedMediaDomains/0"),
        (["router.wholeReplyTimeoutS=0"], "/router/wholeReplyTimeoutS"),
    ],
)
def test_schema_rejects_bad_values_naming_the_field(
    helm: Helm, sets: list[str], field: str
) -> None:
    with pytest.raises(HelmFailed) as failure:
        helm.template(sets=sets)
    message = str(failure.value)
    assert "schema" in message and field in message, message


@pytest.mark.parametrize(
    ("sets", "field"),
    [
        # The ledger's own refusals (several replicas on SQLite, ...): test_chart_ledger.py.
        (["router.tenants.existingSecret=keys", *A_TENANT], "router.tenants"),
        (
            [
                "router.ledger.postgres.existingSecret=dsn",
                "router.autoscaling.enabled=true",
                "router.autoscaling.minReplicas=7",
            ],
            "router.autoscaling.minReplicas",
        ),
        (["operator.clusterWide=true", "operator.watchNamespaces={a}"], "operator.clusterWide"),
    ],
)
def test_contradictory_values_fail_naming_the_fields(
    helm: Helm, sets: list[str], field: str
) -> None:
    with pytest.raises(HelmFailed, match=field.replace(".", r"\.")):
        helm.template(sets=sets)


def test_good_values_of_each_kind_are_accepted(helm: Helm) -> None:
    """The schema is not simply refusing: valid edge values render."""
    sets = [
        "router.replicas=0",
        "operator.watchNamespaces={team-a}",
        "operator.autoscaleIntervalSeconds=1",
        "router.podDisruptionBudget.enabled=true",
        "router.podDisruptionBudget.maxUnavailable=0",
        "router.tenants.existingSecret=tiergate-tenants",
        "image.tag=0.2.0-rc.1",
        "router.resources.limits.cpu=1500m",
    ]
    assert helm.template(sets=sets)


def test_the_chart_s_generated_parts_are_what_the_code_generates() -> None:
    """values.schema.json's tier list and router.policy come from tiergate/common/tiers.py and the
    plugin registry: a tier, plugin type or parameter added without regenerating the file
    would be refused by helm."""
    committed = (CHART / "values.schema.json").read_text()
    generated = chart_schema.text_of(chart_schema.generated(json.loads(committed)))
    assert committed == generated, "run: make docs-reference"
    schema = json.loads(committed)
    assert schema["definitions"]["tier"]["enum"] == list(TIERS)


def test_no_value_spells_the_tiers_but_the_generated_list() -> None:
    """Every value naming a tier refers to `definitions.tier`, so regenerating that one list is
    all a new tier needs."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    spelled, refs = [], []

    def walk(node: object, path: str) -> None:
        if isinstance(node, dict):
            if set(node.get("enum", [])) & set(TIERS):
                spelled.append(path)
            if node.get("$ref") == "#/definitions/tier":
                refs.append(path)
            for key, child in node.items():
                walk(child, f"{path}/{key}")
        elif isinstance(node, list):
            for index, child in enumerate(node):
                walk(child, f"{path}/{index}")

    walk(schema, "")
    assert spelled == ["/definitions/tier"]
    assert len(refs) == 5, refs  # allowedTiers, spillOver.to/notForTools, objectives, helm test


def test_the_check_fails_on_a_stale_tier_list(tmp_path: Path) -> None:
    target = tmp_path / "charts" / "tiergate" / "values.schema.json"
    target.parent.mkdir(parents=True)
    schema = json.loads((CHART / "values.schema.json").read_text())
    schema["definitions"]["tier"]["enum"] = list(TIERS)[:-1]
    target.write_text(chart_schema.text_of(schema))
    tool = [sys.executable, "-P", str(ROOT / "tools" / "chart_schema.py"), "--root", str(tmp_path)]
    stale = subprocess.run([*tool, "--check"], capture_output=True, text=True, timeout=60)
    assert stale.returncode == 1 and "stale" in stale.stdout
    assert json.loads(target.read_text())["definitions"]["tier"]["enum"] == list(TIERS)[:-1]
    subprocess.run(tool, check=True, capture_output=True, timeout=60)
    assert subprocess.run([*tool, "--check"], capture_output=True, timeout=60).returncode == 0
    assert json.loads(target.read_text())["definitions"]["tier"]["enum"] == list(TIERS)


def test_schema_refuses_unknown_keys_at_every_level() -> None:
    """Each object of the schema closes its properties, so a typo cannot pass silently."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    open_objects = []

    def walk(node: object, path: str) -> None:
        if isinstance(node, dict):
            if node.get("type") == "object" and "properties" in node:
                if node.get("additionalProperties") is not False:
                    open_objects.append(path)
            for key, child in node.items():
                walk(child, f"{path}/{key}")
        elif isinstance(node, list):
            for index, child in enumerate(node):
                walk(child, f"{path}/{index}")

    walk(schema, "")
    assert open_objects == []
