"""What a node sends back that the router must not take at its word: a redirect (the prompt
would go to a host no pool names), a reply too large to hold, a stream that ends without
saying so, usage that is missing or past what the request could produce. The nodes are small
ASGI doubles; the router is the real one, on real sockets."""

from __future__ import annotations

import gzip
import json
import logging
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack
from typing import Any

import httpx
import pytest
from polling_helpers import until

from tiergate.router.build import build_app
from tiergate.router.config import parse_config
from tiergate.router.discovery.view import StaticSource, build_view
from tiergate.router.upstream.sse import MAX_EVENT_BYTES
from tiergate.sim_nodes.catalogs import default_catalog

#: Real processes and servers, or seconds of work: left out of `make test-fast`.
pytestmark = pytest.mark.slow

Served = Callable[[Any], AbstractContextManager[str]]
#: The router's cap on a whole reply here (router.maxReplyBytes; its least).
REPLY_CAP = 65536
#: The pools' prices: a prompt token $1 a million, an output token $10.
IN_USD, OUT_USD = 1e-6, 1e-5
IDLE_METRICS = b"vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"


def whole(usage: Any, content: str = "hello there") -> bytes:
    reply: dict[str, Any] = {
        "id": "x", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                     "finish_reason": "stop"}],
    }  # fmt: skip
    if usage is not None:
        reply["usage"] = usage
    return json.dumps(reply).encode()


def chunk(content: str | None, usage: dict[str, int] | None = None) -> bytes:
    event: dict[str, Any] = {"id": "x", "object": "chat.completion.chunk", "model": "m",
                             "choices": [] if content is None else
                             [{"index": 0, "delta": {"content": content}}]}  # fmt: skip
    if usage is not None:
        event["usage"] = usage
    return b"data: " + json.dumps(event).encode() + b"\n\n"


