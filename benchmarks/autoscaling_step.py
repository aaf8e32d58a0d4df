"""Benchmark: the step response of an autoscaled InferencePool, on a local cluster.

The e2e harness's local backend (kube-apiserver, etcd and kwok built by e2e/tools/install.sh;
the pod runner) with the Helm chart installed in one namespace. Each round applies
examples/autoscaling/chat-autoscaled.yaml (llama-3.1-8b on one h100-sxm, batch cap 4,
SLO TTFT 500 ms, 1 to 4 replicas; its scale-down window shortened to 30 s), lets the operator
read it idle, then runs a load step through the router: 12 closed-loop clients
(`tiergate bench`, 512-token prompts, 100-token replies) for `--load-s` seconds, then none, and
watches the pool until it is back at 1 replica. The pool is deleted between rounds.

Per round, from the bench's per-request log and the pool's replicas sampled every second:
- seconds from the step to the first scale-up, and to the replicas the step needs ready
  (`ceil(12 / status.autoscaling.capacityPerReplica)`);
- SLO attainment (the pool's TTFT target, as `tiergate bench --slo-ttft-ms` counts it) of the
  requests sent while 1 replica was ready, and of those sent once the needed replicas were;
- replica-minutes used, over-provisioned (ready beyond what the load needed: the needed
  replicas during the step, minReplicas after) and under-provisioned, from the step to the
  end of the scale-down; beside them, a static pool sized for the peak over the same stretch
  (the needed replicas throughout: what the pool costs without autoscaling);
- seconds from the load's end to the scale-down.

Medians over `--rounds` (default 3), each round's figures listed too.

    .venv/bin/python -P benchmarks/autoscaling_step.py [--rounds 3] [--load-s 120]
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "e2e" / "harness"))

from cluster import LocalCluster, default_state, tools_bin  # noqa: E402
from load_step import Sample, StepLoad, Timeline, attainment  # noqa: E402
from release import Release, installed  # noqa: E402

from tiergate.bench.stats import SloTargets  # noqa: E402
from tiergate.operator.commands.operator_cmd import (  # noqa: E402
    DEFAULT_AUTOSCALE_INTERVAL_S as AUTOSCALE_INTERVAL_S,
)

EXAMPLE = REPO / "examples" / "autoscaling" / "chat-autoscaled.yaml"
POOL = "chat-autoscaled"
MODEL = "llama-3.1-8b"
CLIENTS = 12
WINDOW_S = 30
BENCH = [
    "--mix", "batched=1", "--model", MODEL, "--concurrency", str(CLIENTS),
    "--input-tokens", "512", "--max-tokens", "100", "--tools-fraction", "0",
]  # fmt: skip


@dataclass(frozen=True)
class Round:
    needed: int
    first_up_s: float
    needed_ready_s: float
    attainment_one: float
    attainment_needed: float
    replica_min: float
    over_min: float
    under_min: float
    static_min: float
    down_s: float


def pool_yaml() -> str:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["autoscaling"]["scaleDownStabilizationS"] = WINDOW_S
    return yaml.safe_dump(doc)


def _until(check: Any, what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception:  # noqa: BLE001 - not there yet
            pass
        time.sleep(0.5)
    raise RuntimeError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def _served(r: Release) -> bool:
    import httpx

    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    return httpx.post(f"{r.router_url()}/v1/chat/completions", json=body, timeout=30).status_code \
        == 200  # fmt: skip


def _replica_minutes(samples: list[Sample], start: float, end: float, need: Any) -> tuple[
    float, float, float
]:  # fmt: skip
    """(used, over, under) replica-minutes of ready replicas over [start, end], the needed
    replicas at each moment given by `need(t)`."""
    used = over = under = 0.0
    inside = [s for s in samples if start <= s.at <= end]
    for a, b in zip(inside, inside[1:], strict=False):
        dt = (b.at - a.at) / 60
        used += a.ready * dt
        over += max(0, a.ready - need(a.at)) * dt
        under += max(0, need(a.at) - a.ready) * dt
    return used, over, under


def one_round(r: Release, workdir: Path, load_s: float, slo: SloTargets) -> Round:
    r.kubectl("apply", "-f", "-", input=pool_yaml())
    _until(lambda: _served(r), f"the router to serve {MODEL}", 120)
    _until(lambda: (r.condition(POOL, "Autoscaling") or {}).get("reason") == "Holding",
           "the autoscaler's first tick", 3 * AUTOSCALE_INTERVAL_S)  # fmt: skip
    with Timeline(r.cluster.kubeconfig, r.namespace, POOL) as timeline:
        load = StepLoad(r.router_url(), BENCH, workdir)
        load.start()
        try:
            _until(
                lambda: (
                    (r.get("inferencepool", POOL).get("status") or {})
                    .get("autoscaling", {})
                    .get("shapeSource")
                    == "observed"
                ),
                "an observed shape",
                120,
            )
            time.sleep(max(0.0, load.started_at + load_s - time.time()))
        finally:
            load.stop()
        stopped = time.time()
        capacity = float(
            r.get("inferencepool", POOL)["status"]["autoscaling"]["capacityPerReplica"]
        )
        _until(lambda: timeline.first(lambda s: s.ready == 1 and s.replicas == 1, after=stopped)
               is not None, "the scale-down", WINDOW_S + 6 * AUTOSCALE_INTERVAL_S + 60)  # fmt: skip
        back = timeline.first(lambda s: s.ready == 1 and s.replicas == 1, after=stopped)
    assert back is not None
    needed = min(4, math.ceil(CLIENTS / capacity - 1e-9))
    start = load.started_at
    first_up = timeline.first(lambda s: s.replicas > 1, after=start)
    ready = timeline.first(lambda s: s.ready >= needed, after=start)
    down = timeline.first(lambda s: s.replicas < needed, after=stopped)
    assert first_up is not None and ready is not None and down is not None, timeline.samples
    one = load.requests(start, first_up.at)
    at_needed = load.requests(ready.at, stopped)

    def need(t: float) -> int:
        return needed if start <= t < stopped else 1

    used, over, under = _replica_minutes(timeline.samples, start, back.at, need)
    r.kubectl("delete", "inferencepool", POOL, "--wait=true")
    _until(lambda: not r.pool_pods(POOL), "the pool's pods gone", 120)
    return Round(
        needed=needed,
        first_up_s=first_up.at - start,
        needed_ready_s=ready.at - start,
        attainment_one=attainment(one, slo),
        attainment_needed=attainment(at_needed, slo),
        replica_min=used,
        over_min=over,
        under_min=under,
        static_min=needed * (back.at - start) / 60,
        down_s=down.at - stopped,
    )


def render(rounds: list[Round]) -> list[str]:
    rows = [
        ("step -> first scale-up, s", "first_up_s", ".0f"),
        ("step -> needed replicas ready, s", "needed_ready_s", ".0f"),
        ("SLO attainment, sent on 1 replica", "attainment_one", ".1%"),
        ("SLO attainment, sent on the needed replicas", "attainment_needed", ".1%"),
        ("replica-minutes used (step to scale-down)", "replica_min", ".1f"),
        ("  over-provisioned replica-minutes", "over_min", ".1f"),
        ("  under-provisioned replica-minutes", "under_min", ".1f"),
        ("static pool at the needed replicas, replica-minutes", "static_min", ".1f"),
        ("load end -> scale-down, s", "down_s", ".0f"),
    ]
    head = "| figure | median | " + " | ".join(f"round {i + 1}" for i in range(len(rounds))) + " |"
    lines = [head, "|---|---|" + "---|" * len(rounds)]
    for label, name, spec in rows:
        values = [getattr(x, name) for x in rounds]
        cells = " | ".join(format(v, spec) for v in values)
        lines.append(f"| {label} | {format(statistics.median(values), spec)} | {cells} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--load-s", type=float, default=120.0, help="how long the step lasts")
    args = p.parse_args(argv)
    command = "python -P " + shlex.join(
        [os.path.relpath(__file__), *(sys.argv[1:] if argv is None else argv)]
    )
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    slo = SloTargets(ttft_ms=float(yaml.safe_load(EXAMPLE.read_text())["spec"]["slo"]["ttftMs"]))
    bin_dir = tools_bin()
    assert bin_dir is not None
    name = f"tg-bench-{os.getpid()}"
    cluster = LocalCluster(name, default_state(name), bin_dir)
    started = time.monotonic()
    rounds: list[Round] = []
    try:
        cluster.create()
        cluster.start_runner(REPO / ".venv" / "bin" / "tiergate")
        with installed(cluster, "autoscaling-step") as release:
            for i in range(args.rounds):
                with tempfile.TemporaryDirectory(prefix="tiergate-step-") as workdir:
                    rounds.append(one_round(release, Path(workdir), args.load_s, slo))
                print(f"round {i + 1}: {rounds[-1]}", file=sys.stderr)
    finally:
        cluster.delete()
    needed = rounds[0].needed
    print("\n".join([
        "## Autoscaling step response",
        "",
        f"Command: `{command}` at commit {commit or '?'} ({time.monotonic() - started:.0f} s). "
        f"Machine: {os.cpu_count()} cores; everything on it, cluster and clients included. "
        f"A step of {CLIENTS} clients for {args.load_s:.0f} s on {POOL} (1 to 4 replicas; "
        f"the step needs {needed}); autoscaler tick {AUTOSCALE_INTERVAL_S} s, scale-down "
        f"window {WINDOW_S} s; SLO TTFT <= {slo.ttft_ms:g} ms.",
        "",
        *render(rounds),
    ]))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
