"""RBAC: the router only reads; the operator gets what kopf and reconciling need, no more."""

from __future__ import annotations

import pytest
from chart_helpers import NAMESPACE, OPERATOR, ROUTER, Helm, Manifest, find, one

from tiergate.cli import build_parser
from tiergate.operator.commands.operator_cmd import operator_options

READ = {"get", "list", "watch"}

# (apiGroup, resource) -> verbs, in every namespace the operator serves.
OPERATOR_NAMESPACED = {
    ("tiergate.dev", "inferencepools"): {"get", "list", "watch", "patch"},
    ("tiergate.dev", "inferencepools/status"): {"patch"},
    # its children's owner references block the pool's deletion (OpenShift checks this verb)
    ("tiergate.dev", "inferencepools/finalizers"): {"update"},
    # the autoscaler: scale, scrape the pods, stand down for an HPA
    ("tiergate.dev", "inferencepools/scale"): {"patch"},
    ("", "pods"): {"list"},
    ("autoscaling", "horizontalpodautoscalers"): {"list"},
    # server-side apply creates an object with the create verb, changes it with patch
    ("apps", "deployments"): {"get", "list", "watch", "create", "patch", "delete"},
    ("", "services"): {"get", "create", "patch", "delete"},
    ("", "events"): {"create"},
    ("events.k8s.io", "events"): {"create"},
}
OPERATOR_CLUSTER_WIDE = {
    **OPERATOR_NAMESPACED,
    ("apiextensions.k8s.io", "customresourcedefinitions"): READ,
    ("kopf.dev", "clusterkopfpeerings"): {"get", "list", "watch", "patch"},
    ("", "namespaces"): READ,
}
OPERATOR_PER_NAMESPACE = {
    **OPERATOR_NAMESPACED,
    ("kopf.dev", "kopfpeerings"): {"get", "list", "watch", "patch"},
}


def grants(role: Manifest) -> dict[tuple[str, str], set[str]]:
    """(apiGroup, resource) -> verbs; fails on wildcards and resourceNames-free duplicates."""
    table: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                assert "*" not in (group, resource, *rule["verbs"]), role["metadata"]["name"]
                table.setdefault((group, resource), set()).update(rule["verbs"])
    return table


def bound_role(manifests: list[Manifest], binding: Manifest) -> Manifest:
    """The role a binding refers to, after checking it exists and binds the right account."""
    ref = binding["roleRef"]
    namespace = binding["metadata"].get("namespace")
    roles = [
        r
        for r in find(manifests, ref["kind"], ref["name"])
        if r["metadata"].get("namespace") == namespace
    ]
    assert len(roles) == 1, f"{binding['metadata']['name']} refers to a missing {ref['kind']}"
    return roles[0]


def subjects(binding: Manifest) -> list[tuple[str, str, str]]:
    return [(s["kind"], s["name"], s["namespace"]) for s in binding["subjects"]]


def test_router_reads_pools_and_pods_only(any_manifests: list[Manifest]) -> None:
    role = one(any_manifests, "Role", ROUTER)
    assert grants(role) == {
        ("tiergate.dev", "inferencepools"): {"list", "watch"},
        ("", "pods"): {"list", "watch"},
    }
    binding = one(any_manifests, "RoleBinding", ROUTER)
    assert bound_role(any_manifests, binding) is role
    assert subjects(binding) == [("ServiceAccount", ROUTER, NAMESPACE)]
    # Nothing cluster-wide is bound to the router.
    for cluster_binding in find(any_manifests, "ClusterRoleBinding"):
        assert ("ServiceAccount", ROUTER, NAMESPACE) not in subjects(cluster_binding)


def test_router_reads_the_provider_key_secrets_it_is_told_of_by_name_only(helm: Helm) -> None:
    manifests = helm.template(sets=["router.providerKeySecrets={openai-key,vendor-key}"])
    role = one(manifests, "Role", ROUTER)
    (rule,) = [r for r in role["rules"] if "secrets" in r["resources"]]
    assert rule == {"apiGroups": [""], "resources": ["secrets"],
                    "resourceNames": ["openai-key", "vendor-key"], "verbs": ["get"]}  # fmt: skip


def test_router_role_lives_in_the_discovery_namespace(
    default_manifests: list[Manifest], variant_manifests: list[Manifest]
) -> None:
    for manifests, namespace in ((default_manifests, NAMESPACE), (variant_manifests, "pools")):
        assert one(manifests, "Role", ROUTER)["metadata"]["namespace"] == namespace
        assert one(manifests, "RoleBinding", ROUTER)["metadata"]["namespace"] == namespace


def test_operator_watches_the_release_namespace_by_default_and_nothing_cluster_wide(
    default_manifests: list[Manifest],
) -> None:
    """Writing Deployments and Services in every namespace is no default: an opt-in below."""
    (binding,) = find(default_manifests, "RoleBinding", OPERATOR)
    assert binding["metadata"]["namespace"] == NAMESPACE
    assert subjects(binding) == [("ServiceAccount", OPERATOR, NAMESPACE)]
    assert grants(bound_role(default_manifests, binding)) == OPERATOR_PER_NAMESPACE
    assert not find(default_manifests, "ClusterRoleBinding")
    assert not find(default_manifests, "ClusterRole")


