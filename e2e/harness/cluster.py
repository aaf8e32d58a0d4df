"""The local backend: a real control plane (kwokctl, binary runtime) plus the pod runner.

    python -P e2e/harness/cluster.py up     # cluster + pod runner + the chart in `tiergate`
    python -P e2e/harness/cluster.py down   # removes everything `up` started
    python -P e2e/harness/cluster.py env    # KUBECONFIG=... and the router's address

kube-apiserver, kube-controller-manager, kube-scheduler, etcd and kwok are the binaries
e2e/tools/install.sh built; kwokctl is pointed at them and downloads nothing. Every one of
them listens on 127.0.0.1 only, and pod IPs come from a /16 inside 127.0.0.0/8 (one per
cluster name), so nothing of the cluster is reachable from another machine. `up` makes the
chart's namespace kubectl's default in the kubeconfig it writes.
Everything lives under the state folder (default ~/.cache/tiergate/e2e-cluster/<name>).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import config
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "tiergate"
DEFAULT_NAME = "tiergate"
# kwok's pod stages replaced by one: a new pod is Running with an IP but *not* Ready. The pod
# runner reports Ready when the pod's readinessProbe passes, and removes a deleted pod once
# its process has exited, as a kubelet does (kwok's pod-delete stage would remove it at once,
# while the process still runs). Node stages stay kwok's.
KWOK_CONFIG = """\
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokctlConfiguration
options:
  # Every component on loopback: kwokctl's default, 0.0.0.0, would serve etcd's plain,
  # unauthenticated HTTP and the control plane's ports to the whole network.
  bindAddress: 127.0.0.1
  # The pod runner makes a Logs and a PortForward object for each pod it runs, so that
  # `kubectl logs` and `kubectl port-forward` reach the pod's process through kwok.
  enableCRDs: [Logs, PortForward]
componentsPatches:
- name: kube-apiserver
  extraArgs:
  # Beside the default plugins, OpenShift's: setting blockOwnerDeletion on an owner reference
  # needs `update` on the owner's finalizers, so the chart's RBAC is held to it here.
  - key: enable-admission-plugins
    value: OwnerReferencesPermissionEnforcement
