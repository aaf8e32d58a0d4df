"""Relaying an upstream reply to the client, whole or as a stream, and billing it.

`await settle()` (the handler's accounting: metrics, rate limits, the ledger, and the wait for
the ledger's commit) runs before the reply's end goes out: before a whole reply's body, and
before a stream's `data: [DONE]`. A client that has the whole reply therefore finds it in the
ledger even if the router is SIGKILLed the next moment. A stream's row is written at its first
token and amended every `BILL_INTERVAL_S` while it runs (`bill_so_far`), so a router killed
mid-stream has billed what it relayed up to then.

What a node's usage says is billed, within what the request could have cost: no more output
tokens than its cap (or the model's context) for each sequence, nor prompt tokens than the
context for each, so a node's absurd count cannot bill a tenant millions (`capped`, logged
as `event=usage_capped`). A whole reply that leaves a count out is billed the router's
estimate of it (`event=usage_estimated`), as a stream that says no usage is. A stream whose
body ends without its `data: [DONE]` failed mid-stream: it ends with an error event.

A stream's response starts only with its first token (`first_token`): a node that fails before
it (killed while the request waited or prefilled) has shown the client nothing, so the handler
gives the request to another endpoint; once a token is out, a failure ends the stream with an
error event.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from tiergate.router.base.asgi import Receive, Send, encode_headers, send_bytes
from tiergate.router.base.errors import RouterError
from tiergate.router.base.jsonbytes import dumps as json_bytes
from tiergate.router.base.jsonbytes import loads_reply
from tiergate.router.base.metrics import RelayMetrics
from tiergate.router.discovery.view import RoutedPool
from tiergate.router.request.body import CHARS_PER_TOKEN, CompletionRequest
from tiergate.router.request.progress import Progress
from tiergate.router.request.refusal import hosted_refusal, node_refusal
from tiergate.router.upstream.disconnect import DisconnectGuard
from tiergate.router.upstream.proxy import ReplyTooLarge, UpstreamError
from tiergate.router.upstream.reply import Reply
from tiergate.router.upstream.sse import DONE, StreamRewriter, usage_tokens

log = logging.getLogger("tiergate.router")

#: How often a stream's ledger row is brought up to date (from its first token on): a router
#: killed mid-stream has billed all it relayed but the last interval's tokens.
BILL_INTERVAL_S = 1.0


def bad_reply(message: str) -> RouterError:
    return RouterError(502, message, type="server_error", code="bad_upstream_reply")


def bill(
    done: Progress, pool: RoutedPool, reply: dict[str, Any], request: CompletionRequest
) -> None:
    """Count the reply's usage and cost into `done`, and add the cost to the reply. ValueError
    for usage counts that are not token counts (router/upstream/sse.py `usage_tokens`); a
    count left out is estimated, one past what the request could produce capped."""
    usage = reply.get("usage")
    said = usage if isinstance(usage, dict) else {}
    prompt, completion = usage_tokens(said)
    missing = [key for key in ("prompt_tokens", "completion_tokens") if said.get(key) is None]
    if "prompt_tokens" in missing:
        prompt = request.prompt_tokens_estimate
    if "completion_tokens" in missing:
        completion = _output_estimate(reply)
    if missing:
        log.warning("event=usage_estimated pool=%s missing=%s prompt_tokens=%d "
                    "completion_tokens=%d", pool.spec.name, ",".join(missing), prompt,
                    completion)  # fmt: skip
    done.prompt_tokens, done.completion_tokens = capped(pool, request, prompt, completion)
    done.cost_usd = pool.cost_usd(done.prompt_tokens, done.completion_tokens)
    if isinstance(usage, dict):
        usage["cost_usd"] = round(done.cost_usd, 10)


def capped(
    pool: RoutedPool, request: CompletionRequest, prompt: int, completion: int, say: bool = True
) -> tuple[int, int]:
    """A node's counts, each at most what the request could have used: for every sequence,
    the context in prompt tokens, and its output cap (else the context) in output tokens.
    Counts past that are a node's error: the request is billed its most, and (`say`) it is
    logged."""
    context = pool.max_context_tokens
    most_prompt = context * request.sequences
    most_completion = (request.max_tokens or context) * request.sequences
    if prompt <= most_prompt and completion <= most_completion:
        return prompt, completion
    if say:
        log.warning("event=usage_capped pool=%s prompt_tokens=%d completion_tokens=%d "
                    "most_prompt=%d most_completion=%d", pool.spec.name, prompt, completion,
                    most_prompt, most_completion)  # fmt: skip
    return min(prompt, most_prompt), min(completion, most_completion)


def _output_estimate(reply: dict[str, Any]) -> int:
    """The output tokens of a reply that does not say them: its text (and tool calls), a token
    per `CHARS_PER_TOKEN` characters, at least one per choice, as the prompt is estimated."""
    choices = reply.get("choices")
    if not isinstance(choices, list):
        return 0
    tokens = 0
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        message = choice.get("message")
        parts: list[Any] = [choice.get("text")]
        if isinstance(message, dict):
            parts += [message.get("content"), message.get("reasoning_content")]
            calls = message.get("tool_calls")
            for call in calls if isinstance(calls, list) else []:
                function = call.get("function") if isinstance(call, dict) else None
                if isinstance(function, dict):
                    parts += [function.get("name"), function.get("arguments")]
        chars = sum(len(part) for part in parts if isinstance(part, str))
        tokens += max(1, -(-chars // CHARS_PER_TOKEN))
    return tokens


async def relay_whole(
    send: Send,
    opened: Reply,
    pool: RoutedPool,
    headers: dict[str, str],
    done: Progress,
    *,
    service_tier: str,
    settle: Callable[[], Awaitable[None]],
    guard: DisconnectGuard,
    request: CompletionRequest,
    model: str | None = None,
) -> None:
    """Relay a whole reply; `service_tier` is the value its body's field gets
    (`tiers.openai_service_tier`), and `model` its model's (a hosted API's reply names the
    provider's model: the client is told the name it asked for)."""
    try:
        with guard.cancellable():  # a client that leaves ends the wait (and the node's work)
            body = await opened.read()
    except ReplyTooLarge as exc:
        log.warning("event=upstream_reply_too_large pool=%s endpoint=%s limit=%d",
                    pool.spec.name, opened.endpoint.url, exc.limit)  # fmt: skip
        raise bad_reply(f"the serving node's reply is {exc}") from None
    except UpstreamError as exc:
        raise bad_reply(f"the serving node's reply was cut short ({exc})") from None
    done.status = opened.status
    if opened.status != 200:
        # The node refused the request itself (4xx): its envelope goes back as it is, a hosted
        # API's told in the pool's names.
        hosted = opened.endpoint.hosted
        if hosted is not None and opened.status == 404:
            # The client names neither the provider's path nor its model: the pool's endpoint
            # (url, model) is likely wrong, which only the operator can mend.
            log.warning("event=provider_not_found pool=%s status=404 (check the pool's "
                        "endpoint url and model)", pool.spec.name)  # fmt: skip
        if hosted is not None and model is not None:
            body = hosted_refusal(body, opened.status, hosted.model, model)
        else:
            body = node_refusal(body, opened.status)
        done.outcome = "rejected"
        await settle()
        await send_bytes(send, opened.status, body, encode_headers(headers))
        return
    try:
        data, dumps = loads_reply(body)
        bill(done, pool, data, request)
        data["service_tier"] = service_tier
        if model is not None:
            data["model"] = model
        payload = dumps(data)
    except (ValueError, TypeError, AttributeError):
        raise bad_reply("the serving node returned a malformed reply") from None
    headers = {**headers, "x-tiergate-cost-usd": f"{done.cost_usd:.10f}"}
    done.outcome = "ok"
    await settle()
    await send_bytes(send, 200, payload, encode_headers(headers))


