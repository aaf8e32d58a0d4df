"""A client that leaves before its reply starts: its place in the queue and the node's work
go with it (router/upstream/disconnect.py). One node that runs one sequence at a time."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack
from typing import Any

import httpx
import pytest
from polling_helpers import until

from tiergate.router.build import build_app
from tiergate.router.config import parse_config
from tiergate.router.discovery.view import StaticSource, build_view
from tiergate.sim_nodes.catalogs import default_catalog
from tiergate.sim_nodes.perf import BatchingSpec, ServingSpec
from tiergate.sim_nodes.server import NodeConfig, create_app

Served = Callable[[Any], AbstractContextManager[str]]
#: ~35 s of decoding on this node: long enough that only a cancel ends it within the test.
LONG = 5000


@pytest.fixture
def system(tmp_path: Any, served: Served) -> Iterator[dict[str, Any]]:
    node = NodeConfig(
        serving=ServingSpec(
            model="llama-3.1-8b", accelerator="h100-sxm", batching=BatchingSpec(max_num_seqs=1)
        ),
        served_model_names=["m"],
    )
    with ExitStack() as stack:
        node_url = stack.enter_context(served(create_app(node)))
        config = parse_config(
            f"router: {{ledgerPath: {tmp_path / 'ledger.sqlite'}}}\npools:\n"
            f"  - {{name: one, tier: batched, model: llama-3.1-8b, accelerator: h100-sxm, "
            f"servedModelName: m, batching: {{maxNumSeqs: 1}}, endpoints: [{node_url}]}}\n"
        )
        app = build_app(config, StaticSource(build_view(config.pools, default_catalog())))
        url = stack.enter_context(served(app))
        yield {"url": url, "node": node_url, "app": app, "ledger": tmp_path / "ledger.sqlite"}


def chat(max_tokens: int, **fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": max_tokens, **fields}  # fmt: skip


def give_up_after(url: str, body: dict[str, Any], timeout_s: float) -> None:
    """A client that stops waiting: httpx closes its connection on the timeout."""
    with pytest.raises(httpx.TimeoutException):
        httpx.post(url + "/v1/chat/completions", json=body, timeout=timeout_s)


def running(node_url: str) -> float:
    text = httpx.get(node_url + "/metrics").text
    return float(
        next(x for x in text.splitlines() if x.startswith("vllm:num_requests_running")).split()[-1]
    )  # noqa: E501


def outcomes(ledger: Any) -> list[tuple[str, int]]:
    with sqlite3.connect(ledger) as db:
        return list(db.execute("select outcome, http_status from usage order by id"))


def test_a_client_that_leaves_a_whole_reply_cancels_the_node_s_work(
    system: dict[str, Any],
) -> None:
    give_up_after(system["url"], chat(LONG), timeout_s=1.0)
    until(lambda: running(system["node"]) == 0, "the node kept decoding for a client that left")
    until(lambda: outcomes(system["ledger"]) == [("client_disconnect", 499)], "no ledger row")
    # The node is free again: the next request is served now, not after ~35 s.
    r = httpx.post(system["url"] + "/v1/chat/completions", json=chat(2), timeout=30)
    assert r.status_code == 200


def test_a_client_that_leaves_the_queue_gives_up_its_place(system: dict[str, Any]) -> None:
    first_chunk = threading.Event()
    release = threading.Event()

    def hold_the_slot() -> None:
        body = chat(LONG, stream=True)
        with httpx.stream("POST", system["url"] + "/v1/chat/completions", json=body) as r:
            lines = r.iter_lines()  # kept: dropping it would close the stream
            next(lines)
            first_chunk.set()
            release.wait(30)

    holder = threading.Thread(target=hold_the_slot)
    holder.start()
    try:
        assert first_chunk.wait(30)
        queue = system["app"].router.admission.queues["batched"]
        assert queue.capacity == 1 and queue.active == 1
        give_up_after(system["url"], chat(2), timeout_s=0.5)  # waits behind the stream
        until(lambda: queue.waiting == 0, "the request that left still waits in the queue")
        until(
            lambda: ("client_disconnect", 499) in outcomes(system["ledger"]),
            "the request that left was not recorded",
        )
        assert queue.active == 1  # still only the stream
    finally:
        release.set()
        holder.join(30)
    until(lambda: queue.active == 0, "the stream's slot was not released")
    # The slot is released just before the row is written: wait for the row too.
    until(
        lambda: outcomes(system["ledger"]).count(("client_disconnect", 499)) == 2,
        "the stream whose client left was not recorded",
    )
    assert outcomes(system["ledger"]) == [("client_disconnect", 499)] * 2
