"""A router told to stop (SIGTERM: a rollout, a scale-down) lets the streams in flight finish
for `router.shutdownGraceS`, on real processes: one that finishes within it ends whole and is
billed whole; one still running past it is cut, billed for what was relayed."""

from __future__ import annotations

import json
import signal
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from polling_helpers import until
from process_helpers import Running, start_ready_router, start_sim_node

#: Real processes and servers, or seconds of work: left out of `make test-fast`.
pytestmark = pytest.mark.slow

#: A 70B model on two H100s in fp8 streams its tokens at a few tens a second: 150 of them take
#: seconds, long past the moment the router is told to stop.
TOKENS = 150


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    folder = tmp_path_factory.mktemp("node")
    running = start_sim_node(
        folder / "node.log", "--model", "llama-3.1-70b", "--accelerator", "h100-sxm",
        "--chips", "2", "--weight-dtype", "fp8", "--served-model-name", "chat",
    )  # fmt: skip
    try:
        yield running
    finally:
        running.stop()


def router_for(node: Running, folder: Path, grace_s: int) -> Running:
    config = folder / "router.yaml"
    config.write_text(
        f"router: {{ledgerPath: '{folder / 'ledger.sqlite'}', shutdownGraceS: {grace_s}}}\n"
        f"pools:\n  - {{name: p, tier: batched, model: llama-3.1-70b, accelerator: h100-sxm, "
        f"chips: 2, weightDtype: fp8, servedModelName: chat, endpoints: [{node.url}]}}\n"
    )
    return start_ready_router(config, folder / "router.log")


def stream_while_stopping(router: Running) -> tuple[list[dict[str, object]], bool]:
    """A stream of TOKENS tokens, the router sent SIGTERM once its first tokens came: the
    events the client got, and whether the stream ended with [DONE]."""
    events: list[dict[str, object]] = []
    done = threading.Event()

    def read() -> None:
        body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": TOKENS, "stream": True,
                "stream_options": {"include_usage": True}}  # fmt: skip
        try:
            with httpx.stream("POST", router.url + "/v1/chat/completions", json=body,
                              timeout=120) as reply:  # fmt: skip
                for line in reply.iter_lines():
                    if line == "data: [DONE]":
                        done.set()
                    elif line.startswith("data: "):
                        events.append(json.loads(line[6:]))
        except httpx.HTTPError:
            pass  # cut: what came is in `events`

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    until(lambda: len(events) >= 3, "the stream sent no token", 60)
    router.process.send_signal(signal.SIGTERM)
    reader.join(120)
    assert not reader.is_alive(), "the stream never ended"
    return events, done.is_set()


def billed(folder: Path) -> list[tuple[str, int]]:
    query = "select outcome, completion_tokens from usage"
    return list(sqlite3.connect(folder / "ledger.sqlite").execute(query))


def test_a_stream_in_flight_finishes_within_the_grace_period(node: Running, tmp_path: Path) -> None:
    router = router_for(node, tmp_path, grace_s=60)
    try:
        events, done = stream_while_stopping(router)
        assert done, events[-2:]
        usage = [e["usage"] for e in events if e.get("usage")]
        assert usage and usage[-1]["completion_tokens"] == TOKENS  # type: ignore[index]
        status = router.process.wait(60)
    finally:
        router.stop()
    assert status in (0, -signal.SIGTERM), router.log_text()
    assert billed(tmp_path) == [("ok", TOKENS)]


def test_a_stream_past_the_grace_period_is_cut_and_billed_for_what_was_relayed(
    node: Running, tmp_path: Path
) -> None:
    router = router_for(node, tmp_path, grace_s=0)
    try:
        events, done = stream_while_stopping(router)
        router.process.wait(60)
    finally:
        router.stop()
    assert not done
    relayed = sum(1 for e in events if e.get("choices"))
    until(lambda: len(billed(tmp_path)) == 1, lambda: f"rows: {billed(tmp_path)}")
    ((_, completion),) = billed(tmp_path)
    assert 0 < relayed < TOKENS and completion >= relayed - 1, (relayed, completion)
