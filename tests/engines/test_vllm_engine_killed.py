"""The real engine killed mid-stream behind the router.

The spare endpoint is a sim node, not a second vLLM (two engines generating at once would share
the two cores' OpenMP threads, and the run's keyed engine is for the hosted tests): a sim node
serving the same model name, in a second pool of the same tier that the router's
latency predictions rank second (the engine's pool claims the faster catalog hardware). The
engine's batch cap (8) is below the streams sent (12), so some wait in its queue with no
token yet when it dies: those go to the spare and complete; those that had tokens end with
an error event and are billed for what they were sent, at the engine's own count.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from engine_process import EngineProcess
from engine_router import KEYS, MODEL, cost_usd, ledger_rows, pool_yaml, start_engine_router
from polling_helpers import until
from process_helpers import Running, start_sim_node

from tiergate.router.discovery.scraper import parse_vllm_metrics

STREAMS = 12
MAX_TOKENS = 200


@dataclass
class Stream:
    """What one client saw of its stream: the events' JSON, and whether it ended cleanly."""

    events: list[dict[str, Any]] = field(default_factory=list)
    done: bool = False
    status: int = 0

    def tokens(self) -> int:
        return sum(1 for e in self.events if e.get("choices") and _content(e))

    def error(self) -> dict[str, Any] | None:
        return next((e["error"] for e in self.events if "error" in e), None)

    def last_usage(self) -> dict[str, Any] | None:
        usages = [e["usage"] for e in self.events if e.get("usage")]
        return usages[-1] if usages else None


def _content(event: dict[str, Any]) -> str:
    return str(event["choices"][0].get("delta", {}).get("content") or "")


@pytest.fixture
def system(engine: EngineProcess, tmp_path: Path) -> Iterator[tuple[Running, EngineProcess]]:
    """The router over two pools: the engine, then a sim node as the spare."""
    spare = start_sim_node(
        tmp_path / "spare.log",
        "--model", "llama-3.1-8b", "--accelerator", "a100-40gb",
        "--served-model-name", MODEL, "--max-num-seqs", "16",
    )  # fmt: skip
    engine_url = engine.ensure_started()
    pools = pool_yaml("engine", engine_url, model="llama-3.2-1b", accelerator="b200")
    pools += pool_yaml("spare", spare.url, model="llama-3.1-8b", accelerator="a100-40gb")
    # Predicted latency alone orders the endpoints: the engine's pool first, always.
    policy = "policy: {scorers: [{type: predicted-latency-scorer, weight: 1}]}"
    router = start_engine_router(tmp_path, pools, policy)
    try:
        yield router, engine
    finally:
        router.stop()
        spare.stop()


def read_stream(url: str, index: int, stream: Stream) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"Stream {index}: tell a long story."}],
        "max_tokens": MAX_TOKENS,
        "ignore_eos": True,  # vLLM's: every stream runs its full length
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    headers = {"authorization": f"Bearer {KEYS['alice']}"}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, headers=headers,
                      timeout=300) as reply:  # fmt: skip
        stream.status = reply.status_code
        for line in reply.iter_lines():
            if line == "data: [DONE]":
                stream.done = True
            elif line.startswith("data: "):
                stream.events.append(json.loads(line[6:]))


def engine_load(engine: EngineProcess) -> tuple[float, float]:
    metrics = parse_vllm_metrics(httpx.get(engine.url + "/metrics", timeout=10).text)
    return metrics.running or 0.0, metrics.waiting or 0.0


def test_an_engine_killed_mid_stream(system: tuple[Running, EngineProcess]) -> None:
    router, engine = system
    streams = [Stream() for _ in range(STREAMS)]
    threads = [
        threading.Thread(target=read_stream, args=(router.url, i, s), daemon=True)
        for i, s in enumerate(streams)
    ]
    for thread in threads:
        thread.start()
    # Kill it once its batch is full, some streams are queued behind it, and the running ones
    # have been sent tokens.
    until(lambda: engine_load(engine) == (8.0, STREAMS - 8.0),
          "the engine never held 8 running and the rest waiting", 300)  # fmt: skip
    until(lambda: sum(1 for s in streams if s.tokens()) >= 8,
          "the running streams were sent no token", 300)  # fmt: skip
    engine.kill()
    for thread in threads:
        thread.join(300)
        assert not thread.is_alive(), "a stream never ended"

    cut = [s for s in streams if s.error() is not None]
    moved = [s for s in streams if s.error() is None]
    assert len(cut) == 8 and len(moved) == STREAMS - 8, [s.error() for s in streams]
    for stream in moved:  # queued in the engine with no token: served whole by the spare
        assert stream.status == 200 and stream.done
        usage = stream.last_usage()
        assert usage is not None and usage["completion_tokens"] == MAX_TOKENS
    for stream in cut:  # had tokens: an error event ends what was relayed
        error = stream.error()
        assert stream.status == 200 and stream.tokens() > 0
        assert error is not None and error["code"] == "upstream_failed"
    # Billing: each cut stream at the engine's last count the client saw (plus nothing
    # unseen), each moved one at the spare's. A cut stream's row is final only after the
    # client has the error event (`incomplete` until then).
    rows = ledger_rows(router.log.parent, STREAMS, "tenant = 'alice' and outcome != 'incomplete'")
    cut_rows = sorted((r["prompt_tokens"], r["completion_tokens"], r["cost_usd"])
                      for r in rows if r["pool"] == "engine")  # fmt: skip
    seen = []
    for stream in cut:
        usage = stream.last_usage()
        assert usage is not None
        prompt, completion = usage["prompt_tokens"], usage["completion_tokens"]
        seen.append((prompt, completion, pytest.approx(cost_usd(prompt, completion))))
    assert cut_rows == sorted(seen, key=lambda t: (t[0], t[1]))
    spare_rows = [r for r in rows if r["pool"] == "spare"]
    assert len(spare_rows) == STREAMS - 8
    assert all(r["completion_tokens"] == MAX_TOKENS for r in spare_rows)
