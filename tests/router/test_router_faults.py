"""Faults around the router: clients that leave, nodes that die or talk nonsense.

The broken nodes here are small ASGI apps that misbehave on purpose (test doubles of one
failing piece); the router and the healthy sim node are the real ones, on real sockets.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from tiergate.router.build import build_app
from tiergate.router.config import parse_config
from tiergate.router.discovery.view import StaticSource, build_view
from tiergate.sim_nodes.catalogs import default_catalog
from tiergate.sim_nodes.perf import BatchingSpec, ServingSpec
from tiergate.sim_nodes.server import NodeConfig, create_app

#: Real processes and servers, or seconds of work: left out of `make test-fast`.
pytestmark = pytest.mark.slow

Served = Callable[[Any], AbstractContextManager[str]]
CHUNK = b'data: {"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'  # noqa: E501


async def dies_midstream(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Starts a stream, sends two chunks, then the process 'dies' (connection dropped)."""
    if scope["type"] != "http":
        return
    await receive()
    headers = [(b"content-type", b"text/event-stream")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    for _ in range(2):
        await send({"type": "http.response.body", "body": CHUNK, "more_body": True})
    raise RuntimeError("node crashed")


#: Requests `dies_before_first_token` has taken.
DIED_BEFORE_FIRST_TOKEN: list[int] = []


async def dies_before_first_token(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Starts a stream, then the process 'dies' before its first token (it was killed while
    the request waited for a batch slot or prefilled)."""
    if scope["type"] != "http":
        return
    if scope["method"] != "POST":  # the router's scrapes of /metrics: an idle node's
        metrics = b"vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n" + (
            b"vllm:kv_cache_usage_perc 0\n"
        )
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": metrics})
        return
    DIED_BEFORE_FIRST_TOKEN.append(1)
    await receive()
    headers = [(b"content-type", b"text/event-stream")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    raise RuntimeError("node crashed")


async def dies_mid_body(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Promises a 1,000-byte JSON reply, sends 20 bytes of it, then the connection drops."""
    if scope["type"] != "http":
        return
    await receive()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"1000")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b'{"id":"x","choices":', "more_body": True})
    raise RuntimeError("node crashed")


