"""Fixtures of the e2e suite: one cluster per session, one namespace and release per test.

Backends (TIERGATE_E2E_BACKEND):
- `local` (default): kwokctl's binary runtime on the binaries e2e/tools/install.sh builds, plus
  the pod runner (e2e/harness/pod_runner.py) standing in for a container runtime. Building the
  binaries needs the Go module proxy; if it cannot be reached the session fails, never skips.
- `kind`: an existing cluster (KUBECONFIG, e.g. from e2e/kind.sh) whose nodes run the image.
  The router is reached through `kubectl port-forward`.

Every failure message carries `kubectl describe` output and the pods' logs of the namespace.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent / "harness"))

from cluster import (  # noqa: E402
    REPO,
    HarnessError,
    LocalCluster,
    default_state,
    reap_stale_test_clusters,
    tools_bin,
)

BACKEND = os.environ.get("TIERGATE_E2E_BACKEND", "local")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.e2e)


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

    def install(self, *values: str) -> None:
        try:
            self.cluster.install_chart(self.namespace, self.name, *values)
        except HarnessError as exc:
            pytest.fail(f"helm install failed: {exc}\n{self.diagnose()}")

    def get(self, kind: str, name: str) -> dict[str, Any]:
        out: dict[str, Any] = json.loads(self.kubectl("get", kind, name, "-o", "json"))
        return out

    def exists(self, kind: str, name: str) -> bool:
        out = self.kubectl("get", kind, name, "--ignore-not-found", "-o", "name", check=False)
        return bool(out.strip())

    def ready_replicas(self, pool: str) -> int:
        """The pool's status.readyReplicas (0 before the operator's first status write)."""
        status = self.get("inferencepool", pool).get("status") or {}
        return int(status.get("readyReplicas") or 0)

    def pool_pods(self, pool: str, *, ready: bool = False) -> dict[str, str]:
        """name -> IP of the pool's pods that have an IP (with `ready`: and are Ready)."""
        out: dict[str, str] = {}
        for pod in self.cluster.pods(self.namespace, f"tiergate.dev/pool={pool}"):
            meta: Any = pod["metadata"]
            status: Any = pod.get("status") or {}
            conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
            if ready and conditions.get("Ready") != "True":
                continue
            if status.get("podIP") and not meta.get("deletionTimestamp"):
                out[meta["name"]] = status["podIP"]
        return out

    def served_requests(self, pod: str, ip: str) -> float:
        """vllm:request_success_total of one sim node, summed over labels, read from the node.

        Local backend: the pod IP is on this machine. kind: pod IPs are inside the cluster,
        so through the API server's pod proxy (which refuses loopback IPs, hence not local).
        """
        if BACKEND == "local":
            text = httpx.get(f"http://{ip}:8000/metrics", timeout=5.0).text
        else:
            path = f"/api/v1/namespaces/{self.namespace}/pods/{pod}:8000/proxy/metrics"
            text = self.cluster.kubectl("get", "--raw", path)
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("vllm:request_success_total")
        )

    def condition(self, pool: str, kind: str) -> dict[str, Any] | None:
        status = self.get("inferencepool", pool).get("status") or {}
        for cond in status.get("conditions") or []:
            if cond.get("type") == kind:
                return dict(cond)
        return None

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
            self._router_url = self._port_forward()
        return self._router_url

    def _port_forward(self) -> str:
        """kubectl port-forward to the router's Service; its chatter goes to a file (a pipe
        nobody reads would fill up and stall it)."""
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
            ("get", "inferencepools,deployments,pods,services", "-o", "wide"),
            ("describe", "inferencepools"),
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


@pytest.fixture(scope="session")
def cluster() -> Iterator[LocalCluster]:
    if BACKEND == "kind":
        kubeconfig = os.environ.get("KUBECONFIG")
        if not kubeconfig:
            pytest.fail("TIERGATE_E2E_BACKEND=kind needs KUBECONFIG (e2e/kind.sh sets it)")
        bin_dir = Path(os.environ.get("TIERGATE_E2E_BIN", ""))
        state = default_state("kind")
        state.mkdir(parents=True, exist_ok=True)
        c = LocalCluster("kind", state, bin_dir)
        (state / "kubeconfig").unlink(missing_ok=True)
        (state / "kubeconfig").symlink_to(Path(kubeconfig).resolve())
        yield c
        return
    try:
        bin_dir = tools_bin()
    except HarnessError as exc:
        pytest.fail(f"cannot install the e2e tools: {exc}")
    reap_stale_test_clusters(bin_dir)
    name = f"tg-e2e-{os.getpid()}"
    c = LocalCluster(name, default_state(name), bin_dir)
    try:
        c.create()
        c.start_runner(REPO / ".venv" / "bin" / "tiergate")
    except HarnessError as exc:
        c.delete()
        pytest.fail(f"cannot start the local cluster: {exc}")
    yield c
    c.delete()
    shutil.rmtree(c.state, ignore_errors=True)


@pytest.fixture
def release(cluster: LocalCluster, request: pytest.FixtureRequest) -> Iterator[Release]:
    """The chart installed and ready in a fresh namespace; removed after the test."""
    short = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower().removeprefix("test_"))[:40]
    namespace = f"{short.strip('-')}-{uuid.uuid4().hex[:5]}"
    r = Release(cluster, namespace)
    try:
        r.install()
        r.wait(lambda: _ready(r), "the router's /healthz", 60)
        yield r
    finally:
        r.close()
        # Pools first, while their operator still runs (its sim nodes stop with them), then
        # the release, then the namespace: the next test starts on a quiet machine.
        ns = ("-n", namespace)
        cluster.kubectl(*ns, "delete", "inferencepools", "--all", "--timeout=60s", check=False)
        cluster.helm("uninstall", r.name, *ns, "--wait", "--timeout", "2m", check=False)
        cluster.kubectl("delete", "namespace", namespace, "--timeout=60s", check=False)


def _ready(r: Release) -> bool:
    return httpx.get(f"{r.router_url()}/healthz", timeout=2.0).status_code == 200
