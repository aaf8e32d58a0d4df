"""`Release`: the chart installed in one test's namespace, and what an e2e test asks of it.

In the harness (not in e2e/conftest.py) so that test modules import it by a name no other
conftest shadows: `pytest tests e2e` in one run would otherwise find tests/'s conftest.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from cluster import HarnessError, LocalCluster

from tiergate.pools import GROUP, PLURAL, VERSION

log = logging.getLogger(__name__)

#: `local` (the pod runner, pods on 127.x addresses) or `kind` (TIERGATE_E2E_BACKEND).
BACKEND = os.environ.get("TIERGATE_E2E_BACKEND", "local")


class Release:
    """The chart installed in one test's namespace, and what a test asks of it."""

    def __init__(self, cluster: LocalCluster, namespace: str, name: str = "tiergate") -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.name = name
        self._forward: subprocess.Popen[str] | None = None
        self._router_url: str | None = None

    def kubectl(self, *args: str, check: bool = True, input: str | None = None) -> str:
        return self.cluster.kubectl("-n", self.namespace, *args, check=check, input=input)

    def apply(self, manifest: str) -> subprocess.CompletedProcess[str]:
        """`kubectl apply` of `manifest` in the namespace, its exit code and output kept (a
        refusal, and what it says, is what some tests want)."""
        return subprocess.run(
            [str(self.cluster.bin / "kubectl"), "-n", self.namespace, "apply", "-f", "-"],
            input=manifest, capture_output=True, text=True, env=self.cluster.env, check=False,
        )  # fmt: skip

    def install(self, *values: str) -> None:
        try:
            self.cluster.install_chart(self.namespace, self.name, *values)
        except HarnessError as exc:
            pytest.fail(f"helm install failed: {exc}\n{self.diagnose()}")

    def get(self, kind: str, name: str) -> dict[str, Any]:
        """The object as `kubectl get KIND NAME -o json` prints it (HarnessError if none)."""
        path = _object_path(kind, self.namespace, name)
        if path is None:
            out: dict[str, Any] = json.loads(self.kubectl("get", kind, name, "-o", "json"))
            return out
        found = self.cluster.read(path)
        if found is None:
            raise HarnessError(f"{kind} {name} not found in {self.namespace}")
        return found

    def exists(self, kind: str, name: str) -> bool:
        path = _object_path(kind, self.namespace, name)
        if path is None:
            out = self.kubectl("get", kind, name, "--ignore-not-found", "-o", "name", check=False)
            return bool(out.strip())
        return self.cluster.read(path) is not None

    def ready_replicas(self, pool: str) -> int:
        """The pool's status.readyReplicas (0 before the operator's first status write)."""
        status = self.get("inferencepool.tiergate.dev", pool).get("status") or {}
        return int(status.get("readyReplicas") or 0)

    def pool_pods(self, pool: str, *, ready: bool = False) -> dict[str, str]:
        """name -> IP of the pool's pods that have an IP (with `ready`: and are Ready)."""
        return self._pods(f"tiergate.dev/pool={pool}", ready=ready)

    def router_pods(self, *, ready: bool = False) -> dict[str, str]:
        """name -> IP of the release's router pods, as `pool_pods`."""
        selector = f"app.kubernetes.io/instance={self.name},app.kubernetes.io/component=router"
        return self._pods(selector, ready=ready)

    def _pods(self, selector: str, *, ready: bool) -> dict[str, str]:
        out: dict[str, str] = {}
        for pod in self.cluster.pods(self.namespace, selector):
            meta: Any = pod["metadata"]
            status: Any = pod.get("status") or {}
            conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
            if ready and conditions.get("Ready") != "True":
                continue
            if status.get("podIP") and not meta.get("deletionTimestamp"):
                out[meta["name"]] = status["podIP"]
        return out

    def operator_pods(self, *, ready: bool = False) -> dict[str, str]:
        """name -> IP of the release's operator pods, as `pool_pods`."""
        selector = f"app.kubernetes.io/instance={self.name},app.kubernetes.io/component=operator"
        return self._pods(selector, ready=ready)

    def pod_metrics(self, pod: str, ip: str, port: int) -> str:
        """A pod's /metrics text on `port`.

        Local backend: the pod IP is on this machine. kind: pod IPs are inside the cluster,
        so through the API server's pod proxy (which refuses loopback IPs, hence not local).
        """
        if BACKEND == "local":
            return httpx.get(f"http://{ip}:{port}/metrics", timeout=5.0).text
        path = f"/api/v1/namespaces/{self.namespace}/pods/{pod}:{port}/proxy/metrics"
        return self.cluster.kubectl("get", "--raw", path)

    def served_requests(self, pod: str, ip: str) -> float:
        """vllm:request_success_total of one sim node, summed over labels, read from the node."""
        text = self.pod_metrics(pod, ip, 8000)
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("vllm:request_success_total")
        )

    def condition(self, pool: str, kind: str) -> dict[str, Any] | None:
        status = self.get("inferencepool.tiergate.dev", pool).get("status") or {}
        for cond in status.get("conditions") or []:
            if cond.get("type") == kind:
                return dict(cond)
        return None

    def remove_pools(self) -> None:
        """Delete every InferencePool in the namespace and wait until what each one made is
        gone too (foreground deletion: its Deployment, Service and pods first), so that the
        next test of a module sharing this release finds no pool of this one's and may use
        its names again."""
        self.kubectl(
            "delete", "inferencepools.tiergate.dev", "--all", "--cascade=foreground",
            "--wait=true", "--timeout=120s",
        )  # fmt: skip

    def wait(self, check: Callable[[], bool], what: str, timeout_s: float = 90) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if check():
                    return
            except (HarnessError, httpx.HTTPError):
                pass  # not there yet (a pod not listening, an object not created)
            time.sleep(0.5)
        pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}\n{self.diagnose()}")

    def router_url(self) -> str:
        if self._router_url is not None:
            return self._router_url
        if BACKEND == "local":
            self._router_url = self.cluster.router_url(self.namespace, self.name)
        else:
            self._router_url = self.port_forward()
        return self._router_url

    def port_forward(self) -> str:
        """kubectl port-forward to the router's Service (on both backends: on the local one
        kwok forwards to the pod's process); its chatter goes to a file (a pipe nobody reads
        would fill up and stall it). One per release: stopped by `close`."""
        assert self._forward is None, "one port-forward per release"
        out = self.cluster.state / f"port-forward-{self.namespace}.log"
        with out.open("w") as sink:
            self._forward = subprocess.Popen(
                [str(self.cluster.bin / "kubectl"), "-n", self.namespace, "port-forward",
                 f"svc/{self.name}-router", ":8080"],
                env=self.cluster.env, stdout=sink, stderr=subprocess.STDOUT,
            )  # fmt: skip
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self._forward.poll() is None:
            m = re.search(r"127\.0\.0\.1:(\d+)", out.read_text())
            if m:
                return f"http://127.0.0.1:{m.group(1)}"
            time.sleep(0.2)
        pytest.fail(f"kubectl port-forward did not start: {out.read_text()[-500:]!r}")

    def diagnose(self) -> str:
        """What a person would look at first: objects, describe, pod logs."""
        parts = []
        for args in (
            ("get", "inferencepools.tiergate.dev,deployments,pods,services", "-o", "wide"),
            ("describe", "inferencepools.tiergate.dev"),
            ("describe", "pods"),
            ("get", "events", "--sort-by=.lastTimestamp"),
        ):
            out = self.cluster.kubectl("-n", self.namespace, *args, check=False)
            parts.append(f"$ kubectl -n {self.namespace} {' '.join(args)}\n{out.strip()[-4000:]}")
        if BACKEND == "local":
            logs = self.cluster.state / "runner" / "logs"
            for f in sorted(logs.glob(f"{self.namespace}_*.log")) if logs.exists() else ():
                parts.append(f"--- {f.name} (tail)\n{f.read_text(errors='replace')[-2000:]}")
        else:
            args = (
                "logs",
                "--all-containers",
                "--prefix",
                "--tail=30",
                "--max-log-requests=20",
                "-l",
                "app.kubernetes.io/name",  # the chart's pods and the sim nodes
            )
            out = self.cluster.kubectl("-n", self.namespace, *args, check=False)
            parts.append(f"$ kubectl -n {self.namespace} {' '.join(args)}\n{out.strip()[-4000:]}")
        return "\n\n".join(parts)

    def close(self) -> None:
        if self._forward is not None:
            self._forward.terminate()
            self._forward.wait()