---
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options:
  cidr: {cidr}
  nodeIP: 127.0.0.1
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-running-unready
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {key: .metadata.deletionTimestamp, operator: DoesNotExist}
    - {key: .status.podIP, operator: DoesNotExist}
  next:
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      - {type: Initialized, status: "True", lastTransitionTime: {{ $now | Quote }}}
      - {type: Ready, status: "False", lastTransitionTime: {{ $now | Quote }}}
      - {type: ContainersReady, status: "False", lastTransitionTime: {{ $now | Quote }}}
      containerStatuses:
      {{ range .spec.containers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: false
        started: true
        restartCount: 0
        state: {running: {startedAt: {{ $now | Quote }}}}
      {{ end }}
      hostIP: {{ NodeIPWith .spec.nodeName | Quote }}
      podIP: {{ PodIPWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" )
        ( or .metadata.name "" ) ( or .metadata.namespace "" ) | Quote }}
      phase: Running
      startTime: {{ $now | Quote }}
"""
NODE = """\
apiVersion: v1
kind: Node
metadata:
  name: kwok-node-0
  annotations:
    node.alpha.kubernetes.io/ttl: "0"
    kwok.x-k8s.io/node: fake
  labels:
    kubernetes.io/hostname: kwok-node-0
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    type: kwok
spec: {}
status:
  allocatable: {cpu: "64", memory: 256Gi, pods: "220"}
  capacity: {cpu: "64", memory: 256Gi, pods: "220"}
"""


def pod_cidr(name: str) -> str:
    """A /16 inside 127.0.0.0/8 of the cluster's own (127.100-199.x.y): two clusters on one
    machine (`make cluster` and a test run) never hand out the same pod IP."""
    return f"127.{100 + zlib.crc32(name.encode()) % 100}.0.1/16"


class HarnessError(Exception):
    """Something the harness cannot do; the message is one line for people."""


def tools_bin(*, build: bool = True) -> Path | None:
    """The folder of pinned Kubernetes binaries, building them on first use (install.sh).

    `build=False`: None when they are not there yet (nothing to tear down then either).
    """
    env = {**os.environ, "PYTHON": sys.executable}
    flags = [] if build else ["--installed"]
    out = subprocess.run(
        ["bash", str(REPO / "e2e" / "tools" / "install.sh"), *flags],
        stdout=subprocess.PIPE,
        env=env,
        text=True,
        check=False,
    )
    if out.returncode == 3 and not build:
        return None
    if out.returncode != 0:
        raise HarnessError("e2e/tools/install.sh failed (see its output above)")
    return Path(out.stdout.strip().splitlines()[-1])


def default_state(name: str) -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tiergate" / "e2e-cluster" / name


@dataclass
class LocalCluster:
    """One kwokctl cluster and the pod runner serving it."""

    name: str
    state: Path
    bin: Path
    # The pod runner this object started (None when another process did: `cluster.py down`).
    runner: subprocess.Popen[bytes] | None = None
    # The API client `read` keeps, made on first use.
    _api: ApiClient | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def kubeconfig(self) -> Path:
        return self.state / "kubeconfig"

    @property
    def runner_pid_file(self) -> Path:
        return self.state / "pod-runner.pid"

    @property
    def env(self) -> dict[str, str]:
        """The environment for kubectl, helm and the clients: our binaries and kubeconfig."""
        return {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "KWOK_WORKDIR": str(self.state / "kwok"),
            "PATH": f"{self.bin}:{os.environ.get('PATH', '')}",
            "HELM_CACHE_HOME": str(self.state / "helm" / "cache"),
            "HELM_CONFIG_HOME": str(self.state / "helm" / "config"),
            "HELM_DATA_HOME": str(self.state / "helm" / "data"),
        }

    def run(self, *argv: str, check: bool = True, input: str | None = None) -> str:
        done = subprocess.run(
            list(argv), env=self.env, input=input, capture_output=True, text=True, check=False
        )
        if check and done.returncode != 0:
            raise HarnessError(
                f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()[-1500:]}"
            )
        return done.stdout

    def kubectl(self, *args: str, check: bool = True, input: str | None = None) -> str:
        return self.run(str(self.bin / "kubectl"), *args, check=check, input=input)

    def read(self, path: str, **query: str) -> dict[str, Any] | None:
        """GET an API path through the official client: the object as `kubectl get -o json`
        prints it, or None when there is none (404). For reads the tests repeat while they wait:
        a kubectl process costs ~0.1 s of CPU, a request through a kept client a millisecond."""
        if self._api is None:
            self._api = config.new_client_from_config(config_file=str(self.kubeconfig))
        api = self._api
        request = api.param_serialize(
            "GET", path, query_params=list(query.items()),
            header_params={"Accept": "application/json"}, auth_settings=["BearerToken"],
        )  # fmt: skip
        try:
            response = api.call_api(*request, _request_timeout=10)
            body = response.read()
        except (ApiException, urllib3.exceptions.HTTPError) as exc:
            raise HarnessError(f"GET {path}: {exc}") from None
        if response.status == 404:
            return None
        if response.status >= 400:
            raise HarnessError(f"GET {path}: {response.status} {body[:300]!r}")
        found: dict[str, Any] = json.loads(body)
        return found

    def helm(self, *args: str, check: bool = True) -> str:
        return self.run(str(self.bin / "helm"), *args, check=check)

    # -- lifecycle --------------------------------------------------------------------------
    def create(self) -> None:
        self.state.mkdir(parents=True, exist_ok=True)
        config = self.state / "kwok.yaml"
        config.write_text(KWOK_CONFIG.replace("{cidr}", pod_cidr(self.name)))
        b = self.bin
        self.run(
            str(b / "kwokctl"),
            "create",
            "cluster",
            "--name",
            self.name,
            "--config",
            str(config),
            "--runtime",
            "binary",
            "--kube-apiserver-binary",
            str(b / "kube-apiserver"),
            "--kube-controller-manager-binary",
            str(b / "kube-controller-manager"),
            "--kube-scheduler-binary",
            str(b / "kube-scheduler"),
            "--kwok-controller-binary",
            str(b / "kwok"),
            "--etcd-binary",
            str(b / "etcd"),
            "--kube-authorization",
            "--kube-admission",
            "--kubeconfig",
            str(self.kubeconfig),
            "--wait",
            "2m",
        )
        self.kubectl("apply", "-f", "-", input=NODE)
        self.wait_for(
            lambda: (
                "True"
                in self.kubectl(
                    "get",
                    "node",
                    "kwok-node-0",
                    "-o",
                    "jsonpath={.status.conditions[?(@.type=='Ready')].status}",
                    check=False,
                )
            ),
            "node kwok-node-0 Ready",
            60,
        )

    def delete(self) -> None:
        self.stop_runner()
        self.run(
            str(self.bin / "kwokctl"),
            "delete",
            "cluster",
            "--name",
            self.name,
            "--kubeconfig",
            str(self.kubeconfig),
            check=False,
        )

    def start_runner(self, tiergate: Path) -> None:
        """Start the pod runner in the background; wait until it watches pods (or failed)."""
        self.stop_runner()
        ready = self.state / "pod-runner.ready"
        ready.unlink(missing_ok=True)
        log_path = self.state / "pod-runner.log"
        with log_path.open("ab") as log:
            proc = subprocess.Popen(  # noqa: S603
                [sys.executable, "-P", str(Path(__file__).with_name("pod_runner.py")),
                 "--kubeconfig", str(self.kubeconfig), "--state-dir", str(self.state / "runner"),
                 "--tiergate", str(tiergate), "--ready-file", str(ready)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip
        self.runner = proc
        self.runner_pid_file.write_text(str(proc.pid))
        deadline = time.monotonic() + 60
        while not ready.exists():
            if proc.poll() is not None:
                last = log_path.read_text(errors="replace").strip().splitlines()[-1:]
                raise HarnessError(f"the pod runner exited {proc.returncode}: {' '.join(last)}")
            if time.monotonic() > deadline:
                raise HarnessError(f"the pod runner did not start in 60 s: see {log_path}")
            time.sleep(0.2)

    def stop_runner(self) -> None:
        """SIGTERM (the runner stops its pods' processes), SIGKILL after 30 s."""
        try:
            pid = int(self.runner_pid_file.read_text())
        except (OSError, ValueError):
            return
        if not _is_runner(pid, self.state):
            self.runner_pid_file.unlink(missing_ok=True)  # a stale file: that PID is another's
            return
        try:
            os.kill(pid, signal.SIGTERM)
            for _ in range(300):
                if self.runner is not None and self.runner.poll() is not None:
                    break  # our child: reaped (a zombie would still answer kill 0)
                os.kill(pid, 0)
                time.sleep(0.1)
            else:
                os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if self.runner is not None:
            self.runner.wait()
            self.runner = None
        self.runner_pid_file.unlink(missing_ok=True)

    # -- the chart ----------------------------------------------------------------------------
    def install_chart(self, namespace: str, release: str = "tiergate", *values: str) -> None:
        """helm install (CRDs, operator, router) watching only `namespace`."""
        self.helm(
            "upgrade",
            "--install",
            release,
            str(CHART),
            "--namespace",
            namespace,
            "--create-namespace",
            "--set",
            f"operator.watchNamespaces={{{namespace}}}",
            *values,
            "--wait",
            "--timeout",
            "3m",
        )

    def default_namespace(self, namespace: str) -> None:
        """Make `namespace` kubectl's default in the kubeconfig: `kubectl apply -f examples/`
        then lands where the operator watches, not in `default`, where it is ignored."""
        self.kubectl("config", "set-context", "--current", "--namespace", namespace)

    def pods(self, namespace: str, selector: str) -> list[dict[str, object]]:
        found = self.read(f"/api/v1/namespaces/{namespace}/pods", labelSelector=selector)
        items: list[dict[str, object]] = (found or {}).get("items") or []
        return items

    def router_url(self, namespace: str, release: str = "tiergate") -> str:
        """http://<router pod IP>:8080 of a Running router pod (the Service has no proxy here)."""
        selector = f"app.kubernetes.io/instance={release},app.kubernetes.io/component=router"
        for pod in self.pods(namespace, selector):
            status = pod.get("status") or {}
            if (
                isinstance(status, dict)
                and status.get("phase") == "Running"
                and status.get("podIP")
            ):
                return f"http://{status['podIP']}:8080"
        raise HarnessError(f"no Running router pod in {namespace}")

    @staticmethod
    def wait_for(check: object, what: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if check():  # type: ignore[operator]
                return
            time.sleep(0.5)
        raise HarnessError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _is_runner(pid: int, state: Path) -> bool:
    """PIDs are reused (the state outlives reboots): only signal our own runner."""
    cmd = _cmdline(pid)
    return "pod_runner.py" in cmd and str(state) in cmd


def reap_stale_test_clusters(bin_dir: Path) -> list[str]:
    """Delete the clusters of test sessions that died without cleaning up (killed pytest).

    A test cluster is named tg-e2e-<pid of the pytest or shared_cluster.py that started it>;
    one whose process is gone is stale.
    """
    root = default_state("x").parent
    reaped = []
    for state in sorted(root.glob("tg-e2e-*")) if root.exists() else ():
        pid = state.name.removeprefix("tg-e2e-")
        owner = _cmdline(int(pid)) if pid.isdigit() else ""
        if "pytest" in owner or "shared_cluster.py" in owner:
            continue  # its session is still running
        LocalCluster(state.name, state, bin_dir).delete()
        shutil.rmtree(state, ignore_errors=True)
        reaped.append(state.name)
    return reaped


def wait_http_ok(url: str, timeout_s: float) -> None:
    import httpx

    def ok() -> bool:
        try:
            return httpx.get(url, timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    LocalCluster.wait_for(ok, url, timeout_s)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="tiergate's local e2e cluster (kwok + pod runner)")
    p.add_argument("action", choices=["up", "down", "env"])
    p.add_argument("--name", default=DEFAULT_NAME)
    p.add_argument("--namespace", default="tiergate", help="where `up` installs the chart")
    args = p.parse_args(argv)
    try:
        state = default_state(args.name)
        if args.action == "down":
            installed = tools_bin(build=False)
            if installed is None or not state.exists():
                print(f"no cluster {args.name}: nothing to remove")
                return 0
            LocalCluster(args.name, state, installed).delete()
            print(f"cluster {args.name} removed")
            return 0
        bin_dir = tools_bin()
        assert bin_dir is not None
        cluster = LocalCluster(args.name, state, bin_dir)
        if args.action == "up":
            cluster.create()
            cluster.start_runner(REPO / ".venv" / "bin" / "tiergate")
            cluster.install_chart(args.namespace)
            cluster.default_namespace(args.namespace)
        url = cluster.router_url(args.namespace)
        if args.action == "up":
            wait_http_ok(f"{url}/healthz", 60)
        print(f"export KUBECONFIG={cluster.kubeconfig}")
        print(f"export PATH={cluster.bin}:$PATH")
        print(f"# kubectl's default namespace: {args.namespace}, the one the operator watches")
        print(f"# router: {url}   (or: kubectl port-forward svc/tiergate-router 8080:8080)")
        print("# logs: kubectl logs deploy/tiergate-router (deploy/tiergate-operator, a pod...)")
        return 0
    except HarnessError as exc:
        print(f"cluster: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
