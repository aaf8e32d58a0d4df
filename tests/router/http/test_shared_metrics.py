"""SharedMetrics adds up what worker processes read when scraped: each worker here is a real
process in prometheus_client's multiprocess mode that copies fixed values (and its own garbage
collector's pauses) into one folder; the test reads the folder as a scrape would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.parser import text_string_to_metric_families

#: One worker: copies VALUES (argv[2]) and, with argv[3] == "gc", the pauses of three full
#: collections into the folder argv[1]; prints its own view of its pauses.
WORKER = """
import gc, json, sys
from pathlib import Path
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from tiergate.router.http.gc_pauses import GcPauses
from tiergate.router.http.shared_metrics import SharedMetrics

class Fixed:
    def __init__(self, values):
        self.values = values

    def collect(self):
        v = self.values
        yield GaugeMetricFamily("tiergate_connections_open", "Open.", value=v["open"])
        depth = GaugeMetricFamily("tiergate_queue_depth", "Waiting.", labels=["tier"])
        depth.add_metric(["batched"], v["depth"])
        yield depth
        yield GaugeMetricFamily("tiergate_not_listed", "No mode of its own.", value=v["open"])
        refused = CounterMetricFamily("tiergate_refused", "Refused.", labels=["why"])
        refused.add_metric(["cap"], v["refused"])
        yield refused

pauses = GcPauses()
shared = SharedMetrics(Path(sys.argv[1]), [Fixed(json.loads(sys.argv[2]))], pauses)
if sys.argv[3] == "gc":
    pauses.install()
    for _ in range(3):
        gc.collect()
    pauses.uninstall()
shared.sync()
shared.sync()  # a second copy adds nothing new
own = next(iter(pauses.collect()))
print(json.dumps([[s.name, s.labels, s.value] for s in own.samples]))
"""


def worker(folder: Path, values: dict[str, float], gc: bool = False) -> tuple[int, Any]:
    """Run one worker to its end; its pid and its own view of its pauses."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(folder)}
    process = subprocess.Popen(
        [sys.executable, "-P", "-c", WORKER, str(folder), json.dumps(values), "gc" if gc else ""],
        stdout=subprocess.PIPE,
        env=env,
    )
    out, _ = process.communicate(timeout=120)
    assert process.returncode == 0
    return process.pid, json.loads(out)


def scrape(folder: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample the folder holds, added up as a worker's /metrics would."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, str(folder))
    text = generate_latest(registry).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_gauges_combine_by_their_mode_and_counters_add_up(tmp_path: Path) -> None:
    first, _ = worker(tmp_path, {"open": 3, "depth": 5, "refused": 2})
    second, _ = worker(tmp_path, {"open": 4, "depth": 7, "refused": 1})
    samples = scrape(tmp_path)
    assert samples["tiergate_connections_open", ()] == 7  # livesum
    assert samples["tiergate_queue_depth", (("tier", "batched"),)] == 7  # livemax
    assert samples["tiergate_not_listed", (("pid", str(first)),)] == 3  # liveall: by pid
    assert samples["tiergate_not_listed", (("pid", str(second)),)] == 4
    assert samples["tiergate_refused_total", (("why", "cap"),)] == 3
    assert samples["tiergate_workers", ()] == 2
    assert samples["tiergate_worker_restarts_total", ()] == 0

    mark_process_dead(first, str(tmp_path))  # as the supervisor does when a worker exits
    samples = scrape(tmp_path)
    assert samples["tiergate_connections_open", ()] == 4
    assert samples["tiergate_workers", ()] == 1
    assert samples["tiergate_refused_total", (("why", "cap"),)] == 3  # counted still


def test_gc_pauses_add_up_to_each_workers_own_histogram(tmp_path: Path) -> None:
    zero = {"open": 0, "depth": 0, "refused": 0}
    _, own = worker(tmp_path, zero, gc=True)
    _, idle = worker(tmp_path, zero)
    samples = scrape(tmp_path)
    for name, labels, value in own:
        shared = samples[name, tuple(sorted(labels.items()))]
        if name.endswith("_sum"):
            assert abs(shared - value) <= 1e-9 * max(1.0, value)
        else:
            assert shared == value, (name, labels)
    assert samples["tiergate_gc_pause_seconds_count", (("generation", "2"),)] >= 3
    assert all(value == 0 for name, _, value in idle if not name.endswith("_created"))
