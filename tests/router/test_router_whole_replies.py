"""A long whole reply through the router, on real sim nodes: waited for past the read timeout
that finds a hung stream, and past the whole-reply limit a 504 that no other node repeats."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass
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

#: Real servers, and seconds of decoding: left out of `make test-fast`.
pytestmark = pytest.mark.slow

Served = Callable[[Any], AbstractContextManager[str]]
#: An 8B model on one H100 decodes these in about 2.5 s, at least 1 s on any machine.
LONG_REPLY_TOKENS = 400


@dataclass
class Router:
    url: str
    metrics: str
    nodes: list[str]
    ledger: Path
    source: StaticSource


def router(tmp: Path, served: Served, settings: str, nodes: int) -> Iterator[Router]:
    """A router with `settings` in front of `nodes` sim nodes of one pool."""
    node = NodeConfig(
        serving=ServingSpec(
            model="llama-3.1-8b", accelerator="h100-sxm", batching=BatchingSpec(max_num_seqs=8)
        ),
        served_model_names=["coder"],
    )
    with ExitStack() as stack:
        urls = [stack.enter_context(served(create_app(node))) for _ in range(nodes)]
        text = (
            f"router: {{ledgerPath: {tmp / 'ledger.sqlite'}, {settings}}}\npools:\n"
            "  - {name: long, tier: batched, model: llama-3.1-8b, accelerator: h100-sxm, "
            f"servedModelName: coder, batching: {{maxNumSeqs: 8}}, endpoints: {urls}}}\n"
        )
        config = parse_config(text)
        source = StaticSource(build_view(config.pools, default_catalog()))
        app = build_app(config, source)
        yield Router(
            stack.enter_context(served(app)),
            stack.enter_context(served(app.metrics_app)),
            urls,
            tmp / "ledger.sqlite",
            source,
        )


@pytest.fixture(scope="module")
def patient(tmp_path_factory: pytest.TempPathFactory, served: Served) -> Iterator[Router]:
    """A read timeout far shorter than a long reply takes; the whole-reply limit far longer."""
    yield from router(
        tmp_path_factory.mktemp("patient"), served,
        "upstreamReadTimeoutS: 0.5, wholeReplyTimeoutS: 120", nodes=1,
    )  # fmt: skip


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory, served: Served) -> Iterator[Router]:
    """A whole-reply limit shorter than a long reply takes, and two nodes to retry on."""
    yield from router(tmp_path_factory.mktemp("limited"), served, "wholeReplyTimeoutS: 0.5", 2)


def long_request(stream: bool) -> dict[str, Any]:
    return {
        "model": "coder",
        "messages": [{"role": "user", "content": "write it all"}],
        "max_tokens": LONG_REPLY_TOKENS,
        "stream": stream,
    }


def sample(metrics_url: str, name: str) -> float:
    text = httpx.get(metrics_url + "/metrics").text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


def test_a_whole_reply_longer_than_the_read_timeout_is_served_once(patient: Router) -> None:
    reply = httpx.post(patient.url + "/v1/chat/completions", json=long_request(False), timeout=60)
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] == LONG_REPLY_TOKENS
    assert sample(patient.metrics, "tiergate_upstream_retries_total") == 0
    assert all(e.consecutive_failures == 0 for e in patient.source.view.endpoints())
    # A stream of the same length is served too: its parts come well within the timeout.
    with httpx.stream(
        "POST", patient.url + "/v1/chat/completions", json=long_request(True), timeout=60
    ) as streamed:
        assert streamed.status_code == 200
        assert [line for line in streamed.iter_lines() if line][-1] == "data: [DONE]"


def test_a_whole_reply_past_the_limit_is_a_504_billed_nothing_and_not_repeated(
    limited: Router,
) -> None:
    reply = httpx.post(limited.url + "/v1/chat/completions", json=long_request(False), timeout=60)
    assert reply.status_code == 504, reply.text
    error = reply.json()["error"]
    assert (error["type"], error["code"]) == ("server_error", "upstream_timeout")
    assert "within 0.5 s" in error["message"]
    assert not any(url in error["message"] for url in limited.nodes)
    # Tried on no other node, and not held against the one that was generating it.
    assert sample(limited.metrics, "tiergate_upstream_retries_total") == 0
    assert all(e.consecutive_failures == 0 for e in limited.source.view.endpoints())
    ((status, outcome, cost),) = sqlite3.connect(limited.ledger).execute(
        "select http_status, outcome, cost_usd from usage"
    )
    assert (status, outcome, cost) == (504, "upstream_error", 0)
    # A stream is not bounded by the whole-reply limit.
    with httpx.stream(
        "POST", limited.url + "/v1/chat/completions", json=long_request(True), timeout=60
    ) as streamed:
        assert streamed.status_code == 200
        assert [line for line in streamed.iter_lines() if line][-1] == "data: [DONE]"
