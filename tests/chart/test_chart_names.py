"""Every name the chart generates is one Kubernetes accepts, with the longest names the values
and Helm allow: a DNS label of at most 63 characters (a Service's starting with a letter), and
label values within their 63. Names the API server would refuse are refused by the schema or
by the templates first, in one line."""

from __future__ import annotations

import re

import pytest
from chart_helpers import GATEWAY_FROM, VARIANT, Helm, HelmFailed, Manifest

#: Kubernetes' rules (k8s.io/apimachinery/pkg/util/validation).
DNS_1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS_1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
MAX = 63
#: The longest release name Helm accepts, the longest overrides the schema accepts, and the
#: longest namespace Kubernetes accepts.
LONG_RELEASE = "r" + "e" * 51 + "l"
LONG_NAME = "n" * 40
LONG_FULLNAME = "f" * 48
LONG_NAMESPACE = "s" * 63
#: Every optional part at once (the variant: HPA, PDB, monitoring, inline tenants, PostgreSQL),
#: behind a gateway.
EVERYTHING = [
    "router.eppPort=9002",
    "gatewayPool.enabled=true",
    GATEWAY_FROM,
    "router.discoveryNamespace=",  # the gateway needs the pools beside it
]
#: The parts the variant leaves out: the SQLite ledger's claim, the cluster-wide operator.
THE_REST = ["router.ledger.persistence.enabled=true", "operator.clusterWide=true"]


def problems(manifests: list[Manifest]) -> list[str]:
    """Each generated name or label value Kubernetes would refuse, and why."""
    found = []
    for m in manifests:
        name = m["metadata"]["name"]
        where = f"{m['kind']}/{name}"
        if m["kind"] == "CustomResourceDefinition":  # <plural>.<group>: the API's, not ours
            continue
        if len(name) > MAX or not DNS_1123_LABEL.fullmatch(name):
            found.append(f"{where}: not a DNS label of at most {MAX} characters")
        if m["kind"] == "Service" and not DNS_1035_LABEL.fullmatch(name):
            found.append(f"{where}: a Service name must start with a letter")
        for key, value in (m["metadata"].get("labels") or {}).items():
            if len(value) > MAX or not LABEL_VALUE.fullmatch(value):
                found.append(f"{where}: label {key}={value!r}")
    return found


@pytest.mark.parametrize(
    "names",
    [
        [],
        [f"nameOverride={LONG_NAME}"],
        [f"fullnameOverride={LONG_FULLNAME}"],
    ],
    ids=["release-name", "name-override", "fullname-override"],
)
@pytest.mark.parametrize(("with_variant", "sets"), [(True, EVERYTHING), (False, THE_REST)],
                         ids=["every-option", "sqlite-cluster-wide"])  # fmt: skip
def test_the_longest_names_make_names_kubernetes_accepts(
    helm: Helm, names: list[str], with_variant: bool, sets: list[str]
) -> None:
    manifests = helm.template(
        values=[VARIANT] if with_variant else [],
        sets=[*names, *sets],
        release=LONG_RELEASE,
        namespace=LONG_NAMESPACE,
    )
    kinds = {m["kind"] for m in manifests}
    assert {"Service", "NetworkPolicy", "ServiceAccount", "Role"} <= kinds
    assert problems(manifests) == []
    named = [(m["kind"], m["metadata"].get("namespace"), m["metadata"]["name"]) for m in manifests]
    assert len(named) == len(set(named)), "two objects of one kind share a name"


def test_names_that_fit_are_left_as_they_are(helm: Helm) -> None:
    """Only names past 63 characters are shortened; the others keep the names releases have."""
    manifests = helm.template(sets=["operator.clusterWide=true"])
    names = {(m["kind"], m["metadata"]["name"]) for m in manifests}
    assert ("ClusterRole", "tg-tiergate-operator-tiergate-system") in names
    assert ("Service", "tg-tiergate-router-metrics") in names
    namespaced = helm.template()
    assert ("Role", "tg-tiergate-operator-router-pods") in {
        (m["kind"], m["metadata"]["name"]) for m in namespaced
    }


def test_a_shortened_name_keeps_releases_apart(helm: Helm) -> None:
    """Two releases in two namespaces share a cluster-wide role's namespace-free part: a hash
    of the whole name keeps their roles apart when both are shortened."""

    def cluster_role(namespace: str) -> str:
        manifests = helm.template(
            sets=["operator.clusterWide=true"], release=LONG_RELEASE, namespace=namespace
        )
        (role,) = [m for m in manifests if m["kind"] == "ClusterRole"]
        return str(role["metadata"]["name"])

    first, second = cluster_role(LONG_NAMESPACE), cluster_role(LONG_NAMESPACE[:-1] + "t")
    assert first != second and len(first) == len(second) == MAX


@pytest.mark.parametrize(
    ("sets", "field"),
    [
        (["nameOverride=Tier_Gate"], "/nameOverride"),
        ([f"nameOverride={'n' * 41}"], "/nameOverride"),
        (["fullnameOverride=Tier-Gate"], "/fullnameOverride"),
        (["fullnameOverride=1tiergate"], "/fullnameOverride"),
        ([f"fullnameOverride={'f' * 49}"], "/fullnameOverride"),
    ],
)
def test_the_schema_refuses_names_kubernetes_would(helm: Helm, sets: list[str], field: str) -> None:
    with pytest.raises(HelmFailed) as failure:
        helm.template(sets=sets)
    message = str(failure.value)
    assert "schema" in message and field in message, message


def test_a_release_name_no_service_may_start_with_is_refused_in_one_line(helm: Helm) -> None:
    with pytest.raises(HelmFailed, match="a Service name must start with a letter") as failure:
        helm.template(release="1tg")
    assert "1tg-tiergate" in str(failure.value)
    assert helm.template(release="1tg", sets=["fullnameOverride=tg"])
