"""`tiergate router --workers N`: real processes on a real port. Two workers serve one port
(the kernel spreads connections: both answer), stop gracefully on SIGTERM, are started again
when one is killed, die with a killed supervisor, and add their metrics up (both answer
scrapes on the shared metrics port, each with the sum). The SQLite ledger,
a bad configuration and a worker that cannot start are each one line and exit status 2.

Which worker served a connection is read from /proc: the process holding the server's end.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from polling_helpers import until
from process_helpers import Running, accepting, start_router
from process_tree import alive, children, server_end

from tiergate.sim_nodes.perf import BatchingSpec, ServingSpec
from tiergate.sim_nodes.server import NodeConfig, create_app

#: Real processes and servers, or seconds of work: left out of `make test-fast`.
pytestmark = pytest.mark.slow

Served = Callable[[Any], AbstractContextManager[str]]

CONFIG = """\
router: {{ledgerPath: ':memory:'{ledger}}}
pools:
  - {{name: b, tier: batched, model: llama-3.1-8b, accelerator: wse-3, servedModelName: coder,
      batching: {{maxNumSeqs: 64}}, endpoints: [{node}]}}
"""
#: The longest a worker may take to start, or to stop (the machine may be busy).
WITHIN_S = 60.0
COMPLETIONS = "/v1/chat/completions"
CHAT = {"model": "coder", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture
def node(served: Served) -> Iterator[str]:
    """A simulated node for the router's pool."""
    serving = ServingSpec(model="llama-3.1-8b", accelerator="wse-3", batching=BatchingSpec())
    with served(create_app(NodeConfig(serving=serving, served_model_names=["coder"]))) as url:
        yield url


def write_config(tmp_path: Path, node: str, dsn: str | None) -> Path:
    """The router's configuration: a pool of `node`, the ledger in PostgreSQL at `dsn` (None:
    SQLite, in memory)."""
    path = tmp_path / "router.yaml"
    path.write_text(CONFIG.format(ledger=f", ledgerUrl: '{dsn}'" if dsn else "", node=node))
    return path


@contextmanager
def two_workers(config: Path, log: Path) -> Iterator[Running]:
    """`tiergate router --workers 2`, listening (it logs the URL once both workers serve)."""
    router = start_router(config, log, "--workers", "2")
    try:
        yield router
    finally:
        router.stop()


def answered_by(
    url: str, pids: set[int], path: str = "/healthz", body: dict[str, Any] | None = None
) -> tuple[int, bytes]:
    """Send one request on a new connection (GET `path`, or POST `body` there); which of
    `pids` answered it (200), and its body."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=30)
    try:
        if body is None:
            connection.request("GET", path)
        else:
            headers = {"content-type": "application/json"}
            connection.request("POST", path, json.dumps(body), headers)
        reply = connection.getresponse()
        text = reply.read()
        assert reply.status == 200, text
        assert connection.sock is not None  # kept alive: the server's end is still open
        return server_end(connection.sock, pids), text
    finally:
        connection.close()


def each_answers(
    url: str, pids: set[int], path: str = "/healthz", body: dict[str, Any] | None = None
) -> dict[int, list[bytes]]:
    """Send requests on new connections until each of `pids` has answered one (the kernel
    picks a worker per connection); the bodies each answered, every one a 200."""
    replies: dict[int, list[bytes]] = {}

    def each_answered() -> bool:
        pid, text = answered_by(url, pids, path, body)
        replies.setdefault(pid, []).append(text)
        return set(replies) == pids

    until(each_answered, f"not every worker of {sorted(pids)} answered", WITHIN_S)
    return replies


def metric(text: str, name: str) -> float:
    """The sum of every series of `name` in a /metrics exposition."""
    pattern = re.compile(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", re.M)
    return sum(float(value) for value in pattern.findall(text))


def metrics_port(router: Running) -> str:
    """The base URL of the router's metrics port."""
    return router.metrics_url.removesuffix("/metrics")


def get(url: str, path: str) -> str:
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=30)
    try:
        connection.request("GET", path)
        reply = connection.getresponse()
        assert reply.status == 200
        return reply.read().decode()
    finally:
        connection.close()