def tally(
    done: Progress,
    rewriter: StreamRewriter,
    pool: RoutedPool,
    request: CompletionRequest,
    *,
    final: bool = False,
) -> None:
    """The stream's tokens and cost so far, into `done`.

    The node's latest usage says them (on every chunk: the router asks for it), so a stream cut
    short (the client left, the node failed, the router is billing as it goes) is billed the
    prompt as the node counted it and every token of the chunks relayed. Chunks relayed after
    it count a token each, and a node that never says its usage is billed so: a token per
    content chunk, and, once a token came out (the node had read the whole prompt), the prompt
    at the router's estimate (`prompt_tokens_estimate`), logged (`event=usage_estimated`, at
    the `final` tally) as a whole reply's estimate is. Each within what the request could use
    (`capped`; logged once, at the `final` tally)."""
    if rewriter.counts is not None:  # checked (`usage_tokens`)
        prompt, completion = rewriter.counts
        completion += rewriter.chunks_since_usage
    else:
        completion = rewriter.content_chunks
        prompt = request.prompt_tokens_estimate if rewriter.content_chunks else 0
        if final and completion:
            log.warning("event=usage_estimated pool=%s stream=true missing=prompt_tokens,"
                        "completion_tokens prompt_tokens=%d completion_tokens=%d",
                        pool.spec.name, prompt, completion)  # fmt: skip
    done.prompt_tokens, done.completion_tokens = capped(pool, request, prompt, completion, final)
    done.cost_usd = pool.cost_usd(done.prompt_tokens, done.completion_tokens)