def test_operator_cluster_wide_is_an_explicit_opt_in(helm: Helm) -> None:
    manifests = helm.template(sets=["operator.clusterWide=true"])
    assert not find(manifests, "Role", OPERATOR) and not find(manifests, "RoleBinding", OPERATOR)
    (binding,) = find(manifests, "ClusterRoleBinding")
    assert subjects(binding) == [("ServiceAccount", OPERATOR, NAMESPACE)]
    assert grants(bound_role(manifests, binding)) == OPERATOR_CLUSTER_WIDE


@pytest.mark.parametrize(
    "sets",
    [
        [],
        ["operator.watchNamespaces={team-a,team-b}"],
        ["operator.clusterWide=true"],
        ["operator.watchNamespaces={team-a}", "router.discoveryNamespace=team-a"],
    ],
    ids=["default", "listed", "cluster-wide", "one-other"],
)
def test_the_operator_s_flags_match_what_the_chart_grants(helm: Helm, sets: list[str]) -> None:
    """What `tiergate operator` makes of its args (kopf's namespaces) is exactly where it may
    write: a namespace it watches without a Role would fail; a Role it does not use is too much."""
    manifests = helm.template(sets=sets)
    deployment = one(manifests, "Deployment", OPERATOR)
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    options = operator_options(build_parser("operator").parse_args(args))
    cluster_bound = [
        b for b in find(manifests, "ClusterRoleBinding")
        if ("ServiceAccount", OPERATOR, NAMESPACE) in subjects(b)
    ]  # fmt: skip
    role_namespaces = sorted(
        b["metadata"]["namespace"] for b in find(manifests, "RoleBinding", OPERATOR)
    )
    if options["clusterwide"]:
        assert len(cluster_bound) == 1 and role_namespaces == []
    else:
        assert cluster_bound == [] and role_namespaces == sorted(options["namespaces"])
    peerings = {(m["kind"], m["metadata"].get("namespace"))
                for m in manifests if m["kind"].endswith("KopfPeering")}  # fmt: skip
    if options["clusterwide"]:
        assert peerings == {("ClusterKopfPeering", None)}
    else:
        assert peerings == {("KopfPeering", ns) for ns in options["namespaces"]}


def test_operator_watching_listed_namespaces_gets_a_role_in_each(
    variant_manifests: list[Manifest],
) -> None:
    bindings = [b for b in find(variant_manifests, "RoleBinding", OPERATOR)]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    for binding in bindings:
        assert subjects(binding) == [("ServiceAccount", OPERATOR, NAMESPACE)]
        assert grants(bound_role(variant_manifests, binding)) == OPERATOR_PER_NAMESPACE
    # Nothing cluster-wide: the operator turns kopf's namespace and CRD scanning off then.
    assert not find(variant_manifests, "ClusterRoleBinding")
    assert not find(variant_manifests, "ClusterRole")


def test_deployments_run_as_their_bound_accounts(any_manifests: list[Manifest]) -> None:
    for name in (OPERATOR, ROUTER):
        spec = one(any_manifests, "Deployment", name)["spec"]["template"]["spec"]
        assert spec["serviceAccountName"] == name
        one(any_manifests, "ServiceAccount", name)


def test_the_operator_may_list_the_router_s_pods_its_flags_select(helm: Helm) -> None:
    """The autoscaler lists the router's pods (in the release namespace) to read their
    queues: its flags select the router's pods, on their metrics port, and a Role lets it
    list pods there, whichever namespaces it watches."""
    for sets in ([], ["operator.watchNamespaces={team-a}"], ["operator.clusterWide=true"]):
        manifests = helm.template(sets=sets)
        operator = one(manifests, "Deployment", OPERATOR)["spec"]["template"]["spec"]
        args = build_parser("operator").parse_args(operator["containers"][0]["args"])
        router = one(manifests, "Deployment", ROUTER)["spec"]["template"]
        labels = router["metadata"]["labels"]
        selector = dict(pair.split("=") for pair in args.router_selector.split(","))
        assert selector.items() <= labels.items(), (sets, selector)
        ports = {p["name"]: p["containerPort"] for p in router["spec"]["containers"][0]["ports"]}
        assert (args.router_namespace, args.router_metrics_port) == (NAMESPACE, ports["metrics"])
        grants = [
            rule
            for m in manifests
            if m["kind"] in ("Role", "ClusterRole")
            and m["metadata"].get("namespace", NAMESPACE) == NAMESPACE
            and OPERATOR in m["metadata"]["name"]
            for rule in m["rules"]
        ]
        assert any("pods" in r["resources"] and "list" in r["verbs"] for r in grants), sets
