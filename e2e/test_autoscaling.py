"""Pools that follow their load: `spec.autoscaling` through a load step driven through the
router, an operator killed mid-way, and the inputs the autoscaler must refuse or report."""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from cluster import LocalCluster
from load_step import StepLoad, Timeline, attainment
from release import Release, installed, namespace_for, settle
from test_pool_refusals import event_reasons, warning_reasons
from test_pools import EXAMPLES

from tiergate.bench.stats import SloTargets
from tiergate.operator.autoscale import ROUTER_QUEUES_UNKNOWN
from tiergate.operator.autoscaling import REASONS
from tiergate.pools.autoscaling import MIN_ABOVE_MAX

POOL = "chat-autoscaled"
EXAMPLE = EXAMPLES / "autoscaling" / f"{POOL}.yaml"
MODEL = "llama-3.1-8b"
#: The autoscaler's tick here (operator.autoscaleIntervalSeconds; the chart's default is 15 s):
#: the same decisions, sooner.
INTERVAL_S = 5
WINDOW_S = 20  # the example's scale-down window, shortened to keep the test short (4 ticks)
#: How long to wait for what a tick or two should bring, on a machine busy with other tests.
TICKS_WITHIN_S = 60
#: 16 clients on a pool whose replica carries 4 * 0.8 requests at its SLO: 4 replicas (its
#: maximum), the 16 batch slots of 4 replicas full and none waiting. One replica's batch of 4
#: leaves 12 waiting at the router, which the autoscaler reads too: one tick goes from 1 to 4.
#: A tick that reads the pods and the router while replies are on their way back to their
#: clients counts those requests nowhere (docs/concepts/autoscaling.md, Limits): it still
#: decides 4 while it sees 10 or more, so the load stays off the edge between 3 and 4 (with 12
#: clients a tick that missed 3 decided 3, and a window of such ticks let the pool step down
#: to 3 under load).
BENCH = [
    "--mix", "batched=1", "--model", MODEL, "--concurrency", "16", "--input-tokens", "512",
    "--max-tokens", "50-100", "--tools-fraction", "0",
]  # fmt: skip
SLO = SloTargets(ttft_ms=500)  # the example's spec.slo


def pool_yaml(**autoscaling: Any) -> str:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["autoscaling"].update(autoscaling)
    return yaml.safe_dump(doc)


def served(release: Release) -> bool:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    reply = httpx.post(f"{release.router_url()}/v1/chat/completions", json=body, timeout=30.0)
    return reply.status_code == 200


def autoscaling(release: Release, pool: str) -> dict[str, Any]:
    status = release.get("inferencepool.tiergate.dev", pool).get("status") or {}
    return dict(status.get("autoscaling") or {})


def scaled_up(release: Release, pool: str) -> list[str]:
    """The messages of the pool's ScaledUp events, oldest first."""
    out = release.kubectl(
        "get", "events", "--field-selector",
        f"involvedObject.kind=InferencePool,involvedObject.name={pool},reason=ScaledUp",
        "--sort-by=.metadata.creationTimestamp",
        "-o", "jsonpath={range .items[*]}{.message}{\"\\n\"}{end}",
    )  # fmt: skip
    return [line for line in out.splitlines() if line]


def last_tick(release: Release) -> str | None:
    """When the autoscaler's last tick decided (whole seconds): each tick keeps its own
    recommendation, the newest last."""
    kept = autoscaling(release, POOL).get("recommendations") or []
    return str(kept[-1]["time"]) if kept else None


def recommended_at(release: Release, replicas: int) -> set[float]:
    """When (Unix time) the autoscaler's kept recommendations asked for `replicas` or more."""
    kept = autoscaling(release, POOL).get("recommendations") or []
    return {
        datetime.datetime.fromisoformat(r["time"]).timestamp()
        for r in kept
        if r["replicas"] >= replicas
    }


def operator_pods(release: Release) -> set[str]:
    out = release.kubectl(
        "get", "pods", "-l", "app.kubernetes.io/component=operator", "-o", "name"
    )  # fmt: skip
    return set(out.split())


@pytest.fixture
def release(cluster: LocalCluster, request: pytest.FixtureRequest) -> Iterator[Release]:
    """The chart with the autoscaler ticking every `INTERVAL_S`, in a fresh namespace."""
    interval = f"operator.autoscaleIntervalSeconds={INTERVAL_S}"
    with installed(cluster, namespace_for(request.node.name), "--set", interval) as r:
        yield r


