"""The sim node's ASGI app: OpenAI-compatible completions, models, health and metrics.

Routes only wire things together: read and validate the body (`body`), plan the reply
(`generation`), submit it to the engine, and stream or collect it (`replies`). Every error
becomes the OpenAI envelope in one place (`errors.error_response`); nothing a client sends
produces a traceback or an unhandled 500, and no error closes a kept-alive connection behind a
whole reply (`internal_errors`).

Request headers the node understands: ``x-tiergate-fault`` (see `faults`; only when enabled) and
``x-tiergate-timing: 1`` (stream chunks carry ``tiergate: {"t": <engine time>}``, the
moment the engine released their tokens, in the node clock: `time.monotonic` by default).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator, Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..catalogs import Catalog
from ..engine.clock import Clock
from ..engine.errors import EngineError, EngineStoppedError
from .body import read_json_object, validate_body
from .config import NodeConfig
from .errors import ApiError, error_response, model_not_found
from .faults import FAULT_HEADER, MIDSTREAM_AFTER_TOKENS
from .generation import Outcome, PlanContext, pieces, plan_chat, plan_completion
from .internal_errors import InternalErrors
from .logs import log_event
from .metrics import CONTENT_TYPE
from .node import Node
from .replies import collect_reply, stream_events
from .schemas import ChatCompletionRequest, CompletionRequest, ModelCard, ModelList
from .streaming import EventStreamResponse

__all__ = ["NODE_HEADER", "TIMING_HEADER", "create_app", "running"]

NODE_HEADER = "x-tiergate-node"
TIMING_HEADER = "x-tiergate-timing"


def create_app(
    config: NodeConfig, *, clock: Clock | None = None, catalog: Catalog | None = None
) -> Starlette:
    """The app of one node; its lifespan starts and stops the engine.

    Raises CatalogError / PerfConfigError / EngineError for a configuration that cannot run.
    """
    node = Node(config, clock=clock, catalog=catalog)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await node.start()
        # Startup objects (catalogs, pydantic schemas, app) never die: freezing them keeps
        # full collections short, so they do not stall token release on a busy node.
        gc.collect()
        gc.freeze()
        log_event(
            "node_ready",
            node=config.node_name,
            model=node.model.name,
            chips=node.deployment.chips,
            max_num_seqs=config.serving.batching.max_num_seqs,
        )
        try:
            yield
        finally:
            await node.stop()
            log_event("node_stopped", node=config.node_name)

    routes = [
        Route("/v1/chat/completions", _chat_completions, methods=["POST"]),
        Route("/v1/completions", _completions, methods=["POST"]),
        Route("/v1/models", _models, methods=["GET"]),
        Route("/health", _health, methods=["GET"]),
        Route("/ready", _ready, methods=["GET"]),
        Route("/metrics", _metrics, methods=["GET"]),
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={HTTPException: _http_exception},
        middleware=[Middleware(InternalErrors)],
    )
    app.state.node = node
    return app


@contextlib.asynccontextmanager
async def running(app: Starlette) -> AsyncIterator[Node]:
    """Run `app`'s node outside a server (httpx.ASGITransport does not run lifespans)."""
    node: Node = app.state.node
    await node.start()
    try:
        yield node
    finally:
        await node.stop()


def _node(request: Request) -> Node:
    node: Node = request.app.state.node
    return node


def _headers(node: Node) -> dict[str, str]:
    return {NODE_HEADER: node.config.node_name}


async def _chat_completions(request: Request) -> Response:
    return await _generate(request, chat=True)


async def _completions(request: Request) -> Response:
    return await _generate(request, chat=False)


async def _generate(request: Request, *, chat: bool) -> Response:
    node = _node(request)
    try:
        return await _admit_and_reply(request, node, chat=chat)
    except ApiError as error:
        node.metrics.observe_error(error.status, error.code)
        log_event(
            "request_error",
            level=logging.WARNING,
            path=request.url.path,
            status=error.status,
            code=error.code,
            param=error.param,
        )
        return error_response(error, _headers(node))