#: kubectl's names of the kinds the tests read most -> where in the API they are (the others go
#: through kubectl).
_API_PATHS = {
    "deployment": "/apis/apps/v1/namespaces/{namespace}/deployments/{name}",
    "service": "/api/v1/namespaces/{namespace}/services/{name}",
    "poddisruptionbudget": "/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets/{name}",
    f"inferencepool.{GROUP}": f"/apis/{GROUP}/{VERSION}/namespaces/{{namespace}}/{PLURAL}/{{name}}",
}


def _object_path(kind: str, namespace: str, name: str) -> str | None:
    template = _API_PATHS.get(kind)
    return None if template is None else template.format(namespace=namespace, name=name)


def namespace_for(test_name: str) -> str:
    """A fresh namespace named after the test (a DNS label)."""
    short = re.sub(r"[^a-z0-9]+", "-", test_name.lower().removeprefix("test_"))[:40]
    return f"{short.strip('-')}-{uuid.uuid4().hex[:5]}"


@contextmanager
def installed(
    cluster: LocalCluster,
    namespace: str,
    *values: str,
    prepare: Callable[[Release], None] | None = None,
) -> Iterator[Release]:
    """The chart installed with `values` (helm arguments) in `namespace` and its router
    answering; `prepare` runs first, in the namespace (e.g. to create a Secret the values name).
    Everything is removed afterwards."""
    r = Release(cluster, namespace)
    try:
        if prepare is not None:
            cluster.kubectl("create", "namespace", namespace)
            prepare(r)
        r.install(*values)
        r.wait(lambda: _healthy(r), "the router's /healthz", 60)
        yield r
    finally:
        r.close()
        # Emptied while the next test starts (it is in a namespace of its own); `settle` waits.
        remover = threading.Thread(target=_remove, args=(cluster, namespace, r.name))
        remover.start()
        _removals.append(remover)


