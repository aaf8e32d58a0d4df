"""A load step on an autoscaled pool, as the autoscaling e2e test and the step-response
benchmark drive it: one `tiergate bench` run through the router while a recorder samples the
pool's replicas once a second.

`StepLoad` logs every request with the time it was sent, so SLO attainment can be counted over
any stretch (one replica, four) of one continuous load. `Timeline` keeps (time, spec.replicas,
readyReplicas) samples read from the API server with the official client.
"""

from __future__ import annotations

import json
import math
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster import REPO
from kubernetes import client, config

from tiergate.bench.results import RequestResult
from tiergate.bench.stats import SloTargets

TIERGATE = REPO / ".venv" / "bin" / "tiergate"
GROUP, VERSION, PLURAL = "tiergate.dev", "v1alpha1", "inferencepools"


@dataclass(frozen=True, slots=True)
class Sample:
    at: float  # Unix time, as the bench logs when each request was sent
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
                    time.time(),
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


class StepLoad:
    """One `tiergate bench` run through the router for as long as the step lasts (stopped
    with SIGINT, as Ctrl-C), each request logged as it finishes (--requests-jsonl)."""

    def __init__(self, router: str, bench_args: list[str], workdir: Path) -> None:
        self.log = workdir / "requests.jsonl"
        self.report = workdir / "bench.json"
        self.argv = [
            str(TIERGATE),
            "bench",
            "--router",
            router,
            "--duration",
            "3600",
            "--requests-jsonl",
            str(self.log),
            "--json",
            str(self.report),
            *bench_args,
        ]
        self.process: subprocess.Popen[str] | None = None
        self.started_at = 0.0
        self.output = ""

    def start(self) -> None:
        self.started_at = time.time()
        self.process = subprocess.Popen(
            self.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )

    def stop(self) -> int:
        """Stop sending (requests in flight are abandoned, as Ctrl-C does); the exit status
        (130: interrupted, as expected)."""
        assert self.process is not None
        self.process.send_signal(signal.SIGINT)
        self.output, _ = self.process.communicate(timeout=120)
        return self.process.returncode

    def requests(self, sent_from: float = 0.0, sent_to: float = math.inf) -> list[RequestResult]:
        """The requests sent within [sent_from, sent_to) (Unix time) that finished."""
        found = []
        for line in self.log.read_text().splitlines():
            result = RequestResult(**json.loads(line))
            if result.sent_at is not None and sent_from <= result.sent_at < sent_to:
                found.append(result)
        return found


def attainment(results: list[RequestResult], slo: SloTargets) -> float:
    """Share of `results` within `slo`, as `tiergate bench` counts it (a failure misses)."""
    assert results, "no request in the stretch"
    return sum(map(slo.met_by, results)) / len(results)