def test_two_workers_serve_one_port_and_both_answer(tmp_path: Path, node: str, pg_dsn: str) -> None:
    log = tmp_path / "router.log"
    with two_workers(write_config(tmp_path, node, pg_dsn), log) as router:
        workers = children(router.process.pid)
        assert len(workers) == 2
        each_answers(router.url, workers)
        each_answers(router.url, workers, "/readyz")  # any worker answers the probes
        text = log.read_text()
        assert text.count("event=listening") == 1, text
        for pid in workers:  # each worker's lines say which it is
            assert re.search(rf"level=INFO worker=[01] pid={pid} logger=", text), text
    assert "Traceback" not in log.read_text()


def test_counters_add_up_over_the_workers(tmp_path: Path, node: str, pg_dsn: str) -> None:
    log = tmp_path / "router.log"
    with two_workers(write_config(tmp_path, node, pg_dsn), log) as router:
        workers = children(router.process.pid)
        served = each_answers(router.url, workers, COMPLETIONS, CHAT)
        sent = sum(len(replies) for replies in served.values())
        # The kernel spreads scrapes over the workers too: whichever answers has the sum.
        scrapes = each_answers(metrics_port(router), workers, "/metrics")
        for pid, replies in scrapes.items():
            assert metric(replies[-1].decode(), "tiergate_requests_total") == sent, pid
        text = get(metrics_port(router), "/metrics")
        assert metric(text, "tiergate_requests_total") == sent, text
        assert metric(text, "tiergate_tokens_total") > 0
        assert metric(text, "tiergate_workers") == 2
        cap = int(re.findall(r"event=connection_limits max_connections=(\d+)", log.read_text())[-1])
        assert metric(text, "tiergate_connections_max") == 2 * cap  # each worker's own cap
        assert metric(text, "tiergate_worker_restarts_total") == 0
        assert 'tiergate_config_reloads_total{config="pools",result="applied"}' in text
        assert "_created" not in text  # none in multiprocess mode
        usage = each_answers(router.url, workers, "/v1/usage")  # one ledger: one answer
        for replies in usage.values():
            assert all(json.loads(reply)["totals"]["requests"] == sent for reply in replies)


@contextmanager
def a_held_stream(
    tmp_path: Path, served: Served, dsn: str
) -> Iterator[tuple[Running, http.client.HTTPResponse, int, threading.Event]]:
    """Two workers, one of them relaying a stream its node holds after the first chunk until
    the event is set: the router, the stream's reply, the worker relaying it, the event."""
    gate = threading.Event()
    with (
        served(held_stream(gate)) as upstream,
        two_workers(write_config(tmp_path, upstream, dsn), tmp_path / "router.log") as router,
    ):
        parts = urlsplit(router.url)
        client = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=30)
        try:
            body = json.dumps({**CHAT, "stream": True})
            client.request("POST", COMPLETIONS, body, {"content-type": "application/json"})
            reply = client.getresponse()
            assert reply.status == 200
            assert reply.readline().startswith(b"data: ")  # the stream is under way
            assert client.sock is not None
            relaying = server_end(client.sock, children(router.process.pid))
            yield router, reply, relaying, gate
        finally:
            client.close()
            gate.set()  # the node's held request ends, so the node can stop


def draining(router: Running) -> None:
    """Wait until the workers no longer accept connections and one waits for its stream."""
    until(lambda: not accepting(router.url), "the workers still accept", WITHIN_S)
    until(lambda: "Waiting for connections to close" in router.log_text(), "no drain", WITHIN_S)


def test_sigterm_lets_a_stream_finish_then_exits_0(
    tmp_path: Path, served: Served, pg_dsn: str
) -> None:
    with a_held_stream(tmp_path, served, pg_dsn) as (router, reply, relaying, gate):
        workers = children(router.process.pid)
        router.process.send_signal(signal.SIGTERM)
        draining(router)
        assert alive(relaying)
        gate.set()
        rest = reply.read()
        assert rest.rstrip().endswith(b"data: [DONE]"), rest
        assert router.process.wait(WITHIN_S) == 0, router.log_text()
    until(lambda: not any(alive(pid) for pid in workers), "a worker outlived its supervisor")
    assert router.log_text().count("event=worker_stopped") == 2
    assert "Traceback" not in router.log_text()