@pytest.fixture
def quiet_machine() -> None:
    """The load step measures SLO attainment: earlier tests' namespaces are emptied first (and
    `serial` keeps the other tests out while it runs)."""
    settle()


@pytest.mark.serial
def test_a_load_step_scales_the_pool_up_holds_through_an_operator_restart_and_back_down(
    quiet_machine: None, release: Release, tmp_path: Path
) -> None:
    release.kubectl("apply", "-f", "-", input=pool_yaml(scaleDownStabilizationS=WINDOW_S))
    release.wait(lambda: served(release), f"the router to serve {MODEL}", 120)
    # The autoscaler has read the idle pool once: the timer runs before the step.
    release.wait(
        lambda: (release.condition(POOL, "Autoscaling") or {}).get("reason") == "Holding",
        f"{POOL} Autoscaling=True Holding",
        TICKS_WITHIN_S,
    )
    assert release.get("inferencepool.tiergate.dev", POOL)["spec"]["replicas"] == 1
    # The step starts just after a tick, so the next one, an interval later, sees the step whole
    # (a tick in the second the clients take to connect would see part of it, and rightly
    # decide less).
    seen = last_tick(release)
    release.wait(lambda: last_tick(release) != seen, "the autoscaler's next tick", TICKS_WITHIN_S)

    with Timeline(release.cluster.kubeconfig, release.namespace, POOL) as timeline:
        load = StepLoad(release.router_url(), BENCH, tmp_path)
        load.start()
        try:
            # Up: the requests reach the pods and the router's queue within a second or two;
            # the next tick sees them all and goes straight to the 4 replicas they need.
            release.wait(lambda: timeline.first(lambda s: s.replicas > 1) is not None,
                         "a scale-up", TICKS_WITHIN_S)  # fmt: skip
            first_up = timeline.first(lambda s: s.replicas > 1)
            assert first_up is not None
            assert first_up.at - load.started_at <= 2 * INTERVAL_S + 5, (
                f"first scale-up {first_up.at - load.started_at:.1f} s after the step"
            )
            up = scaled_up(release, POOL)  # 1 -> 4: ... (4 running, ..., 12 queued at 1 router)
            assert first_up.replicas == 4, f"the first scale-up was to {first_up.replicas}: {up}"
            assert up and up[0].startswith("1 -> 4 replicas") and "queued at 1 router" in up[0], up
            release.wait(lambda: release.ready_replicas(POOL) == 4, "4 ready replicas", 180)
            at_four = time.time()

            # The operator killed while the load holds: the new one decides the same.
            old = operator_pods(release)
            release.kubectl("delete", "pod", *(p.removeprefix("pod/") for p in old))
            release.wait(lambda: bool(operator_pods(release) - old), "a new operator pod", 60)
            release.wait(
                lambda: release.get("deployment", f"{release.name}-operator")["status"].get(
                    "readyReplicas") == 1,
                "the new operator ready", 60,
            )  # fmt: skip
            time.sleep(2 * INTERVAL_S + 2)  # two of the new operator's ticks
            since = {s.replicas for s in timeline.samples if s.at >= at_four}
            assert since == {4}, f"replicas moved under a steady load: {timeline.samples}"
            assert autoscaling(release, POOL).get("observedPods") == 4
        finally:
            # From the moment the clients are told to stop: their exit can take seconds more.
            stopped = time.time()
            status = load.stop()
        assert status == 130, load.output  # stopped as Ctrl-C stops it, not failed

        # Down: to minReplicas once the window has seen the load gone, not before. The window
        # runs from the last decision that needed 4 (a tick before the stop, and ticks come
        # every interval plus the tick's own time), read from the recommendations it keeps.
        needed_four: set[float] = set()

        def scaled_down() -> bool:
            needed_four.update(recommended_at(release, 4))
            return timeline.first(lambda s: s.replicas == 1, after=stopped) is not None

        release.wait(scaled_down, "the scale-down to minReplicas", WINDOW_S + TICKS_WITHIN_S)
    down = timeline.first(lambda s: s.replicas < 4, after=stopped)
    assert down is not None and needed_four, (down, needed_four)
    assert down.at - max(needed_four) >= WINDOW_S - 1, (  # the times are whole seconds
        f"scaled down {down.at - max(needed_four):.1f} s after the last decision that needed "
        f"4 replicas, inside the {WINDOW_S} s window"
    )
    # One way up, one way down: no flapping, never beyond [1, 4].
    changes = timeline.replica_changes()
    peak = changes.index(max(changes))
    assert changes[: peak + 1] == sorted(changes[: peak + 1]), changes
    assert changes[peak:] == sorted(changes[peak:], reverse=True), changes
    assert (max(changes), changes[0], changes[-1]) == (4, 1, 1), changes

    # SLO attainment: requests sent on one replica against those sent on four.
    before = load.requests(load.started_at, first_up.at)
    after = load.requests(at_four, stopped)
    assert attainment(before, SLO) < 0.7, f"the step did not overload one replica: {before}"
    assert attainment(after, SLO) >= 0.9, [r for r in after if not SLO.met_by(r)]
    assert all(r.ok for r in after), [r for r in after if not r.ok]

    # What the operator said: status, condition and events.
    status = autoscaling(release, POOL)
    assert (status["desiredReplicas"], status["lastScaleReason"]) == (1, "ScaledDown"), status
    assert status["shapeSource"] == "observed" and status["observedOutputTokens"] <= 100, status
    condition = release.condition(POOL, "Autoscaling") or {}
    assert condition.get("status") == "True", condition
    reasons = event_reasons(release, POOL, "Normal")
    assert "ScaledUp" in reasons and "ScaledDown" in reasons, reasons
    # Nothing kept the autoscaler from acting: none of its Warnings (HpaConflict, ...).
    ours = {*REASONS, ROUTER_QUEUES_UNKNOWN}
    assert not set(warning_reasons(release, POOL)) & ours, warning_reasons(release, POOL)