@dataclass(slots=True)
class FirstToken:
    """An upstream stream read up to its first token (or its end), nothing of it sent yet:
    until then the router may still give the request to another endpoint."""

    opened: Reply
    pool: RoutedPool
    rewriter: StreamRewriter
    chunks: AsyncIterator[bytes]  # the rest of the upstream body
    head: bytes  # the rewritten events read so far, sent right after the headers
    at_s: float  # when the first token came (the clock's time), or the stream ended


async def first_token(
    opened: Reply,
    pool: RoutedPool,
    request: CompletionRequest,
    *,
    service_tier: str,
    clock: Callable[[], float],
) -> FirstToken:
    """Read `opened`'s stream until its first token or its end. UpstreamError if it fails
    before either: the client has seen nothing, so the caller may try another endpoint.
    `service_tier` is what its chunks' field says (`tiers.openai_service_tier`)."""
    rewriter = StreamRewriter(
        service_tier,
        include_usage=request.include_usage,
        continuous_usage=request.continuous_usage,
        # The cost its usage chunks say is the billed one: within what the request could use.
        cost_of=lambda prompt, completion: pool.cost_usd(
            *capped(pool, request, prompt, completion, say=False)
        ),
        model=request.model if pool.spec.endpoint is not None else None,
        provider_model=hosted.model if (hosted := opened.endpoint.hosted) is not None else None,
        choices_per_prompt=request.choices_per_prompt if request.sequences > 1 else None,
    )
    chunks = opened.chunks()
    head: list[bytes] = []
    async for raw in chunks:
        head.append(rewriter.feed(raw))
        if rewriter.content_chunks or rewriter.error or rewriter.done:
            return FirstToken(opened, pool, rewriter, chunks, b"".join(head), clock())
    raise UpstreamError("the stream ended before its first token")