#: Namespaces of tests that ended, still being emptied.
_removals: list[threading.Thread] = []


def settle() -> None:
    """Wait until every earlier test's namespace is emptied (no pod left, the namespace's
    deletion begun): before a test that measures speed (it needs the machine quiet) and before
    the cluster is deleted."""
    while _removals:
        _removals.pop().join()


def _remove(cluster: LocalCluster, namespace: str, release: str) -> None:
    # Pools first, while their operator still runs (its sim nodes stop with them). Then every
    # Deployment, until their pods have stopped, while the release's RBAC still stands: an
    # operator whose Role went first retries its peering's last write (kopf retries a 403) for
    # most of its grace period. Then the release, and the namespace once no pod is left in it
    # (the namespace controller looks again at one that held terminating pods only after half
    # their grace period). What is left in it holds nothing running: its deletion is not waited
    # for (the namespace controller starts one only after five seconds).
    ns = ("-n", namespace)
    cluster.kubectl(
        *ns, "delete", "inferencepools.tiergate.dev", "--all", "--timeout=60s", check=False
    )
    cluster.kubectl(
        *ns, "delete", "deployments", "--all", "--cascade=foreground", "--timeout=60s",
        check=False,
    )  # fmt: skip
    _pods_gone(cluster, namespace, within_s=60)
    cluster.helm("uninstall", release, *ns, "--wait", "--timeout", "2m", check=False)
    cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def _pods_gone(cluster: LocalCluster, namespace: str, within_s: float) -> None:
    """Wait until `namespace` has no pod (the namespace's deletion ends the rest); past
    `within_s`, say which are left and go on (e.g. a failed `helm test` pod, which stays)."""
    deadline = time.monotonic() + within_s
    left: list[str] = []
    while time.monotonic() < deadline:
        try:
            pods = cluster.read(f"/api/v1/namespaces/{namespace}/pods")
            left = [p["metadata"]["name"] for p in (pods or {}).get("items", [])]
            if not left:
                return
        except HarnessError:
            pass  # the API server busy for a moment: look again
        time.sleep(0.2)
    log.warning("namespace %s: pods left after %.0f s: %s", namespace, within_s, left)


def _healthy(r: Release) -> bool:
    return httpx.get(f"{r.router_url()}/healthz", timeout=2.0).status_code == 200
