"""A stream cut short, against real router and sim-node processes: it is billed the tokens it
relayed and its prompt as the node counted it, whatever the client shaped.

The premium pool decodes speculatively (a chunk carries several tokens) and prices prompts, so
billing a token per chunk, or the prompt at the router's estimate, would undercharge a client
that leaves before the usage chunk. The node's filler text is a word a token: a client counts
the tokens it received by counting words.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from adversarial_helpers import Pool, System, chat, running_system
from polling_helpers import until

#: Real processes and servers, or seconds of work: left out of `make test-fast`.
pytestmark = pytest.mark.slow

SPECULATIVE = "{draftModel: llama-3.2-1b, tokens: 4, acceptanceRate: 0.8}"
INPUT_USD, OUTPUT_USD = 2.0, 10.0  # per million tokens


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    premium = Pool(
        "p",
        "premium",
        "spec",
        node_flags=("--speculative-tokens", "4", "--acceptance-rate", "0.8",
                    "--draft-model", "llama-3.2-1b"),
        extra=f"speculativeDecoding: {SPECULATIVE}, billing: "
        f"{{inputPerMillionUsd: {INPUT_USD}, outputPerMillionUsd: {OUTPUT_USD}}}",
    )  # fmt: skip
    with running_system(tmp_path_factory.mktemp("cut-streams"), [premium]) as running:
        yield running


def cut_stream(system: System, body: dict[str, Any], chunks: int) -> tuple[str, int]:
    """Stream `body` and close the connection after `chunks` content chunks: (the request's
    id, the tokens received)."""
    received = 0
    with httpx.stream("POST", system.url + "/v1/chat/completions", json=body, timeout=60) as reply:
        assert reply.status_code == 200, reply.read()
        lines = (line for line in reply.iter_lines() if line.startswith("data: {"))
        for _ in range(chunks):
            delta = json.loads(next(lines)[6:])["choices"][0]["delta"]
            received += len(delta["content"].split())
        return reply.headers["x-tiergate-request-id"], received


def billed_row(system: System, request_id: str) -> tuple[str, int, int, float]:
    """(outcome, prompt tokens, completion tokens, cost) of the request's ledger row, once
    the router has accounted for it for good."""
    query = (
        "SELECT outcome, prompt_tokens, completion_tokens, cost_usd FROM usage "
        "WHERE request_id = ? AND outcome != 'incomplete'"
    )
    rows: list[tuple[str, int, int, float]] = []

    def accounted() -> bool:
        with contextlib.closing(sqlite3.connect(system.ledger)) as db:
            rows[:] = db.execute(query, (request_id,)).fetchall()
        return bool(rows)

    until(accounted, "the cut stream was never accounted for", 30)
    return rows[0]


def node_prompt_tokens(system: System, body: dict[str, Any]) -> int:
    """The node's count of `body`'s prompt: asked of the node itself, without the router."""
    node = system.nodes["p"][0].url
    whole = {**body, "max_tokens": 1, "stream": False}
    r = httpx.post(node + "/v1/chat/completions", json=whole, timeout=60)
    assert r.status_code == 200, r.text
    return int(r.json()["usage"]["prompt_tokens"])


def test_a_speculative_stream_closed_after_30_chunks_is_billed_every_token_it_received(
    system: System,
) -> None:
    body = chat(
        "spec", "hi", max_tokens=4000, ignore_eos=True, stream=True, service_tier="priority"
    )
    request_id, received = cut_stream(system, body, 30)
    assert received > 30  # the premise: chunks carried several tokens
    outcome, prompt, completion, cost = billed_row(system, request_id)
    assert outcome == "client_disconnect"
    assert completion >= received
    assert prompt == node_prompt_tokens(system, body)
    assert cost == pytest.approx((prompt * INPUT_USD + completion * OUTPUT_USD) / 1e6)


WORDS = "word " * 20_000
SHAPES = {
    "plain string": "the quick brown fox jumps over it " * 3000,
    "text parts": [{"type": "text", "text": WORDS}, {"type": "text", "text": "and more"}],
    "input_text parts": [{"type": "input_text", "text": WORDS}],
    "repeated punctuation": "!" * 40_000,
}


@pytest.mark.parametrize("shape", SHAPES)
def test_a_cut_stream_is_billed_its_prompt_as_the_node_counted_it(
    system: System, shape: str
) -> None:
    body = chat("spec", max_tokens=500, ignore_eos=True, stream=True, service_tier="priority")
    body["messages"][0]["content"] = SHAPES[shape]
    request_id, _ = cut_stream(system, body, 3)
    _, prompt, _, _ = billed_row(system, request_id)
    counted = node_prompt_tokens(system, body)
    assert counted > 10_000  # the premise: a prompt worth billing
    assert prompt == counted


@pytest.mark.parametrize(
    ("options", "usage_on_chunks", "usage_chunk"),
    [
        (None, False, False),
        ({"include_usage": True}, False, True),
        ({"continuous_usage_stats": True}, False, False),  # only with include_usage (vLLM)
        ({"include_usage": True, "continuous_usage_stats": True}, True, True),
    ],
)
def test_a_client_sees_usage_only_where_it_asked_for_it(
    system: System,
    options: dict[str, bool] | None,
    usage_on_chunks: bool,
    usage_chunk: bool,
) -> None:
    """The router asks the node for usage on every chunk; the client gets OpenAI's stream
    (or vLLM's, with continuous usage), whichever it asked for."""
    body = chat("spec", max_tokens=40, ignore_eos=True, stream=True, service_tier="priority")
    if options is not None:
        body["stream_options"] = options
    with httpx.stream("POST", system.url + "/v1/chat/completions", json=body, timeout=60) as reply:
        events = [line[6:] for line in reply.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    content = [c for c in chunks if c["choices"]]
    assert sum(len(c["choices"][0]["delta"].get("content", "").split()) for c in content) == 40
    assert all(("usage" in c) is usage_on_chunks for c in content)
    if usage_on_chunks:
        assert content[-1]["usage"]["completion_tokens"] == 40
        assert content[-1]["usage"]["cost_usd"] > 0
    assert (len(chunks) - len(content) == 1) is usage_chunk
    if usage_chunk:
        assert chunks[-1]["usage"]["completion_tokens"] == 40