def test_a_second_sigterm_stops_the_workers_without_waiting(
    tmp_path: Path, served: Served, pg_dsn: str
) -> None:
    with a_held_stream(tmp_path, served, pg_dsn) as (router, reply, relaying, _):
        router.process.send_signal(signal.SIGTERM)
        draining(router)
        router.process.send_signal(signal.SIGTERM)  # the stream's node still holds it
        assert router.process.wait(WITHIN_S) == 0, router.log_text()
        assert not alive(relaying)
        try:
            rest = reply.read()
        except (http.client.IncompleteRead, ConnectionError):
            rest = b""
        assert b"[DONE]" not in rest
    assert "Traceback" not in router.log_text()


def test_a_stream_cut_at_the_end_of_the_grace_period_is_billed_every_token_relayed(
    tmp_path: Path, served: Served
) -> None:
    """SIGTERM while a node holds a stream: past the grace period (1 s here) the router cuts
    it. Its row was last amended at the first token (1 token); the client has had 5 since, and
    the router bills those 5."""
    gate = threading.Event()
    ledger = tmp_path / "ledger.sqlite"
    with served(held_stream(gate, usage=[1, 5])) as upstream:
        config = tmp_path / "router.yaml"
        config.write_text(
            CONFIG.replace("':memory:'", f"'{ledger}'").format(
                ledger=", shutdownGraceS: 1", node=upstream
            )
        )
        router = start_router(config, tmp_path / "router.log")
        try:
            parts = urlsplit(router.url)
            client = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=60)
            body = json.dumps({**CHAT, "max_tokens": 50, "stream": True})
            client.request("POST", COMPLETIONS, body, {"content-type": "application/json"})
            reply = client.getresponse()
            assert reply.status == 200
            got = [reply.readline() for _ in range(4)]  # two events, each a line and a blank
            assert b'"content":"hi"' in got[2], got
            router.process.send_signal(signal.SIGTERM)  # the node holds the stream for ever
            assert router.process.wait(WITHIN_S) in (0, -signal.SIGTERM), router.log_text()
            client.close()
        finally:
            gate.set()
            router.stop()
    with sqlite3.connect(ledger) as db:
        rows = db.execute("SELECT prompt_tokens, completion_tokens FROM usage").fetchall()
    assert rows == [(7, 5)]
    assert "timeout graceful shutdown exceeded" in router.log_text()  # uvicorn says why


def held_stream(gate: threading.Event, usage: Sequence[int] = ()) -> Callable[..., Any]:
    """A node that streams one chunk, then the rest only once `gate` is set. With `usage`:
    a chunk for each count, saying it (prompt 7 tokens), before it holds."""
    chunk = b'data: {"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'  # noqa: E501
    with_usage = [
        chunk[:-3] + b',"usage":{"prompt_tokens":7,"completion_tokens":%d}}\n\n' % count
        for count in usage
    ]

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["method"] != "POST":  # the router's scrapes of /metrics: an idle node's
            metrics = b"vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": metrics})
            return
        await receive()
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for event in with_usage or [chunk]:
            await send({"type": "http.response.body", "body": event, "more_body": True})
            await asyncio.sleep(0.1)  # each its own read, within the bill interval
        await asyncio.get_running_loop().run_in_executor(None, gate.wait, WITHIN_S)
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})

    return app


def test_a_killed_worker_is_started_again_and_serving_goes_on(
    tmp_path: Path, node: str, pg_dsn: str
) -> None:
    log = tmp_path / "router.log"
    with two_workers(write_config(tmp_path, node, pg_dsn), log) as router:
        supervisor = router.process.pid
        killed, kept = sorted(children(supervisor))
        os.kill(killed, signal.SIGKILL)
        until(lambda: f"pid={killed} code=-9 signal=SIGKILL" in log.read_text(), "not noticed")
        until(lambda: log.read_text().count("event=worker_ready") == 3, "not started again")
        workers = children(supervisor)
        assert kept in workers and killed not in workers and len(workers) == 2
        each_answers(router.url, workers, COMPLETIONS, CHAT)
        text = get(metrics_port(router), "/metrics")
        assert metric(text, "tiergate_workers") == 2  # the killed one's gauges are dropped
        assert metric(text, "tiergate_worker_restarts_total") == 1
        assert "event=worker_exited" in log.read_text()