def node(
    status: int,
    body: bytes,
    headers: list[tuple[bytes, bytes]],
    hits: list[int] | None = None,
    *,
    hold: bool = False,
) -> Callable[..., Any]:
    """A node answering every completion with `status`, `headers` and `body` (sent in 64 KiB
    pieces), and its scrapes as an idle vLLM's; `hits` counts the completions it got. `hold`:
    the body never ends, the node waits for the router to hang up."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["method"] != "POST":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": IDLE_METRICS})
            return
        while (await receive()).get("more_body"):
            pass
        if hits is not None:
            hits.append(1)
        await send({"type": "http.response.start", "status": status, "headers": headers})
        for at in range(0, len(body), 1 << 16):
            await send({"type": "http.response.body", "body": body[at : at + (1 << 16)],
                        "more_body": True})  # fmt: skip
        if hold:
            while (await receive())["type"] != "http.disconnect":
                pass
            return
        await send({"type": "http.response.body", "body": b""})

    return app


JSON = [(b"content-type", b"application/json")]
SSE = [(b"content-type", b"text/event-stream")]
SINK_HITS: list[int] = []
#: SGLang's refusal, as its OpenAI server writes it: the error's fields at the top level.
SGLANG_REFUSAL = {"object": "error", "message": "The input (9000 tokens) is longer than the "
                  "model's context length (8192 tokens).", "type": "BadRequestError",
                  "param": None, "code": 400}  # fmt: skip
#: The start of an event longer than the router holds, sent in 64 KiB pieces.
UNENDING = b"data: " + b"x" * (MAX_EVENT_BYTES + (1 << 16))


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory, served: Served) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("replies")
    absurd = {"prompt_tokens": 3, "completion_tokens": 10**12}
    with ExitStack() as stack:
        sink = stack.enter_context(served(node(200, whole({"prompt_tokens": 1,
                                                           "completion_tokens": 1}), JSON,
                                                     SINK_HITS)))  # fmt: skip
        nodes = {
            "redirects": node(307, b"", [(b"location", f"{sink}/v1/chat/completions".encode())]),
            "huge": node(200, whole(None, "x" * (2 * REPLY_CAP)), JSON),
            "bomb": node(200, gzip.compress(b" " * (64 * REPLY_CAP)),
                         [*JSON, (b"content-encoding", b"gzip")]),
            "no-done": node(200, chunk("one") + chunk("two"), SSE),
            "no-usage": node(200, whole(None, "x" * 400), JSON),
            # A stream that never says its usage (SGLang's, cut short; a provider that ignores
            # stream_options).
            "no-usage-stream": node(200, chunk("one") + chunk("two") + b"data: [DONE]\n\n", SSE),
            "half-usage": node(200, whole({"prompt_tokens": 7}, "x" * 40), JSON),
            "absurd": node(200, whole(absurd), JSON),
            "absurd-stream": node(200, chunk("one") + chunk(None, absurd) + b"data: [DONE]\n\n",
                                  SSE),
            # sse-starlette's line ends.
            "crlf": node(200, (chunk("one", {"prompt_tokens": 3, "completion_tokens": 1})
                               + chunk(None, {"prompt_tokens": 3, "completion_tokens": 1})
                               + b"data: [DONE]\n\n").replace(b"\n", b"\r\n"), SSE),
            # An event that never ends, after a token and before any.
            "unending": node(200, chunk("one") + UNENDING, SSE, hold=True),
            "unending-first": node(200, UNENDING, SSE, hold=True),
            "html-404": node(404, b"<html>Not Found</html>", JSON),
            "sglang-400": node(400, json.dumps(SGLANG_REFUSAL).encode(), JSON),
            # vLLM started with --api-key answers so when it is not given the key.
            "wants-key": node(401, b'{"error": "Unauthorized"}', JSON),
        }  # fmt: skip
        pools = "".join(
            f"  - {{name: {name}, tier: batched, model: llama-3.1-8b, accelerator: h100-sxm, "
            f"servedModelName: {name}, batching: {{maxNumSeqs: 8}}, "
            f"billing: {{inputPerMillionUsd: 1, outputPerMillionUsd: 10}}, "
            f"endpoints: [{stack.enter_context(served(app))}]}}\n"
            for name, app in nodes.items()
        )
        config = parse_config(
            f"router: {{ledgerPath: {tmp / 'ledger.sqlite'}, maxReplyBytes: {REPLY_CAP}}}\n"
            f"pools:\n{pools}"
        )
        app = build_app(config, StaticSource(build_view(config.pools, default_catalog())))
        router = stack.enter_context(served(app))
        yield {"url": router + "/v1/chat/completions", "ledger": tmp / "ledger.sqlite"}


def ask(model: str, **fields: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], **fields}


def rows(system: dict[str, Any], pool: str) -> list[tuple[Any, ...]]:
    query = (
        "select outcome, http_status, prompt_tokens, completion_tokens, cost_usd from usage"
        " where pool = ?"
    )
    return list(sqlite3.connect(system["ledger"]).execute(query, (pool,)))


@pytest.mark.parametrize("stream", [False, True])
def test_a_redirect_is_the_endpoint_s_failure_and_is_not_followed(
    system: dict[str, Any], stream: bool
) -> None:
    SINK_HITS.clear()
    reply = httpx.post(system["url"], json=ask("redirects", stream=stream), timeout=30)
    assert reply.status_code == 503, reply.text
    error = reply.json()["error"]
    assert error["code"] == "upstream_unavailable"
    assert "HTTP 307 (redirects are not followed)" in error["message"]
    assert SINK_HITS == []  # the prompt never left for the host the node named


@pytest.mark.parametrize(("pool", "what"), [("huge", "plain"), ("bomb", "gzip")])
def test_a_reply_larger_than_the_cap_is_a_502_and_recorded(
    system: dict[str, Any], pool: str, what: str
) -> None:
    reply = httpx.post(system["url"], json=ask(pool), timeout=30)
    assert reply.status_code == 502, what
    error = reply.json()["error"]
    assert error["code"] == "bad_upstream_reply"
    assert error["message"] == f"the serving node's reply is larger than {REPLY_CAP} bytes"
    assert [row[:2] for row in rows(system, pool)] == [("upstream_error", 502)]


def test_a_stream_that_ends_without_done_ends_with_an_error_event(system: dict[str, Any]) -> None:
    with httpx.stream("POST", system["url"], json=ask("no-done", stream=True), timeout=30) as r:
        assert r.status_code == 200
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert [json.loads(e)["choices"][0]["delta"]["content"] for e in events[:2]] == ["one", "two"]
    assert json.loads(events[-1])["error"]["code"] == "upstream_failed"
    assert "[DONE]" not in events
    # A stream that failed is billed once it has ended (no [DONE] waited for its record), so
    # its final row may come a moment after the client's last byte.
    until(lambda: [r[0] for r in rows(system, "no-done")] == ["upstream_error"],
          lambda: f"no-done's rows: {rows(system, 'no-done')}")  # fmt: skip
    ((_, status, _, completion, _),) = rows(system, "no-done")
    # Billed for what was relayed: a token a chunk, as a stream that says no usage.
    assert (status, completion) == (200, 2)


def test_a_stream_with_crlf_line_ends_is_relayed_and_billed(system: dict[str, Any]) -> None:
    request = ask("crlf", stream=True, stream_options={"include_usage": True})
    with httpx.stream("POST", system["url"], json=request, timeout=30) as r:
        assert r.status_code == 200
        body = r.read()
    assert b"\r" not in body and body.endswith(b"\n\ndata: [DONE]\n\n")
    first, usage, done = [e[6:] for e in body.split(b"\n\n") if e]
    assert json.loads(first)["choices"][0]["delta"]["content"] == "one"
    assert json.loads(usage)["usage"]["cost_usd"] == pytest.approx(3 * IN_USD + OUT_USD)
    assert rows(system, "crlf") == [("ok", 200, 3, 1, pytest.approx(3 * IN_USD + OUT_USD))]


def test_an_event_that_never_ends_ends_the_stream_with_an_error_event(
    system: dict[str, Any],
) -> None:
    """The node holds its connection open: only the bound on an event ends the stream."""
    with httpx.stream("POST", system["url"], json=ask("unending", stream=True), timeout=20) as r:
        assert r.status_code == 200
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert json.loads(events[0])["choices"][0]["delta"]["content"] == "one"
    assert json.loads(events[-1])["error"]["code"] == "upstream_failed"  # the relay's, for a node


def test_an_event_that_never_ends_before_a_token_is_a_502(system: dict[str, Any]) -> None:
    reply = httpx.post(system["url"], json=ask("unending-first", stream=True), timeout=20)
    assert reply.status_code == 502
    error = reply.json()["error"]
    assert error["code"] == "bad_upstream_reply" and "before the first token" in error["message"]


@pytest.mark.parametrize(
    ("pool", "prompt", "completion"),
    [
        # No usage at all: the prompt at the router's estimate (at least a token), the
        # output a token per 4 characters of its text.
        ("no-usage", 1, 100),
        # The prompt said, the output left out: the output estimated.
        ("half-usage", 7, 10),
    ],
)
def test_a_whole_reply_that_leaves_usage_out_is_billed_its_estimate(
    system: dict[str, Any], pool: str, prompt: int, completion: int
) -> None:
    reply = httpx.post(system["url"], json=ask(pool), timeout=30)
    assert reply.status_code == 200
    cost = prompt * IN_USD + completion * OUT_USD
    assert float(reply.headers["x-tiergate-cost-usd"]) == pytest.approx(cost)
    assert rows(system, pool) == [("ok", 200, prompt, completion, pytest.approx(cost))]


def test_a_stream_that_never_says_its_usage_is_billed_a_token_a_chunk_and_logged(
    system: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="tiergate"):
        reply = httpx.post(system["url"], json=ask("no-usage-stream", stream=True), timeout=30)
        assert reply.status_code == 200 and reply.text.endswith("data: [DONE]\n\n")
        until(lambda: len(rows(system, "no-usage-stream")) == 1, "no row for the stream")
    assert rows(system, "no-usage-stream") == [
        ("ok", 200, 1, 2, pytest.approx(IN_USD + 2 * OUT_USD))
    ]
    (line,) = [r.getMessage() for r in caplog.records if "usage_estimated" in r.getMessage()]
    assert "pool=no-usage-stream stream=true" in line and "completion_tokens=2" in line, line


@pytest.mark.parametrize("stream", [False, True])
def test_usage_past_what_the_request_could_produce_is_billed_at_its_most(
    system: dict[str, Any], stream: bool
) -> None:
    """A node that says 10^12 output tokens for a request capped at 20: billed 20."""
    pool = "absurd-stream" if stream else "absurd"
    request = ask(pool, max_tokens=20, stream=stream)
    if stream:
        request["stream_options"] = {"include_usage": True}
        with httpx.stream("POST", system["url"], json=request, timeout=30) as r:
            events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        said = json.loads(events[-2])["usage"]["cost_usd"]
    else:
        reply = httpx.post(system["url"], json=request, timeout=30)
        assert reply.status_code == 200
        said = reply.json()["usage"]["cost_usd"]
    cost = 3 * IN_USD + 20 * OUT_USD
    assert said == pytest.approx(cost)  # what the client is told it costs is what is billed
    assert rows(system, pool) == [("ok", 200, 3, 20, pytest.approx(cost))]


def test_a_node_s_refusal_that_is_no_openai_error_becomes_one(system: dict[str, Any]) -> None:
    reply = httpx.post(system["url"], json=ask("html-404"), timeout=30)
    assert reply.status_code == 404
    assert reply.json() == {"error": {
        "message": "the serving node refused the request (HTTP 404) without an OpenAI error",
        "type": "invalid_request_error", "code": None}}  # fmt: skip


@pytest.mark.parametrize("stream", [False, True])
def test_a_node_that_wants_a_key_is_the_endpoint_s_failure_not_the_client_s(
    system: dict[str, Any], stream: bool
) -> None:
    """The router sends a node no client's key: a 401 is the node refusing the router. The
    client is not told its own key was refused."""
    reply = httpx.post(system["url"], json=ask("wants-key", stream=stream), timeout=30)
    assert reply.status_code == 503
    error = reply.json()["error"]
    assert error["code"] == "upstream_unavailable" and "last: HTTP 401" in error["message"]


def test_sglang_s_refusal_reaches_the_client_in_an_openai_envelope(system: dict[str, Any]) -> None:
    reply = httpx.post(system["url"], json=ask("sglang-400"), timeout=30)
    assert reply.status_code == 400
    fields = {k: v for k, v in SGLANG_REFUSAL.items() if k != "object"}
    assert reply.json() == {"error": fields}
