"""A node SIGKILLed while a stream waits for its first token, against real router and sim-node
processes: the router had the node's reply headers and nothing else, the client nothing at all,
so the stream is given to another endpoint and the client gets one whole stream; when every
node dies so, a 502 envelope.

Each node has one batch slot, filled by a long stream sent to it directly (someone else's
load): a stream sent through the router waits in a node's queue, before its first token, for as
long as the test needs. The node holding it is found by its queue (`/metrics`) and killed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from typing import Any

import httpx
import pytest
from adversarial_helpers import (
    Pool,
    System,
    assert_refused,
    assert_serves,
    chat,
    metric,
    running_system,
)
from polling_helpers import until
from process_helpers import Running


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    pools = [
        Pool("relay", "batched", "relay", replicas=2, max_num_seqs=1),
        Pool("doomed", "batched", "doomed", replicas=2, max_num_seqs=1),
    ]
    tmp = tmp_path_factory.mktemp("killed")
    with running_system(tmp, pools) as running:
        yield running


@contextmanager
def slot_taken(node: Running, model: str) -> Iterator[None]:
    """`node`'s one batch slot taken by a long stream (~50 s of tokens) until the block ends."""
    body = chat(model, max_tokens=100_000, ignore_eos=True, stream=True)
    with httpx.stream("POST", node.url + "/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        lines = r.iter_lines()  # kept: a dropped iterator closes the stream
        assert next(line for line in lines if line.startswith("data: "))
        yield
        # Closing the stream (leaving the block) frees the slot: the node cancels the work.


def waiting(node: Running) -> float:
    try:
        text = httpx.get(node.url + "/metrics", timeout=10).text
    except httpx.HTTPError:
        return -1  # gone
    line = next(x for x in text.splitlines() if x.startswith("vllm:num_requests_waiting"))
    return float(line.split()[-1])


def stream_through_router(system: System, model: str) -> httpx.Response:
    body = chat(model, max_tokens=5, ignore_eos=True, stream=True,
                stream_options={"include_usage": True})  # fmt: skip
    with httpx.Client(timeout=120) as client:
        return client.post(system.url + "/v1/chat/completions", json=body)


def the_one_waiting(nodes: list[Running]) -> Running:
    until(lambda: any(waiting(n) == 1 for n in nodes), "the stream is in no node's queue", 30)
    (holder,) = [n for n in nodes if waiting(n) == 1]
    return holder


def test_a_stream_whose_node_is_killed_before_its_first_token_is_served_by_another(
    system: System,
) -> None:
    nodes = system.nodes["relay"]
    retries = metric(system, "tiergate_upstream_retries_total")
    with ExitStack() as slots, ThreadPoolExecutor(1) as client:
        taken = {n.url: slots.enter_context(ExitStack()) for n in nodes}
        for node in nodes:
            taken[node.url].enter_context(slot_taken(node, "relay"))
        reply: Future[httpx.Response] = client.submit(stream_through_router, system, "relay")
        holder = the_one_waiting(nodes)
        holder.process.kill()
        holder.process.wait(30)
        (other,) = [n for n in nodes if n is not holder]
        taken[other.url].close()  # its slot frees: the stream, given to it, runs there
        r = reply.result(timeout=120)
    assert r.status_code == 200, r.text
    events = [x[6:] for x in r.text.splitlines() if x.startswith("data: ")]
    assert events[-1] == "[DONE]", events
    chunks: list[dict[str, Any]] = [json.loads(e) for e in events[:-1]]
    assert not any("error" in c for c in chunks), chunks
    assert chunks[-1]["usage"]["completion_tokens"] == 5
    assert metric(system, "tiergate_upstream_retries_total") == retries + 1
    assert "event=stream_failed_before_first_token" in system.log()


def test_a_stream_every_node_drops_before_its_first_token_is_a_502_envelope(
    system: System,
) -> None:
    nodes = system.nodes["doomed"]
    with ExitStack() as slots, ThreadPoolExecutor(1) as client:
        for node in nodes:
            slots.enter_context(slot_taken(node, "doomed"))
        reply: Future[httpx.Response] = client.submit(stream_through_router, system, "doomed")
        first = the_one_waiting(nodes)
        first.process.kill()
        (second,) = [n for n in nodes if n is not first]
        until(lambda: waiting(second) == 1, "the stream was not given to the other node", 30)
        second.process.kill()
        r = reply.result(timeout=120)
    error = assert_refused(r, 502, "bad_upstream_reply", system)
    assert "before the first token (2 attempt(s))" in error["message"]
    assert_serves(system, {}, "relay")