def test_a_killed_supervisor_leaves_no_worker_behind(
    tmp_path: Path, node: str, pg_dsn: str
) -> None:
    with two_workers(write_config(tmp_path, node, pg_dsn), tmp_path / "router.log") as router:
        workers = children(router.process.pid)
        router.process.kill()
        router.process.wait()
        until(lambda: not any(alive(pid) for pid in workers), "workers outlived the supervisor")
        assert not accepting(router.url)


def tiergate(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run `tiergate ARGS...` to its end; its exit status and output."""
    return subprocess.run(
        [sys.executable, "-P", "-m", "tiergate", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=WITHIN_S * 2,
        check=False,
    )


def error_lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in result.stderr.splitlines() if "error" in line.lower()]


def test_the_sqlite_ledger_refuses_more_than_one_worker(tmp_path: Path) -> None:
    config = tmp_path / "router.yaml"
    config.write_text("router: {ledgerPath: ':memory:'}\npools: []\n")
    result = tiergate("router", "--config", str(config), "--port", "0", "--workers", "2")
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == (
        "tiergate router: error: --workers 2 needs a shared ledger (router.ledgerUrl or "
        "router.ledgerUrlFile): with the SQLite ledger each worker would enforce budgets and "
        "rate limits on its own"
    )
    assert "worker_started" not in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("router", "expected"),
    [
        ("{ledgerUrl: 'postgresql://x@127.0.0.1/db', port: [1]}", "router.port"),
        ("{ledgerUrlFile: /nonexistent/ledger-url}", "router.ledgerUrlFile"),
        ("{ledgerUrl: 'mysql://x@127.0.0.1/db'}", "not a postgresql:// URL"),
        ("{ledgerUrl: 'postgresql://x@127.0.0.1:1/db'}", "cannot open the usage ledger"),
    ],
)
def test_a_bad_configuration_is_one_line_before_any_worker_starts(
    tmp_path: Path, router: str, expected: str
) -> None:
    config = tmp_path / "router.yaml"
    config.write_text(f"router: {router}\npools: []\n")
    result = tiergate("router", "--config", str(config), "--port", "0", "--workers", "2")
    assert result.returncode == 2, result.stderr
    (line,) = error_lines(result)
    assert line.startswith("tiergate router: error: ") and expected in line, line
    assert "worker_started" not in result.stderr and "Traceback" not in result.stderr


def test_a_worker_that_cannot_start_stops_the_router_with_its_error(
    tmp_path: Path, pg_dsn: str
) -> None:
    """Discovery from Kubernetes without an API: the supervisor cannot tell before a worker
    builds its router; the worker's one line is the router's, and nothing is retried."""
    config = tmp_path / "router.yaml"
    config.write_text(f"router: {{ledgerUrl: '{pg_dsn}'}}\ndiscovery: {{kubernetes: {{}}}}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    env["KUBECONFIG"] = str(tmp_path / "no-kubeconfig")
    result = tiergate(
        "router",
        "--config",
        str(config),
        "--port",
        "0",
        "--metrics-port",
        "0",
        "--workers",
        "2",
        env=env,
    )
    assert result.returncode == 2, result.stderr
    (line,) = error_lines(result)
    assert line.startswith("tiergate router: error: discovery.kubernetes: no Kubernetes API")
    assert result.stderr.splitlines()[-1] == line  # the last line: the workers have stopped
    assert result.stderr.count("event=worker_started") == 2  # none started again
    assert "Traceback" not in result.stderr


def test_one_worker_is_the_router_itself(tmp_path: Path, node: str) -> None:
    """The default (--workers 1): no supervisor, no shared metrics."""
    router = start_router(write_config(tmp_path, node, None), tmp_path / "router.log")
    try:
        assert answered_by(router.url, {router.process.pid})[0] == router.process.pid
        text = get(metrics_port(router), "/metrics")
        assert "tiergate_workers" not in text and "tiergate_upstream_retries_created" in text
    finally:
        router.stop()
    assert "worker=" not in (tmp_path / "router.log").read_text()
