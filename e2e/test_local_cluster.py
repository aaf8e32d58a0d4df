"""The local backend as a person uses it (`make cluster`): reachable from this machine only,
kubectl's default namespace the watched one, `kubectl logs` and `kubectl port-forward` working
although its pods are local processes."""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
from cluster import REPO, LocalCluster
from release import BACKEND, Release

pytestmark = [
    pytest.mark.skipif(
        BACKEND != "local", reason="the local backend's own processes (kind runs in containers)"
    ),
    pytest.mark.usefixtures("pools_removed"),
]


@pytest.fixture(scope="module")
def release(module_release: Release) -> Release:
    """One release for the module: its tests read it, and one adds a pool."""
    return module_release


LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's `st` column


def cluster_pids(cluster: LocalCluster) -> dict[int, str]:
    """pid -> what it is: kwokctl's components (its pid files), the pod runner and every
    process under it (the pods)."""
    pids: dict[int, str] = {}
    for pid_file in (cluster.state / "kwok" / "clusters" / cluster.name / "pids").glob("*.pid"):
        pids[int(pid_file.read_text().strip())] = pid_file.stem
    runner = int(cluster.runner_pid_file.read_text())
    pids[runner] = "pod-runner"
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        parents[int(stat.parent.name)] = int(fields[1])
    for pid in parents:
        ancestor = parents.get(pid)
        while ancestor is not None and ancestor != runner:
            ancestor = parents.get(ancestor)
        if ancestor == runner:
            pids[pid] = "pod process"
    return pids


def listening_sockets() -> dict[int, ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """Socket inode -> local address of every listening TCP socket in this network namespace
    (the pods' processes share it: the runner gives them a mount namespace only)."""
    found: dict[int, ipaddress.IPv4Address | ipaddress.IPv6Address] = {}
    for table, size in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 16)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != LISTEN:
                continue
            raw = bytes.fromhex(fields[1].split(":")[0])
            # The kernel prints each 32-bit word in host (little-endian) order.
            words = b"".join(raw[i : i + 4][::-1] for i in range(0, size, 4))
            found[int(fields[9])] = ipaddress.ip_address(words)
    return found


def sockets_of(pid: int) -> set[int]:
    inodes = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    except OSError:
        pass  # exited meanwhile
    return inodes


def test_nothing_of_the_cluster_listens_beyond_loopback(release: Release) -> None:
    """etcd serves plain, unauthenticated HTTP: it, the API server, the controller manager, the
    scheduler, kwok, the runner and the pods must all listen on 127.0.0.0/8 (or ::1) only."""
    pids = cluster_pids(release.cluster)  # the release's router answers: its pods run
    listening = listening_sockets()
    seen: dict[str, list[str]] = {}
    for pid, what in pids.items():
        for inode in sockets_of(pid) & listening.keys():
            address = listening[inode]
            mapped = getattr(address, "ipv4_mapped", None)
            seen.setdefault(what, []).append(str(address))
            assert (mapped or address).is_loopback, f"{what} (pid {pid}) listens on {address}"
    # Not vacuous: every component was found listening, and the pods too.
    components = {"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler",
                  "kwok-controller", "pod process"}  # fmt: skip
    assert components <= seen.keys(), seen


def test_kubectl_logs_and_port_forward_reach_the_pods(release: Release) -> None:
    """What NOTES.txt tells people to run works on this backend too."""
    router = f"deploy/{release.name}-router"
    release.wait(
        lambda: "Application startup complete" in release.kubectl("logs", router),
        "the router's log through kubectl logs",
    )
    operator_log = release.kubectl("logs", f"deploy/{release.name}-operator")
    assert "kopf" in operator_log or "operator" in operator_log, operator_log[-500:]
    url = release.port_forward()
    assert url.startswith("http://127.0.0.1:")
    assert httpx.get(f"{url}/healthz", timeout=10.0).json() == {"status": "ok"}
    assert httpx.get(f"{url}/v1/models", timeout=10.0).status_code == 200


def test_pools_applied_without_a_namespace_land_where_the_operator_watches(
    release: Release, tmp_path: Path
) -> None:
    """`make cluster`'s kubeconfig defaults to the chart's namespace: `kubectl apply -f
    examples/` with no -n gives pools the operator reconciles, not pools ignored in `default`."""
    cluster = release.cluster
    # A copy of the session's kubeconfig, made the way `cluster.py up` makes its own.
    mine = LocalCluster(cluster.name, tmp_path, cluster.bin)
    shutil.copy(cluster.kubeconfig, mine.kubeconfig)
    mine.default_namespace(release.namespace)
    done = subprocess.run(
        [str(cluster.bin / "kubectl"), "apply", "-f", str(REPO / "examples" / "batched.yaml")],
        env=mine.env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    release.wait(
        lambda: (release.condition("frontier-batched", "Fits") or {}).get("status") == "True",
        "frontier-batched reconciled in the release namespace",
    )
    assert not cluster.kubectl(
        "get", "inferencepools.tiergate.dev", "-n", "default", "--ignore-not-found", "-o", "name"
    ).strip()
