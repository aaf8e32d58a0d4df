"""Pods going away under load, and the release's own lifecycle (helm upgrade, uninstall)."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import httpx
import pytest
from cluster import HarnessError
from release import Release
from test_pools import EXAMPLES, chat, served_by


class SteadyLoad:
    """Workers sending requests back to back until stopped; every outcome is kept."""

    def __init__(self, release: Release, tier: str, workers: int = 3) -> None:
        self.release, self.tier = release, tier
        self.outcomes: list[tuple[int, dict[str, Any] | str]] = []
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._work) for _ in range(workers)]

    def _work(self) -> None:
        while not self.stop.is_set():
            try:
                response = chat(self.release, self.tier)
            except httpx.HTTPError as exc:
                outcome: tuple[int, dict[str, Any] | str] = (0, f"{type(exc).__name__}: {exc}")
            else:  # an answer; its body is checked by the test (an error must be an envelope)
                try:
                    outcome = (response.status_code, response.json())
                except ValueError:
                    outcome = (response.status_code, response.text[:200])
            with self.lock:
                self.outcomes.append(outcome)

    def __enter__(self) -> SteadyLoad:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(90)


def test_a_node_deleted_under_load_leaves_no_request_unanswered(release: Release) -> None:
    pool = "spark-wafer"
    release.kubectl("apply", "-f", str(EXAMPLES / "wafer-scale.yaml"))
    release.kubectl(
        "patch", "inferencepool.tiergate.dev", pool, "--type=merge", "-p", '{"spec":{"replicas":2}}'
    )
    release.wait(
        lambda: release.ready_replicas(pool) == 2,
        "2 ready replicas",
    )
    release.wait(lambda: served_by(release, "wafer-scale"), "the router to serve wafer-scale")
    before = release.pool_pods(pool)
    victim = sorted(before)[0]
    with SteadyLoad(release, "wafer-scale") as load:
        release.wait(lambda: len(load.outcomes) >= 10, "the load to get going")
        release.kubectl("delete", "pod", victim, "--wait=false")

        def replacement_serves() -> bool:
            now = release.pool_pods(pool, ready=True)
            new = [(name, ip) for name, ip in now.items() if name not in before]
            return bool(new) and all(release.served_requests(n, ip) > 0 for n, ip in new)

        release.wait(replacement_serves, "the replacement pod to serve requests", 90)
    codes = Counter(code for code, _ in load.outcomes)
    lost = [body for code, body in load.outcomes if code == 0]
    assert not lost, f"requests without any answer: {lost[:3]}"
    # kwok removes the pod object at once and the runner then SIGTERMs the node: this is a
    # graceful removal (in-flight requests finish, new ones are refused and retried by the
    # router), not a node dying mid-request.
    for code, body in load.outcomes:
        if code != 200:
            assert isinstance(body, dict) and "message" in body.get("error", {}), (code, body)
    # Retries before the first byte hide the node's exit from clients entirely, or nearly.
    assert codes[200] >= 0.95 * len(load.outcomes), codes
    assert len(load.outcomes) >= 20, codes


RELEASE_KINDS = (
    "deployments,services,configmaps,secrets,serviceaccounts,roles,rolebindings,"
    "poddisruptionbudgets,horizontalpodautoscalers,kopfpeerings,clusterroles,clusterrolebindings,"
    "networkpolicies"
)


def release_objects(release: Release) -> list[str]:
    selector = f"app.kubernetes.io/instance={release.name}"
    out = release.kubectl("get", RELEASE_KINDS, "-l", selector, "-o", "name")
    return sorted(out.split())


def test_helm_upgrade_then_uninstall_leave_no_orphans(release: Release) -> None:
    assert release_objects(release), "the install created nothing labelled with the release"
    # More routers need the shared ledger: the upgrade is refused, the release left as it was
    # (three replicas on PostgreSQL: test_shared_ledger.py).
    with pytest.raises(HarnessError, match=r"router\.replicas: 2 needs router\.ledger\.postgres"):
        release.cluster.install_chart(release.namespace, release.name, "--set", "router.replicas=2")
    assert release.get("deployment", f"{release.name}-router")["spec"]["replicas"] == 1
    release.install(
        "--set", "router.logLevel=debug", "--set", "router.podDisruptionBudget.enabled=true"
    )  # fmt: skip
    router = release.get("deployment", f"{release.name}-router")  # helm waited for it
    args = router["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--log-level") + 1] == "debug"
    assert release.exists("poddisruptionbudget", f"{release.name}-router")
    release.cluster.helm("uninstall", release.name, "-n", release.namespace, "--wait")
    release.wait(lambda: not release_objects(release), "no object of the release left", 60)
    selector = f"app.kubernetes.io/instance={release.name}"
    release.wait(
        lambda: not release.kubectl("get", "pods", "-l", selector, "-o", "name").strip(),
        "the release's pods gone",
        60,
    )


def test_two_operator_replicas_peer_and_one_reconciles(release: Release) -> None:
    release.install("--set", "operator.replicas=2")
    operator = f"{release.name}-operator"
    release.wait(
        lambda: release.get("deployment", operator)["status"].get("readyReplicas") == 2,
        "two operator replicas Ready",
    )

    def peers() -> dict[str, Any]:
        status: dict[str, Any] = release.get("kopfpeering", "tiergate").get("status") or {}
        return status

    # Both replicas announce themselves in the chart's peering object...
    release.wait(lambda: len(peers()) == 2, "both operator replicas in KopfPeering tiergate")
    priorities = [p.get("priority") for p in peers().values()]
    assert len(set(priorities)) == 2, f"two peers with one priority: {peers()}"
    # ...and the pools are still reconciled (by the one with the higher priority).
    release.kubectl("apply", "-f", str(EXAMPLES / "wafer-scale.yaml"))
    release.wait(
        lambda: (release.condition("spark-wafer", "Ready") or {}).get("status") == "True",
        "spark-wafer Ready with two operator replicas",
    )
