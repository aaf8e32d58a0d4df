"""Two writers of a pool's status, reconcile and the autoscaler's timer, each own some of its
conditions and each writes the whole list (a merge patch replaces a list whole): a write is
rebased on the conditions as they are when it is made, so neither undoes the other's."""

from __future__ import annotations

import copy
import datetime
from pathlib import Path
from typing import Any

import yaml
from operator_helpers import CATALOG, IMAGE, FakeCluster, clock

from tiergate.operator.autoscale import autoscale
from tiergate.operator.kube import PodAddress
from tiergate.operator.reconcile import reconcile
from tiergate.operator.status import rebase_conditions

EXAMPLE = Path(__file__).parents[2] / "examples" / "autoscaling" / "chat-autoscaled.yaml"
NS = "team-a"
BUSY_POD = (
    "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1\n"
    "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 0\n"
)


def condition(kind: str, status: str, reason: str) -> dict[str, Any]:
    return {"type": kind, "status": status, "reason": reason, "message": reason}


def test_a_condition_a_writer_left_as_it_was_goes_as_it_is_now() -> None:
    base = [condition("Ready", "False", "ReplicasNotReady"), condition("Autoscaling", "True", "A")]
    ours = [condition("Ready", "False", "ReplicasNotReady"), condition("Autoscaling", "True", "B")]
    theirs = [condition("Ready", "True", "Serving"), condition("Autoscaling", "True", "A")]
    assert rebase_conditions(base, ours, theirs) == [
        condition("Ready", "True", "Serving"),  # theirs: we did not change it
        condition("Autoscaling", "True", "B"),  # ours: we did
    ]


def test_a_condition_a_writer_added_or_dropped_goes_so_and_one_added_meanwhile_stays() -> None:
    base = [condition("Ready", "True", "Serving"), condition("Autoscaling", "True", "A")]
    ours = [condition("Ready", "True", "Serving"), condition("Fits", "True", "ModelFits")]
    theirs = [*base, condition("Degraded", "False", "AsExpected")]
    assert rebase_conditions(base, ours, theirs) == [
        condition("Ready", "True", "Serving"),
        condition("Fits", "True", "ModelFits"),  # added by us
        condition("Degraded", "False", "AsExpected"),  # added meanwhile: kept
    ]  # and Autoscaling, which we dropped, is gone


def test_an_autoscaler_tick_from_an_older_read_keeps_what_reconcile_wrote_since() -> None:
    """The timer reads the pool, scrapes its pods (seconds), and writes; meanwhile the pod
    became ready and reconcile wrote Ready=True. The tick's write must not bring back
    Ready=False, nor reconcile's later write drop the tick's Autoscaling condition."""
    pool = next(d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d)
    pool["metadata"].update(namespace=NS, uid="u-1", generation=1)
    name = pool["metadata"]["name"]
    cluster = FakeCluster()
    cluster.pools[(NS, name)] = pool

    def reconciled() -> None:
        stored = copy.deepcopy(cluster.pools[(NS, name)])
        outcome = reconcile(stored, cluster, CATALOG, IMAGE, clock())
        cluster.patch_pool_status(NS, name, outcome.status, base=stored.get("status") or {})

    def said() -> dict[str, str]:
        return {c["type"]: c["reason"] for c in cluster.pools[(NS, name)]["status"]["conditions"]}

    reconciled()  # the pod is not ready yet
    assert said()["Ready"] == "ReplicasNotReady"
    snapshot = copy.deepcopy(cluster.pools[(NS, name)])  # what the timer is handed
    cluster.deployments[(NS, name)] = {"replicas": 1, "readyReplicas": 1, "updatedReplicas": 1}
    cluster.pods[(NS, name)] = [PodAddress("a", "10.0.0.1", True)]
    reconciled()  # deployment_changed: the pod is ready
    assert said()["Ready"] == "Serving"
    now = datetime.datetime.now(datetime.UTC)
    tick = autoscale(snapshot, cluster, CATALOG, lambda pod: BUSY_POD, now)
    assert tick is not None
    cluster.patch_pool_status(NS, name, tick.status, base=snapshot.get("status") or {})
    assert said()["Ready"] == "Serving"
    assert "Autoscaling" in said()
    reconciled()  # a resync: the tick's condition stays
    assert "Autoscaling" in said() and said()["Ready"] == "Serving"
