"""The autoscaler reading real router processes: two `tiergate router`s in front of one real
sim node, one of them queueing a load step, scraped on their metrics ports as the operator
scrapes router pods. One tick goes to the replicas the whole step needs; a router that stops
answering leaves the pool where it is, with one Warning that says so."""

from __future__ import annotations

import datetime
import threading
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from operator_helpers import CATALOG, FakeCluster
from polling_helpers import until
from process_helpers import Running, start_router, start_sim_node

from tiergate.operator.autoscale import ROUTER_QUEUES_UNKNOWN, MetricsScraper, Routers, autoscale
from tiergate.operator.autoscaling import parse_router_waiting
from tiergate.operator.kube import PodAddress
from tiergate.pools import AutoscalingStatus

#: Real processes and servers, or seconds of work: left out of `make test-fast`.
pytestmark = pytest.mark.slow

NS, POOL, MODEL = "team-a", "chat", "llama-3.1-8b"
ROUTERS_NS = "tiergate-system"
NOW = datetime.datetime(2026, 11, 21, tzinfo=datetime.UTC)
ROUTER_CONFIG = """\
router:
  ledgerPath: {ledger}
pools:
  - {{name: {pool}, tier: batched, model: {model}, accelerator: h100-sxm,
      batching: {{maxNumSeqs: 2}}, endpoints: [{node}]}}
"""
#: Clients of the step, all through the first router: 2 run (the batch cap), 4 wait there.
CLIENTS = 6
#: Long enough that the step holds while the test ticks (each stream takes seconds).
MAX_TOKENS = 4000


def pool_body() -> dict[str, object]:
    spec = {
        "tier": "batched", "model": MODEL, "accelerator": "h100-sxm", "chips": 1,
        "batching": {"maxNumSeqs": 2}, "replicas": 1,
        "autoscaling": {"minReplicas": 1, "maxReplicas": 8, "scaleDownStabilizationS": 30},
    }  # fmt: skip
    return {"metadata": {"namespace": NS, "name": POOL, "generation": 1}, "spec": spec}


def address(running: Running, url: str) -> tuple[PodAddress, MetricsScraper]:
    """The process as a pod (its loopback address) and a scraper of its port."""
    parts = urlsplit(url)
    pod = PodAddress(f"pod-{parts.port}", parts.hostname, True)
    return pod, MetricsScraper(port=parts.port or 0)


def send(router: str, errors: list[BaseException]) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "go"}],
            "max_tokens": MAX_TOKENS}  # fmt: skip
    try:
        httpx.post(f"{router}/v1/chat/completions", json=body, timeout=120.0)
    except httpx.HTTPError as exc:  # the router stopped under it at the end: expected
        errors.append(exc)


def test_one_tick_reaches_what_the_step_needs_and_an_unanswering_router_holds_the_pool(
    tmp_path: Path,
) -> None:
    node = start_sim_node(tmp_path / "node.log", "--model", MODEL, "--accelerator", "h100-sxm",
                          "--max-num-seqs", "2")  # fmt: skip
    routers: list[Running] = []
    scrapers: list[MetricsScraper] = []
    try:
        for i in range(2):
            config = tmp_path / f"router-{i}.yaml"
            config.write_text(ROUTER_CONFIG.format(
                ledger=tmp_path / f"ledger-{i}.sqlite", pool=POOL, model=MODEL, node=node.url
            ))  # fmt: skip
            routers.append(start_router(config, tmp_path / f"router-{i}.log"))
        busy, idle = routers
        pods = {}
        for running in routers:
            pod, scraper = address(running, running.metrics_url)
            pods[pod.name] = (pod, scraper)
            scrapers.append(scraper)
        node_pod, node_scraper = address(node, node.url)
        scrapers.append(node_scraper)
        cluster = FakeCluster()
        cluster.pods[(NS, POOL)] = [node_pod]
        cluster.routers = [pod for pod, _ in pods.values()]
        config = Routers(ROUTERS_NS, "app=router", NS, lambda pod: pods[pod.name][1](pod))

        errors: list[BaseException] = []
        for _ in range(CLIENTS):
            threading.Thread(target=send, args=(busy.url, errors), daemon=True).start()

        def the_step_in_place() -> bool:
            """4 wait at the router and 2 run at the node. The second admitted may still be on
            its way, or waiting at the node for its next step, after the router's count is
            right: the tick reads both."""
            text = httpx.get(busy.metrics_url, timeout=5).text
            if parse_router_waiting(text).get(POOL) != CLIENTS - 2:
                return False
            node_text = httpx.get(node.url + "/metrics", timeout=5).text
            return any(
                line.startswith("vllm:num_requests_running") and float(line.split()[-1]) == 2
                for line in node_text.splitlines()
            )

        until(the_step_in_place, f"{CLIENTS - 2} requests waiting at the router, 2 running", 30)
        # One replica carries 2 * 0.8: 2 running at the node + 4 queued = 6 -> 4 replicas.
        body = pool_body()
        tick = autoscale(body, cluster, CATALOG, node_scraper, NOW, config)
        assert tick is not None
        assert (tick.replicas, tick.decision.reason) == (4, "ScaledUp"), tick.decision.message
        status = AutoscalingStatus.model_validate(tick.status["autoscaling"])
        assert (status.observed_running, status.observed_queued) == (2, 4)
        assert (status.observed_routers, status.queues_unknown) == (2, None)
        assert "2 running, 0 waiting on 1 pods, 4 queued at 2 routers" in tick.decision.message

        # The idle router stops answering; long after the window, with the step still there
        # and the pool at 4, nothing is scaled down on a demand that is only partly known.
        idle.stop()
        body["spec"]["replicas"] = 4  # type: ignore[index]
        body["status"] = tick.status
        later = NOW + datetime.timedelta(seconds=120)
        held = autoscale(body, cluster, CATALOG, node_scraper, later, config)
        assert held is not None and held.replicas is None, held and held.decision.message
        assert held.decision.desired == 4
        unknown = held.status["autoscaling"]["queuesUnknown"]
        assert unknown == "1 of 2 routers did not report their queue"
        assert [(kind, reason) for kind, reason, _ in held.events] == [
            ("Warning", ROUTER_QUEUES_UNKNOWN)
        ]
        # Said once: the next tick that still cannot read it posts nothing more.
        body["status"] = held.status
        again = autoscale(body, cluster, CATALOG, node_scraper, later, config)
        assert again is not None and again.events == []
    finally:
        for scraper in scrapers:
            scraper.close()
        for running in routers:
            running.stop()
        node.stop()