async def relay_stream(
    receive: Receive,
    send: Send,
    first: FirstToken,
    request: CompletionRequest,
    headers: dict[str, str],
    done: Progress,
    *,
    settle: Callable[[], Awaitable[None]],
    bill_so_far: Callable[[], None],
    clock: Callable[[], float],
    metrics: RelayMetrics,
    start_s: float,
) -> None:
    """Relay a stream from its first token on (`first_token`); `start_s` is when the router
    started asking upstream, which time to first token counts from. `bill_so_far` writes the
    stream's ledger row as `done` says: called once its first token is out, then every
    `BILL_INTERVAL_S` while tokens come."""
    pool, rewriter = first.pool, first.rewriter
    raw_headers = [
        (b"content-type", b"text/event-stream"),
        (b"cache-control", b"no-cache"),
        *encode_headers(headers),
    ]
    await send({"type": "http.response.start", "status": 200, "headers": raw_headers})
    done.status = 200
    client = _ClientWatch(receive)
    last_chunk_s = start_s
    billed_s: float | None = None  # when bill_so_far last ran
    settled = False
    if rewriter.content_chunks:
        done.ttft_s, last_chunk_s = first.at_s - start_s, first.at_s
    try:
        async for out in _rewritten(first):
            if not out:
                continue
            now = clock()
            if done.ttft_s is None and rewriter.content_chunks:
                done.ttft_s = now - start_s
            last_chunk_s = now
            if rewriter.done and not settled:
                settled = True
                out = await _settle_before_done(send, out, done, first, request, settle)
                if not out:
                    continue
            await send({"type": "http.response.body", "body": out, "more_body": True})
            if rewriter.content_chunks and not settled:
                if billed_s is None or now - billed_s >= BILL_INTERVAL_S:
                    tally(done, rewriter, pool, request)
                    bill_so_far()
                    billed_s = now
        if not (rewriter.done or rewriter.error):  # the body ended; the stream said no end
            raise UpstreamError("the stream ended without data: [DONE]")
        done.outcome = "error" if rewriter.error else "ok"
    except asyncio.CancelledError:
        if not client.left():  # the router stops (past its grace period): billed as it stands
            tally(done, rewriter, pool, request, final=True)
            raise
        done.outcome, done.status = "client_disconnect", 499
    except (UpstreamError, OSError) as exc:
        done.outcome = "upstream_error"
        await _failed_midstream(send, first, exc, metrics, client_gone=client.gone)
    except RouterError as exc:  # `settle` could keep its record nowhere: no [DONE] goes out
        if not client.gone:
            event = b"data: " + json_bytes(exc.envelope()) + b"\n\n"
            await send({"type": "http.response.body", "body": event, "more_body": True})
    finally:
        client.stop()
    tally(done, rewriter, pool, request, final=True)
    _observe_tpot(metrics, pool.spec.tier, done, last_chunk_s - start_s)
    if not client.gone:
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _rewritten(first: FirstToken) -> AsyncIterator[bytes]:
    """The stream from its first token on, as the client is to get it."""
    if first.head:
        yield first.head
    async for raw in first.chunks:
        yield first.rewriter.feed(raw)


def _observe_tpot(metrics: RelayMetrics, tier: str, done: Progress, last_s: float) -> None:
    """Time per output token after the first, from the first token to the last (`last_s`
    after the router started asking upstream)."""
    if done.ttft_s is not None and done.completion_tokens > 1:
        tpot = (last_s - done.ttft_s) / (done.completion_tokens - 1)
        metrics.tpot.labels(tier).observe(max(tpot, 0.0))


async def _settle_before_done(
    send: Send,
    out: bytes,
    done: Progress,
    first: FirstToken,
    request: CompletionRequest,
    settle: Callable[[], Awaitable[None]],
) -> bytes:
    """The stream's end came in `out`: send what precedes `data: [DONE]`, bill the stream and
    wait for its record (`settle`), and return `[DONE]` and what follows, to send next."""
    head, end, tail = out.partition(DONE)
    if head:
        await send({"type": "http.response.body", "body": head, "more_body": True})
    tally(done, first.rewriter, first.pool, request)
    done.outcome = "error" if first.rewriter.error else "ok"
    await settle()
    return end + tail


async def _failed_midstream(
    send: Send, first: FirstToken, exc: BaseException, metrics: RelayMetrics, *, client_gone: bool
) -> None:
    """The node failed after the stream began: count and log it, and end the client's stream
    with an error event (the status line is long gone)."""
    pool = first.pool
    metrics.midstream_errors.labels(pool.spec.tier).inc()
    log.warning("event=midstream_error pool=%s endpoint=%s error=%s",
                pool.spec.name, first.opened.endpoint.url, type(exc).__name__)  # fmt: skip
    if not client_gone:
        error = RouterError(502, "the serving node failed mid-stream",
                            type="server_error", code="upstream_failed")  # fmt: skip
        event = b"data: " + json_bytes(error.envelope()) + b"\n\n"
        await send({"type": "http.response.body", "body": event, "more_body": True})


class _ClientWatch:
    """A stream's client, watched while the stream is relayed: its disconnect cancels the
    relaying task (which stops reading upstream; closing that cancels the node's work)."""

    def __init__(self, receive: Receive) -> None:
        self.gone = False
        self._relay = asyncio.current_task()
        self._task = asyncio.create_task(self._watch(receive))

    async def _watch(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.gone = True
        if self._relay is not None:
            self._relay.cancel()

    def left(self) -> bool:
        """Whether a cancellation of the relay was this watch's doing (then undone here)."""
        if not self.gone:
            return False
        if self._relay is not None:
            self._relay.uncancel()
        return True

    def stop(self) -> None:
        self._task.cancel()
