"""A load step on an autoscaled pool, as the autoscaling e2e test and the step-response
benchmark drive it: `tiergate bench` runs back to back through the router while a recorder
samples the pool's replicas once a second.

`BenchLoop` keeps each run's report (SLO attainment, TTFT) with the pool's ready replicas at its
start and end, so attainment before and after scaling can be told apart. `Timeline` keeps
(time, spec.replicas, readyReplicas) samples read from the API server with the official client.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cluster import REPO
from kubernetes import client, config

TIERGATE = REPO / ".venv" / "bin" / "tiergate"
GROUP, VERSION, PLURAL = "tiergate.dev", "v1alpha1", "inferencepools"


@dataclass(frozen=True, slots=True)
class Sample:
    at: float  # time.monotonic()
    replicas: int  # spec.replicas
    ready: int  # status.readyReplicas


class Timeline:
    """spec.replicas and readyReplicas of one pool, sampled every `every_s` until stopped."""

    def __init__(self, kubeconfig: Path, namespace: str, pool: str, every_s: float = 1.0) -> None:
        api_client = config.new_client_from_config(config_file=str(kubeconfig))
        self._api = client.CustomObjectsApi(api_client)
        self.namespace, self.pool, self.every_s = namespace, pool, every_s
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                obj: Any = self._api.get_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, PLURAL, self.pool, _request_timeout=5
                )
            except Exception:  # noqa: BLE001 - a missed sample; the next one counts
                obj = None
            if obj is not None:
                status = obj.get("status") or {}
                self.samples.append(Sample(
                    time.monotonic(),
                    int(obj["spec"].get("replicas") or 0),
                    int(status.get("readyReplicas") or 0),
                ))  # fmt: skip
            self._stop.wait(self.every_s)

    def __enter__(self) -> Timeline:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def first(self, test: Any, after: float = 0.0) -> Sample | None:
        """The first sample taken at or after `after` for which `test(sample)` holds."""
        return next((s for s in self.samples if s.at >= after and test(s)), None)

    def replica_changes(self) -> list[int]:
        """spec.replicas each time it changed, the first sample's included."""
        changes: list[int] = []
        for s in self.samples:
            if not changes or changes[-1] != s.replicas:
                changes.append(s.replicas)
        return changes


@dataclass
class Run:
    """One bench run of the loop and the pool's ready replicas around it."""

    started: float
    ended: float
    ready_at_start: int
    ready_at_end: int
    report: dict[str, Any]

    @property
    def attainment(self) -> float | None:
        value = self.report["total"].get("slo_attainment")
        return None if value is None else float(value)

    @property
    def requests(self) -> int:
        return int(self.report["total"]["requests"])


@dataclass
class BenchLoop:
    """`tiergate bench` runs of `seconds` each, back to back, until `stop()`."""

    router: str
    bench_args: list[str]
    seconds: float
    timeline: Timeline
    workdir: Path
    runs: list[Run] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.started_at: float | None = None

    def _ready(self) -> int:
        return self.timeline.samples[-1].ready if self.timeline.samples else 0

    def _run(self) -> None:
        index = 0
        while not self._stop.is_set():
            out = self.workdir / f"bench-{index}.json"
            started, ready = time.monotonic(), self._ready()
            done = subprocess.run(
                [str(TIERGATE), "bench", "--router", self.router, "--duration", str(self.seconds),
                 "--json", str(out), *self.bench_args],
                capture_output=True, text=True, check=False, timeout=self.seconds + 120,
            )  # fmt: skip
            if done.returncode != 0 or not out.exists():
                self.failures.append(f"bench exited {done.returncode}: {done.stderr[-800:]}")
                time.sleep(1)
            else:
                report = json.loads(out.read_text())
                self.runs.append(Run(started, time.monotonic(), ready, self._ready(), report))
            index += 1

    def start(self) -> None:
        self.started_at = time.monotonic()
        self._thread.start()

    def stop(self) -> None:
        """Stop after the run in progress (its requests finish and are counted)."""
        self._stop.set()
        self._thread.join(self.seconds + 180)