async def _admit_and_reply(request: Request, node: Node, *, chat: bool) -> Response:
    if not node.ready:
        raise ApiError(503, "The node is not ready.", code="not_ready")
    data = await read_json_object(request, node.config.max_body_bytes)
    req: ChatCompletionRequest | CompletionRequest
    if chat:
        req = validate_body(ChatCompletionRequest, data)
    else:
        req = validate_body(CompletionRequest, data)
    if req.model not in node.names:
        raise model_not_found(req.model)
    fault = node.faults.decide(request.headers.get(FAULT_HEADER))
    if fault is not None and (not fault.midstream or not req.stream):
        raise fault.error()
    ctx = PlanContext(
        max_context_tokens=node.model.max_context_tokens,
        default_max_tokens=node.config.default_max_tokens,
        quality=node.model.quality,
        vocab_size=node.model.vocab_size,
        rng=node.request_rng(req.seed),
    )
    if isinstance(req, ChatCompletionRequest):
        plan = plan_chat(req, ctx)
    else:
        plan = plan_completion(req, ctx)
    outcome = Outcome(submitted_s=node.clock.now())
    try:
        stream = node.realtime.submit(plan.prompt_tokens, plan.output_tokens)
    except EngineError as exc:
        raise ApiError(
            400,
            f"Request cannot be served by this node: {exc}",
            code="exceeds_node_capacity",
            param="messages" if chat else "prompt",
        ) from None
    except EngineStoppedError as exc:
        raise ApiError(503, f"This node cannot serve: {exc}", code="engine_failed") from None
    source = pieces(plan, stream, outcome)

    def finish() -> None:
        stream.cancel()
        node.metrics.observe_request(
            prompt_tokens=plan.prompt_tokens,
            generated_tokens=outcome.generated_tokens,
            finish_reason=outcome.finish_reason,
            ttft_s=None
            if outcome.first_token_s is None
            else outcome.first_token_s - outcome.submitted_s,
            e2e_s=(outcome.last_token_s or node.clock.now()) - outcome.submitted_s,
            decode_s=(outcome.last_token_s or 0.0) - (outcome.first_token_s or 0.0),
        )
        log_event(
            "request",
            id=plan.request_id,
            model=plan.model,
            chat=chat,
            stream=req.stream,
            prompt_tokens=plan.prompt_tokens,
            completion_tokens=outcome.generated_tokens,
            finish_reason=outcome.finish_reason,
            tool_call=plan.tool_call is not None,
        )

    if not req.stream:
        watcher = asyncio.create_task(_cancel_on_disconnect(request, stream.cancel))
        try:
            reply = await collect_reply(plan, source, chat=chat)
        finally:
            watcher.cancel()
            finish()
        return JSONResponse(reply.model_dump(mode="json"), headers=_headers(node))
    midstream = fault is not None and fault.midstream
    events = stream_events(
        plan,
        source,
        chat=chat,
        include_usage=req.include_usage,
        continuous_usage=req.continuous_usage,
        timing=request.headers.get(TIMING_HEADER) == "1",
        abort_after_tokens=max(0, min(MIDSTREAM_AFTER_TOKENS, plan.output_tokens - 1))
        if midstream
        else None,
        abort=stream.cancel,
        abort_error=fault.error() if fault is not None else None,
    )
    return EventStreamResponse(
        events, headers=_headers(node), on_disconnect=stream.cancel, on_close=finish
    )


async def _cancel_on_disconnect(request: Request, cancel: Callable[[], None]) -> None:
    """Cancel a non-streaming request's generation if its client goes away (frees its KV)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    cancel()


async def _models(request: Request) -> Response:
    node = _node(request)
    cards = [
        ModelCard(
            id=name,
            created=node.started,
            root=node.model.name,
            max_model_len=node.model.max_context_tokens,
        )
        for name in node.names
    ]
    return JSONResponse(ModelList(data=cards).model_dump(mode="json"), headers=_headers(node))


async def _health(request: Request) -> Response:
    node = _node(request)
    if not node.healthy:
        return JSONResponse({"status": "failed"}, status_code=503, headers=_headers(node))
    return JSONResponse({"status": "ok"}, headers=_headers(node))


async def _ready(request: Request) -> Response:
    node = _node(request)
    ready = node.ready and node.healthy
    return JSONResponse({"ready": ready}, status_code=200 if ready else 503, headers=_headers(node))


async def _metrics(request: Request) -> Response:
    node = _node(request)
    return Response(node.metrics.render(), media_type=CONTENT_TYPE)


async def _http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    message = exc.detail if isinstance(exc.detail, str) else "HTTP error"
    return error_response(ApiError(exc.status_code, message, code=code), exc.headers)