async def talks_garbage(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Answers 200 with something that is neither JSON nor a stream."""
    if scope["type"] != "http":
        return
    await receive()
    headers = [(b"content-type", b"text/html")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"<html>oops</html>"})


def pool(name: str, served: str, urls: list[str]) -> str:
    return (
        f"  - {{name: {name}, tier: batched, model: llama-3.1-8b, accelerator: h100-sxm, "
        f"servedModelName: {served}, batching: {{maxNumSeqs: 8}}, "
        f"endpoints: {json.dumps(urls)}}}\n"
    )


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory, served: Served) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("faults")
    node = NodeConfig(
        serving=ServingSpec(
            model="llama-3.1-8b", accelerator="h100-sxm", batching=BatchingSpec(max_num_seqs=8)
        ),
        served_model_names=["slow"],
        fault_header_enabled=True,  # so that only the router's setting keeps the header out
    )
    flaky_node = node.model_copy(update={"served_model_names": ["flaky"]})
    with ExitStack() as stack:
        healthy = stack.enter_context(served(create_app(node)))
        dying = stack.enter_context(served(dies_midstream))
        early = [stack.enter_context(served(dies_before_first_token)) for _ in range(2)]
        flaky_healthy = stack.enter_context(served(create_app(flaky_node)))
        garbage = stack.enter_context(served(talks_garbage))
        truncated = stack.enter_context(served(dies_mid_body))
        text = f"router: {{ledgerPath: {tmp / 'ledger.sqlite'}}}\npools:\n" + "".join(
            [
                pool("slow", "slow", [healthy]),
                pool("dying", "dying", [dying]),
                pool("garbage", "garbage", [garbage]),
                pool("truncated", "truncated", [truncated]),
                pool("flaky", "flaky", [early[0], flaky_healthy]),
                pool("hopeless", "hopeless", early),
            ]  # fmt: skip
        )
        config = parse_config(text)
        app = build_app(config, StaticSource(build_view(config.pools, default_catalog())))
        router = stack.enter_context(served(app))
        metrics = stack.enter_context(served(app.metrics_app))
        yield {"url": router, "metrics": metrics, "node": healthy, "ledger": tmp / "ledger.sqlite"}


def body(model: str, **fields: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], **fields}


def running(node_url: str) -> float:
    text = httpx.get(node_url + "/metrics").text
    line = next(x for x in text.splitlines() if x.startswith("vllm:num_requests_running"))
    return float(line.split()[-1])


#: A prompt of ~1,600 tokens as the node counts it (~2,000 by the router's estimate).
LONG_PROMPT = "word " * 1600


def test_a_client_that_leaves_mid_stream_cancels_the_node_s_work(system: dict[str, Any]) -> None:
    url = system["url"] + "/v1/chat/completions"
    request = body("slow", max_tokens=5000, stream=True)
    request["messages"] = [{"role": "user", "content": LONG_PROMPT}]
    with httpx.stream("POST", url, json=request) as r:
        lines = r.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        assert running(system["node"]) == 1
    # the client hung up after one chunk of a 5000-token reply (~40 s of decoding)
    deadline = time.monotonic() + 10
    while running(system["node"]) != 0:
        assert time.monotonic() < deadline, "the node kept decoding for a client that left"
        time.sleep(0.05)
    deadline = time.monotonic() + 10
    while True:
        outcomes = [
            row[0]
            for row in sqlite3.connect(system["ledger"]).execute(
                "select outcome from usage where pool = 'slow'"
            )
        ]
        if "client_disconnect" in outcomes:
            break
        assert time.monotonic() < deadline, outcomes
        time.sleep(0.05)
    # The node had read the whole prompt: a stream cut short still bills it, as the node
    # counted it (its first chunk said so).
    ((prompt, completion, cost),) = sqlite3.connect(system["ledger"]).execute(
        "select prompt_tokens, completion_tokens, cost_usd from usage"
        " where pool = 'slow' and outcome = 'client_disconnect'"
    )
    whole = {**request, "stream": False, "max_tokens": 1}
    counted = httpx.post(system["node"] + "/v1/chat/completions", json=whole).json()["usage"]
    assert prompt == counted["prompt_tokens"] > 1000 and completion >= 1 and cost > 0


def test_a_node_dying_mid_stream_ends_the_stream_with_an_error_event(
    system: dict[str, Any],
) -> None:
    url = system["url"] + "/v1/chat/completions"
    with httpx.stream("POST", url, json=body("dying", stream=True), timeout=30) as r:
        assert r.status_code == 200
        events = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert len(events) == 3  # two relayed chunks, then the router's error event
    assert json.loads(events[0][6:])["service_tier"] == "default"
    assert json.loads(events[-1][6:])["error"]["code"] == "upstream_failed"
    metrics = httpx.get(system["metrics"] + "/metrics").text
    assert 'tiergate_midstream_errors_total{tier="batched"} 1.0' in metrics
    # and the router keeps serving
    ok = httpx.post(url, json=body("slow", max_tokens=2), timeout=30)
    assert ok.status_code == 200


def test_a_stream_whose_node_dies_before_its_first_token_is_served_by_another(
    system: dict[str, Any],
) -> None:
    """The client has seen nothing but headers the router has not sent yet: the request goes
    to another endpoint, and the client gets one whole stream."""
    url = system["url"] + "/v1/chat/completions"
    DIED_BEFORE_FIRST_TOKEN.clear()
    for i in range(40):
        request = body("flaky", stream=True, max_tokens=3)
        request["messages"][0]["content"] = f"{i} hi"  # no prefix affinity to one endpoint
        with httpx.stream("POST", url, json=request) as r:
            assert r.status_code == 200
            events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]", events
        assert all("error" not in json.loads(e) for e in events[:-1]), events
        assert any(json.loads(e)["choices"] for e in events[:-1]), events
        if len(DIED_BEFORE_FIRST_TOKEN) >= 3:
            break
    assert len(DIED_BEFORE_FIRST_TOKEN) >= 3, "the dying endpoint was never picked"
    metrics = httpx.get(system["metrics"] + "/metrics").text
    retries = next(x for x in metrics.splitlines() if x.startswith("tiergate_upstream_retries_to"))
    assert float(retries.split()[-1]) >= 3


def test_a_stream_every_node_drops_before_its_first_token_is_a_502_envelope(
    system: dict[str, Any],
) -> None:
    r = httpx.post(
        system["url"] + "/v1/chat/completions", json=body("hopeless", stream=True), timeout=30
    )
    assert r.status_code == 502 and r.headers["content-type"] == "application/json"
    assert "before the first token" in r.json()["error"]["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_node_talking_garbage_is_a_502_envelope(system: dict[str, Any], stream: bool) -> None:
    r = httpx.post(
        system["url"] + "/v1/chat/completions", json=body("garbage", stream=stream), timeout=30
    )
    assert r.status_code == 502
    assert r.json()["error"]["code"] == "bad_upstream_reply"


def test_a_reply_cut_short_is_a_502_envelope_and_recorded(system: dict[str, Any]) -> None:
    url = system["url"] + "/v1/chat/completions"
    r = httpx.post(url, json=body("truncated"), timeout=30)
    assert r.status_code == 502
    error = r.json()["error"]
    assert error["code"] == "bad_upstream_reply" and "cut short" in error["message"]
    rows = sqlite3.connect(system["ledger"]).execute(
        "select outcome, http_status from usage where pool = 'truncated'"
    )
    assert list(rows) == [("upstream_error", 502)]
    assert httpx.post(url, json=body("slow", max_tokens=2), timeout=30).status_code == 200


def test_hot_reload_through_a_running_router(
    tmp_path: Path, served: Served, system: dict[str, Any]
) -> None:
    from tiergate.router.build import file_source

    path = tmp_path / "router.yaml"
    path.write_text(
        f"router: {{ledgerPath: {tmp_path / 'l.sqlite'}}}\npools:\n"
        + pool("a", "first", [system["node"]])
    )
    config, source = file_source(path)
    source.interval_s = 0.05
    with served(build_app(config, source)) as url:
        models = lambda: [m["id"] for m in httpx.get(url + "/v1/models").json()["data"]]  # noqa: E731
        assert models() == ["first"]
        path.write_text(path.read_text().replace("servedModelName: first", "servedModelName: slow"))
        deadline = time.monotonic() + 10
        while models() != ["slow"]:
            assert time.monotonic() < deadline, "the router did not pick up the new file"
            time.sleep(0.05)
        r = httpx.post(url + "/v1/chat/completions", json=body("slow", max_tokens=2), timeout=30)
        assert r.status_code == 200


@pytest.mark.parametrize(
    ("stream", "headers", "status"),
    [
        (False, {}, 200),
        (True, {}, 200),
        (False, {"x-slo-ttft-ms": "0.001"}, 503),  # a refusal is recorded before it is sent
    ],
)
def test_a_reply_is_in_the_ledger_before_its_end_goes_out(
    tmp_path: Path,
    served: Served,
    system: dict[str, Any],
    stream: bool,
    headers: dict[str, str],
    status: int,
) -> None:
    """What a SIGKILL right after a reply cannot lose: the router commits the record before
    it sends a whole reply's body, a stream's `data: [DONE]` or an error envelope."""
    ledger = tmp_path / "ledger.sqlite"
    config = parse_config(
        f"router: {{ledgerPath: {ledger}}}\npools:\n" + pool("slow", "slow", [system["node"]])
    )
    app = build_app(config, StaticSource(build_view(config.pools, default_catalog())))
    rows_at_end: list[int] = []

    async def watched(scope: dict[str, Any], receive: Any, send: Any) -> None:
        async def send_watched(message: dict[str, Any]) -> None:
            body = message.get("body", b"")
            if message["type"] == "http.response.body" and (
                b"[DONE]" in body or (body and not message.get("more_body"))
            ):
                with sqlite3.connect(ledger) as db:
                    rows_at_end.append(db.execute("select count(*) from usage").fetchone()[0])
            await send(message)

        await app(scope, receive, send_watched if scope["type"] == "http" else send)

    with served(watched) as url:
        for _ in range(3):
            r = httpx.post(
                url + "/v1/chat/completions",
                json=body("slow", max_tokens=2, stream=stream),
                headers=headers,
            )
            assert r.status_code == status, r.text
    assert rows_at_end == [1, 2, 3]


def test_a_client_s_fault_header_does_not_reach_the_node_by_default(
    system: dict[str, Any],
) -> None:
    # With it, any client could make a shared node fail and have it ejected for every tenant.
    url = system["url"] + "/v1/chat/completions"
    for _ in range(6):
        r = httpx.post(
            url, json=body("slow", max_tokens=1), headers={"x-tiergate-fault": "503"}, timeout=30
        )
        # Forwarded, the node would answer 503 every time (and the router retry elsewhere).
        assert r.status_code == 200, r.text
