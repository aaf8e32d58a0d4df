"""Requests that make nodes fail, and nodes that fail, against real router and sim-node
processes: input a node cannot handle is the client's 400 and ejects nothing; a node answers
it and keeps its connection; requests every node fails, and nodes that are gone, are 503s that
name no endpoint; every retry is counted; a client's fault header reaches no node that does
not honour it.

Pools: `coder` on two plain nodes and `drill` on two nodes that honour the fault header (the
router forwards the header here), batched; `flaky` on one node and one failing every request,
and `gone` on two addresses nothing listens on, wafer-scale.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from adversarial_helpers import (
    Pool,
    System,
    assert_refused,
    assert_serves,
    chat,
    metric,
    nothing_listens,
    one_reply,
    running_system,
)

#: Real processes and servers, or seconds of work: left out of `make test-fast`.
pytestmark = pytest.mark.slow

FAULTS = ("--enable-fault-injection",)


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    pools = [
        Pool("coder", "batched", "coder", replicas=2),
        Pool("drill", "batched", "drill", replicas=2, node_flags=FAULTS),
        Pool("flaky-ok", "wafer-scale", "flaky"),
        Pool("flaky-bad", "wafer-scale", "flaky", node_flags=("--failure-rate", "1.0")),
        Pool("gone", "wafer-scale", "gone", replicas=0, urls=(nothing_listens(),) * 2),
    ]
    tmp = tmp_path_factory.mktemp("node-failures")
    with running_system(tmp, pools, router="forwardFaultHeader: true") as running:
        yield running


def deep_schema(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


def deep_tools(depth: int) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": "f", "parameters": deep_schema(depth)}}]


#: A tool schema nested 200 deep (~400 levels of JSON): the node's 400 naming the field.
DEEP_TOOLS = deep_tools(200)


def ready_batched(system: System) -> float:
    """The batched tier's endpoints not ejected (all four: coder's and drill's)."""
    return metric(system, 'tiergate_endpoints{state="ready",tier="batched"}')


def retries(system: System) -> float:
    return metric(system, "tiergate_upstream_retries_total")


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("depth", "param"),
    [(200, "tools.0.function.parameters"),  # the node refuses it, naming the field
     (300, None)],  # the issue's: past the body's nesting limit, the router refuses it itself
)  # fmt: skip
def test_a_tool_schema_nested_deep_is_the_client_s_400_and_ejects_nothing(
    system: System, stream: bool, depth: int, param: str | None
) -> None:
    before = retries(system)
    with httpx.Client(base_url=system.url, timeout=60) as client:
        for i in range(10):
            body = chat("coder", f"task {i}", tools=deep_tools(depth), stream=stream)
            bad = client.post("/v1/chat/completions", json=body)
            error = assert_refused(bad, 400, None, system)
            assert error.get("param") == param, error
            # The next request on the same client connection (and maybe on the node connection
            # the last one used) is served.
            ok = client.post("/v1/chat/completions", json=chat("coder", f"task {i}", max_tokens=2))
            assert ok.status_code == 200, ok.text
    assert ready_batched(system) == 4
    assert retries(system) == before  # a 400 is the request's: tried once
    for node in system.nodes["coder"]:
        assert "Traceback" not in node.log_text()


def test_a_node_answers_a_request_it_refuses_and_keeps_the_connection(system: System) -> None:
    """The node dropped its kept-alive connection after such a 400 without a word: the next
    request sent on it (by the router's connection pool) failed."""
    parts = urlsplit(system.nodes["coder"][0].url)
    bodies = [chat("coder", tools=DEEP_TOOLS), chat("coder", max_tokens=2)]
    with socket.create_connection((parts.hostname, parts.port), timeout=60) as sock:
        replies = []
        for body in bodies:
            raw = json.dumps(body).encode()
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: node\r\n"
                         b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                         % (len(raw), raw))  # fmt: skip
            replies.append(one_reply(sock))
    assert [r.status_code for r in replies] == [400, 200], [r.text for r in replies]
    assert replies[0].json()["error"]["param"] == "tools.0.function.parameters"
    assert "close" not in replies[0].headers.get("connection", "")


def test_a_request_every_node_fails_is_a_503_naming_none_and_ejects_none(
    system: System,
) -> None:
    before = retries(system)
    for i in range(6):  # past the 5 failures in a row that eject an endpoint
        r = httpx.post(system.url + "/v1/chat/completions",
                       json=chat("drill", f"task {i}", max_tokens=2),
                       headers={"x-tiergate-fault": "500"}, timeout=60)  # fmt: skip
        error = assert_refused(r, 503, "upstream_unavailable", system)
        assert error["type"] == "server_error" and r.headers["retry-after"] == "1"
        assert "2 attempt(s)" in error["message"]
    assert retries(system) == before + 6  # each tried the second node once
    assert ready_batched(system) == 4
    assert_serves(system, {}, "drill")


def test_a_client_s_fault_header_does_not_reach_nodes_that_ignore_it(system: System) -> None:
    for fault in ("500", "503", "midstream"):
        r = httpx.post(system.url + "/v1/chat/completions", json=chat("coder", max_tokens=2),
                       headers={"x-tiergate-fault": fault}, timeout=60)  # fmt: skip
        assert r.status_code == 200, r.text


def test_endpoints_that_are_gone_are_503s_naming_none(system: System) -> None:
    """Both refuse connections: one is ejected, and the last of a pool never is (a pool that
    fails whole keeps being tried, router/discovery/outliers.py)."""
    for i in range(8):
        r = httpx.post(system.url + "/v1/chat/completions",
                       json=chat("gone", f"task {i}", max_tokens=2), timeout=60)  # fmt: skip
        error = assert_refused(r, 503, "upstream_unavailable", system)
        assert (
            r.headers["retry-after"] == "1" and "attempt(s); last: connection" in error["message"]
        )
    assert_serves(system, {}, "coder")


def test_every_retry_is_counted(system: System) -> None:
    """`tiergate_upstream_retries_total` stayed 0 after requests that tried two endpoints: now
    each request the failing node answered first, and the other served, counts one."""
    bad = system.nodes["flaky-bad"][0].url

    def failed() -> float:
        """The requests the failing node has failed (500 or 503)."""
        text = httpx.get(bad + "/metrics", timeout=10).text
        lines = [x for x in text.splitlines() if x.startswith("tiergate_http_errors_total{")]
        return sum(float(x.split()[-1]) for x in lines if "injected_fault" in x)

    before_retries, before_failed = retries(system), failed()
    for i in range(40):
        r = httpx.post(system.url + "/v1/chat/completions",
                       json=chat("flaky", f"task {i}", max_tokens=2), timeout=60)  # fmt: skip
        assert r.status_code == 200, r.text  # served by the other node
        if failed() - before_failed >= 3:
            break
    assert failed() - before_failed >= 3, "the failing node was never picked"
    assert retries(system) - before_retries == failed() - before_failed
