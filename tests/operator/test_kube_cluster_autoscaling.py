"""`KubeCluster`'s autoscaling calls on the official client, over HTTP: the pool's pods, the
HPAs of its namespace and the scale subresource (and the Deployment status reconcile reads),
answered by a small API server with the bodies and statuses the real one gives (200, 403
Forbidden, 404, 500)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import kopf
import pytest
from kubernetes import client

from tiergate.operator.autoscaling import HpaUnknown
from tiergate.operator.kube import ApplyRejected, KubeCluster, PodAddress, RoutersUnknown

NS = "team-a"
PODS = f"/api/v1/namespaces/{NS}/pods"
HPAS = f"/apis/autoscaling/v2/namespaces/{NS}/horizontalpodautoscalers"
SCALE = f"/apis/tiergate.dev/v1alpha1/namespaces/{NS}/inferencepools/frontier-premium/scale"
DEPLOYMENT = f"/apis/apps/v1/namespaces/{NS}/deployments/frontier-premium"


def pod(name: str, ip: str | None, ready: str, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": NS}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-25T10:00:00Z"
    status: dict[str, Any] = {"phase": "Running", "conditions": [
        {"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": ready},
    ]}  # fmt: skip
    if ip:
        status["podIP"] = ip
    return {"metadata": meta, "spec": {"containers": [{"name": "node", "image": "x"}]},
            "status": status}  # fmt: skip


def test_a_pod_that_cannot_start_says_why(api: ApiServer) -> None:
    """The scheduler's word for a pod no node takes, a container's for one that will not
    start; a container on its way (ContainerCreating) is no problem."""
    unschedulable = pod("a", None, "False")
    unschedulable["status"] = {"phase": "Pending", "conditions": [{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
    }]}  # fmt: skip
    pulling, creating = pod("b", "10.0.0.2", "False"), pod("c", "10.0.0.3", "False")
    for one, reason in ((pulling, "ImagePullBackOff"), (creating, "ContainerCreating")):
        one["status"]["containerStatuses"] = [{
            "name": "vllm", "image": "x", "imageID": "", "ready": False, "restartCount": 0,
            "state": {"waiting": {"reason": reason, "message": "Back-off pulling image x"}},
        }]  # fmt: skip
    api.answers[("GET", PODS)] = (200, {"kind": "PodList", "apiVersion": "v1", "items": [
        unschedulable, pulling, creating]})  # fmt: skip
    problems = {p.name: p.problem for p in cluster_of(api).pool_pods(NS, "frontier-premium")}
    assert problems == {
        "a": "Unschedulable: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
        "b": "ImagePullBackOff: Back-off pulling image x",
        "c": None,
    }


def test_a_pod_is_starting_until_its_containers_pass_their_startup_probes(api: ApiServer) -> None:
    """`started` is false until a container's startup probe passes (a real engine loading its
    weights); a pod with no container yet is on its way too; a ready pod, or one running past
    its startup probe that is not ready (it lost its readiness), is not starting."""

    def with_containers(name: str, ready: str, *started: bool) -> dict[str, Any]:
        one = pod(name, "10.0.0.4", ready)
        one["status"]["containerStatuses"] = [
            {"name": f"c{i}", "image": "x", "imageID": "", "ready": ready == "True",
             "restartCount": 0, "started": s, "state": {"running": {}}}
            for i, s in enumerate(started)
        ]  # fmt: skip
        return one

    items = [
        with_containers("loading", "False", True, False),
        pod("created", None, "False"),  # no container status yet
        with_containers("lost", "False", True),
        with_containers("serving", "True", True),
    ]
    api.answers[("GET", PODS)] = (200, {"kind": "PodList", "apiVersion": "v1", "items": items})
    starting = {p.name: p.starting for p in cluster_of(api).pool_pods(NS, "frontier-premium")}
    assert starting == {"loading": True, "created": True, "lost": False, "serving": False}


def hpa(name: str, kind: str, target: str, api_version: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "scaleTargetRef": {"kind": kind, "name": target, "apiVersion": api_version},
            "minReplicas": 1,
            "maxReplicas": 3,
        },
    }


def status_body(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
            "reason": reason, "code": code}  # fmt: skip


class ApiServer:
    """Answers GET and PATCH by path from `answers`; records (method, path, query, headers,
    body) of every request."""

    def __init__(self) -> None:
        self.answers: dict[tuple[str, str], tuple[int, Any]] = {}
        #: Answers that follow `answers`' one, each once, in turn.
        self.then: dict[tuple[str, str], list[tuple[int, Any]]] = {}
        self.requests: list[tuple[str, str, dict[str, str], dict[str, str], Any]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return None

            def do_GET(self) -> None:
                self._answer("GET")

            def do_PATCH(self) -> None:
                self._answer("PATCH")

            def _answer(self, method: str) -> None:
                parts = urlsplit(self.path)
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                query = {k: v[0] for k, v in parse_qs(parts.query).items()}
                headers = {k.lower(): v for k, v in self.headers.items()}
                server.requests.append((method, parts.path, query, headers, body))
                code, answer = server.answers.get(
                    (method, parts.path), (404, status_body(404, "NotFound", "not found"))
                )
                later = server.then.get((method, parts.path))
                if later:  # answers in turn: this one now, the next one next time
                    server.answers[(method, parts.path)] = later.pop(0)
                data = json.dumps(answer).encode()
                self.send_response(code)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"


@pytest.fixture
def api() -> Iterator[ApiServer]:
    server = ApiServer()
    thread = threading.Thread(target=server.httpd.serve_forever, daemon=True)
    thread.start()
    yield server
    server.httpd.shutdown()
    server.httpd.server_close()


def cluster_of(api: ApiServer) -> KubeCluster:
    configuration = client.Configuration()
    configuration.host = api.url
    return KubeCluster(client.ApiClient(configuration))


def test_the_pool_pods_are_listed_by_its_selector_and_read_as_ready_or_not(
    api: ApiServer,
) -> None:
    api.answers[("GET", PODS)] = (200, {"kind": "PodList", "apiVersion": "v1", "items": [
        pod("a", "10.0.0.1", "True"),
        pod("b", "10.0.0.2", "False"),
        pod("c", "10.0.0.3", "True", deleting=True),
        pod("d", None, "False"),
    ]})  # fmt: skip
    pods = cluster_of(api).pool_pods(NS, "frontier-premium")
    assert pods == [
        PodAddress("a", "10.0.0.1", True),
        PodAddress("b", "10.0.0.2", False, starting=True),  # no container status yet
        PodAddress("c", "10.0.0.3", False),  # being deleted: not ready, whatever it says
        PodAddress("d", None, False, starting=True),
    ]
    (_, _, query, _, _) = api.requests[-1]
    selector = query["labelSelector"].split(",")
    assert sorted(selector) == ["app.kubernetes.io/name=tiergate-sim-node",
                                "tiergate.dev/pool=frontier-premium"]  # fmt: skip


def test_only_an_hpa_on_this_pool_of_our_group_counts(api: ApiServer) -> None:
    items = [
        hpa("web", "Deployment", "frontier-premium", "apps/v1"),
        hpa("other", "InferencePool", "another-pool", "tiergate.dev/v1alpha1"),
        hpa("foreign", "InferencePool", "frontier-premium", "example.com/v1"),
    ]
    api.answers[("GET", HPAS)] = (200, {"kind": "HorizontalPodAutoscalerList", "items": items})
    cluster = cluster_of(api)
    assert cluster.hpa_targeting(NS, "frontier-premium") is None
    items.append(hpa("mine", "InferencePool", "frontier-premium", "tiergate.dev/v1alpha1"))
    assert cluster.hpa_targeting(NS, "frontier-premium") == "mine"


def test_hpas_the_operator_may_not_list_are_unknown_not_absent(api: ApiServer) -> None:
    forbidden = status_body(
        403,
        "Forbidden",
        'horizontalpodautoscalers.autoscaling is forbidden: User "system:serviceaccount:'
        'team-a:tiergate-operator" cannot list resource "horizontalpodautoscalers"',
    )
    api.answers[("GET", HPAS)] = (403, forbidden)
    found = cluster_of(api).hpa_targeting(NS, "frontier-premium")
    assert found == HpaUnknown(f"list horizontalpodautoscalers.autoscaling in {NS}")


def test_other_failures_to_list_hpas_are_retried(api: ApiServer) -> None:
    api.answers[("GET", HPAS)] = (500, status_body(500, "InternalError", "etcd is away"))
    with pytest.raises(kopf.TemporaryError, match="etcd is away"):
        cluster_of(api).hpa_targeting(NS, "frontier-premium")


def test_the_scale_subresource_is_patched_and_a_deleted_pool_is_no_error(
    api: ApiServer,
) -> None:
    scale = {"kind": "Scale", "apiVersion": "autoscaling/v1", "metadata": {"name": "x"},
             "spec": {"replicas": 3}, "status": {"replicas": 1}}  # fmt: skip
    api.answers[("PATCH", SCALE)] = (200, scale)
    cluster = cluster_of(api)
    cluster.scale_pool(NS, "frontier-premium", 3)
    (method, path, _, headers, body) = api.requests[-1]
    assert (method, path, body) == ("PATCH", SCALE, {"spec": {"replicas": 3}})
    assert headers["content-type"] == "application/merge-patch+json"
    del api.answers[("PATCH", SCALE)]  # 404: the pool was deleted meanwhile
    cluster.scale_pool(NS, "frontier-premium", 2)
    api.answers[("PATCH", SCALE)] = (409, status_body(409, "Conflict", "try again"))
    with pytest.raises(kopf.TemporaryError, match="try again"):
        cluster.scale_pool(NS, "frontier-premium", 2)


def test_the_router_pods_are_listed_by_the_selector_given_and_a_refusal_says_why(
    api: ApiServer,
) -> None:
    api.answers[("GET", PODS)] = (200, {"kind": "PodList", "apiVersion": "v1", "items": [
        pod("router-a", "10.0.1.1", "True"), pod("router-b", "10.0.1.2", "False"),
    ]})  # fmt: skip
    cluster = cluster_of(api)
    selector = "app.kubernetes.io/component=router,app.kubernetes.io/instance=tg"
    assert cluster.router_pods(NS, selector) == [
        PodAddress("router-a", "10.0.1.1", True),
        PodAddress("router-b", "10.0.1.2", False, starting=True),
    ]
    assert api.requests[-1][2]["labelSelector"] == selector
    forbidden = status_body(403, "Forbidden", 'pods is forbidden: cannot list resource "pods"')
    api.answers[("GET", PODS)] = (403, forbidden)
    with pytest.raises(RoutersUnknown, match=f"the operator may not list pods in {NS}"):
        cluster.router_pods(NS, selector)
    api.answers[("GET", PODS)] = (500, status_body(500, "InternalError", "etcd is down"))
    with pytest.raises(RoutersUnknown, match="HTTP 500: etcd is down"):
        cluster.router_pods(NS, selector)


def test_a_deployment_status_comes_with_the_generation_it_is_compared_with(
    api: ApiServer,
) -> None:
    """status.observedGeneration below metadata.generation: the controller has not acted on
    the Deployment's new spec, so its counts are about the spec before (reconcile reads both)."""
    labels = {"tiergate.dev/pool": "frontier-premium"}
    deployment = {
        "kind": "Deployment", "apiVersion": "apps/v1",
        "metadata": {"name": "frontier-premium", "namespace": NS, "generation": 5},
        "spec": {"selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels},
            "spec": {"containers": [{"name": "node", "image": "x"}]}}},
        "status": {"observedGeneration": 4, "replicas": 1, "readyReplicas": 1},
    }  # fmt: skip
    api.answers[("GET", DEPLOYMENT)] = (200, deployment)
    cluster = cluster_of(api)
    status = cluster.deployment_status(NS, "frontier-premium")
    assert status == {"generation": 5, "observedGeneration": 4, "replicas": 1, "readyReplicas": 1}
    del deployment["status"]  # just created: no status yet
    assert cluster.deployment_status(NS, "frontier-premium") == {"generation": 5}
    del api.answers[("GET", DEPLOYMENT)]
    assert cluster.deployment_status(NS, "frontier-premium") is None