UNREACHABLE = """
apiVersion: tiergate.dev/v1alpha1
kind: InferencePool
metadata: {name: too-strict}
spec:
  tier: batched
  model: llama-3.1-8b
  accelerator: h100-sxm
  chips: 1
  replicas: 2
  slo: {tpotMs: 1}
  autoscaling: {minReplicas: 1, maxReplicas: 4}
"""

DOES_NOT_FIT = """
apiVersion: tiergate.dev/v1alpha1
kind: InferencePool
metadata: {name: too-small}
spec:
  tier: batched
  model: frontier
  accelerator: h100-sxm
  chips: 1
  weightDtype: bf16
  autoscaling: {minReplicas: 2, maxReplicas: 4}
"""


def test_autoscaling_refuses_or_reports_what_it_cannot_do_and_scales_nothing(
    release: Release,
) -> None:
    done = release.apply(pool_yaml(minReplicas=5, maxReplicas=2))
    assert done.returncode != 0 and MIN_ABOVE_MAX in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not release.exists("inferencepool.tiergate.dev", POOL)

    release.kubectl("apply", "-f", "-", input=UNREACHABLE)
    release.kubectl("apply", "-f", "-", input=DOES_NOT_FIT)
    for pool, reason in (("too-strict", "SloUnreachable"), ("too-small", "ModelDoesNotFit")):
        release.wait(
            lambda p=pool, r=reason: (release.condition(p, "Autoscaling") or {}).get("reason") == r,
            f"{pool} Autoscaling=False {reason}",
            TICKS_WITHIN_S,
        )
        release.wait(lambda p=pool, r=reason: r in warning_reasons(release, p), f"a {reason} event")
    strict = release.condition("too-strict", "Autoscaling") or {}
    assert strict["status"] == "False" and "TPOT" in strict["message"], strict
    assert "> target 1 ms" in strict["message"], strict
    small = release.condition("too-small", "Autoscaling") or {}
    assert small["status"] == "False" and " GB" in small["message"], small
    time.sleep(2 * INTERVAL_S)  # more ticks: still nothing scaled, one event each
    assert release.get("inferencepool.tiergate.dev", "too-strict")["spec"]["replicas"] == 2
    assert release.get("deployment", "too-strict")["spec"]["replicas"] == 2
    assert release.get("inferencepool.tiergate.dev", "too-small")["spec"]["replicas"] == 1
    assert not release.exists("deployment", "too-small")  # nothing rolled out
    assert warning_reasons(release, "too-strict").count("SloUnreachable") == 1
    assert warning_reasons(release, "too-small").count("ModelDoesNotFit") >= 1