@pytest.mark.parametrize(
    ("code", "reason", "message"),
    [
        (403, "Forbidden", 'admission webhook "validation.gatekeeper.sh" denied the request: '
         "[require-cpu-limits] container node has no cpu limit"),
        (403, "Forbidden", 'deployments.apps "frontier-premium" is forbidden: User '
         '"system:serviceaccount:tiergate:operator" cannot patch resource "deployments"'),
        (422, "Invalid", 'Deployment.apps "frontier-premium" is invalid: spec.replicas: '
         "Invalid value: -1"),
    ],
)  # fmt: skip
def test_a_deployment_the_api_server_refuses_or_forbids_is_rejected_in_its_words(
    api: ApiServer, code: int, reason: str, message: str
) -> None:
    """Applying it again cannot help until something changes: not a retry, but a rejection the
    pool's status says (reconcile), in the API server's words."""
    api.answers[("PATCH", DEPLOYMENT)] = (code, status_body(code, reason, message))
    manifest = {"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "frontier-premium", "namespace": NS}}  # fmt: skip
    with pytest.raises(ApplyRejected) as caught:
        cluster_of(api).apply(manifest)
    assert str(caught.value) == (
        f"the API server rejected Deployment {NS}/frontier-premium (HTTP {code}): {message}"
    )


def test_a_deployment_apply_that_fails_otherwise_is_retried(api: ApiServer) -> None:
    api.answers[("PATCH", DEPLOYMENT)] = (500, status_body(500, "InternalError", "etcd timeout"))
    manifest = {"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "frontier-premium", "namespace": NS}}  # fmt: skip
    with pytest.raises(kopf.TemporaryError, match="HTTP 500: etcd timeout"):
        cluster_of(api).apply(manifest)


POOL = f"/apis/tiergate.dev/v1alpha1/namespaces/{NS}/inferencepools/frontier-premium"


def stored_pool(version: str, conditions: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "tiergate.dev/v1alpha1", "kind": "InferencePool",
            "metadata": {"name": "frontier-premium", "namespace": NS, "resourceVersion": version},
            "spec": {}, "status": {"conditions": conditions}}  # fmt: skip


def test_a_status_write_is_rebased_and_made_again_when_another_write_came_between(
    api: ApiServer,
) -> None:
    """The autoscaler's write, computed when Ready was False: reconcile's Ready=True, written
    since, is kept, and a write that loses the race (409) is rebased on the pool read again."""
    ready = {"type": "Ready", "status": "True", "reason": "Serving"}
    not_ready = {"type": "Ready", "status": "False", "reason": "ReplicasNotReady"}
    holding = {"type": "Autoscaling", "status": "True", "reason": "Holding"}
    scaled = {"type": "Autoscaling", "status": "True", "reason": "ScaledUp"}
    api.answers[("GET", POOL)] = (200, stored_pool("7", [ready]))
    api.then[("GET", POOL)] = [(200, stored_pool("8", [ready, holding]))]
    conflict = status_body(409, "Conflict", "the object has been modified")
    api.answers[("PATCH", POOL + "/status")] = (409, conflict)
    api.then[("PATCH", POOL + "/status")] = [(200, stored_pool("9", []))]
    cluster_of(api).patch_pool_status(
        NS, "frontier-premium", {"conditions": [not_ready, scaled], "autoscaling": {}},
        base={"conditions": [not_ready]},
    )  # fmt: skip
    patches = [r for r in api.requests if r[0] == "PATCH"]
    assert [p[4]["metadata"]["resourceVersion"] for p in patches] == ["7", "8"]
    assert patches[-1][4]["status"] == {"conditions": [ready, scaled], "autoscaling": {}}


def test_a_status_write_that_keeps_losing_the_race_is_retried_later(api: ApiServer) -> None:
    api.answers[("GET", POOL)] = (200, stored_pool("7", []))
    api.answers[("PATCH", POOL + "/status")] = (409, status_body(409, "Conflict", "modified"))
    with pytest.raises(kopf.TemporaryError, match="changed by another writer 5 times"):
        cluster_of(api).patch_pool_status(NS, "frontier-premium", {"conditions": []}, base={})
