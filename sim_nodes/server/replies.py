"""OpenAI reply shapes built from generated pieces: SSE chunks, and whole responses.

Streams send one chunk per engine event (its tokens' text, released when the engine computed
them: several tokens when the node decodes speculatively); the last token's chunk carries the
finish reason, as vLLM's do. With ``stream_options.include_usage`` a final chunk with no
choices carries the usage; with ``continuous_usage_stats`` as well (vLLM's extension), every
chunk carries the usage so far, so a reader that stops early knows the prompt and the tokens
it was sent. A stream that ends badly (engine abort, injected midstream fault) sends an error
event and no ``[DONE]``.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing

from .errors import ApiError, error_body
from .generation import Piece, RequestPlan
from .schemas import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    Completion,
    CompletionChoice,
    CompletionChunk,
    Delta,
    FunctionCall,
    ReplyMessage,
    Timing,
    ToolCall,
    ToolCallDelta,
    Usage,
)
from .streaming import DONE, sse_data, sse_json

__all__ = ["ENGINE_ABORTED", "collect_reply", "stream_events"]

ENGINE_ABORTED = ApiError(
    503, "The node stopped before the reply was complete.", code="generation_aborted"
)


def _usage(plan: RequestPlan, completion_tokens: int) -> Usage:
    return Usage(
        prompt_tokens=plan.prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=plan.prompt_tokens + completion_tokens,
    )


async def stream_events(
    plan: RequestPlan,
    source: AsyncGenerator[Piece, None],
    *,
    chat: bool,
    include_usage: bool,
    timing: bool,
    continuous_usage: bool = False,
    abort_after_tokens: int | None = None,
    abort: Callable[[], None] | None = None,
    abort_error: ApiError | None = None,
) -> AsyncIterator[bytes]:
    """The SSE events of a streamed reply. `abort_after_tokens` injects a midstream failure."""
    sent = 0
    first = True
    middle = _MiddleChunk(plan, chat=chat, timing=timing)
    async with aclosing(source):
        if abort_after_tokens == 0:
            yield _fail(abort, abort_error)
            return
        async for piece in source:
            if piece.aborted:
                yield sse_json(error_body(ENGINE_ABORTED))
                return
            sent += piece.tokens
            if first or piece.finish_reason:
                usage = _usage(plan, sent) if continuous_usage else None
                yield _chunk(plan, piece, first=first, chat=chat, timing=timing, usage=usage)
                first = False
            elif piece.tokens:
                yield middle.render(piece, sent if continuous_usage else None)
            if abort_after_tokens is not None and sent >= abort_after_tokens:
                if piece.finish_reason is None:
                    yield _fail(abort, abort_error)
                    return
    if include_usage:
        yield _usage_chunk(plan, sent, chat=chat)
    yield DONE


async def collect_reply(
    plan: RequestPlan, source: AsyncGenerator[Piece, None], *, chat: bool
) -> ChatCompletion | Completion:
    """A whole (non-streaming) reply, once the last token is out."""
    texts: list[str] = []
    tokens = 0
    finish: str | None = None
    async with aclosing(source):
        async for piece in source:
            if piece.aborted:
                raise ENGINE_ABORTED
            texts.append(piece.text)
            tokens += piece.tokens
            finish = piece.finish_reason or finish
    text = "".join(texts)
    if not chat:
        return Completion(
            id=f"cmpl-{plan.request_id}",
            created=plan.created,
            model=plan.model,
            choices=[CompletionChoice(text=text, finish_reason=finish)],
            usage=_usage(plan, tokens),
        )
    if plan.tool_call is not None:
        call = ToolCall(
            id=plan.tool_call.call_id,
            function=FunctionCall(name=plan.tool_call.name, arguments=text),
        )
        message = ReplyMessage(content=None, tool_calls=[call])
    else:
        message = ReplyMessage(content=text)
    return ChatCompletion(
        id=f"chatcmpl-{plan.request_id}",
        created=plan.created,
        model=plan.model,
        choices=[ChatChoice(message=message, finish_reason=finish)],
        usage=_usage(plan, tokens),
    )


class _MiddleChunk:
    """Chunks between the first and the last differ only in their text (and time), so they
    are rendered from a template serialised once per stream from the schema models: the
    per-chunk pydantic work would otherwise dominate a busy node's release latency."""

    _PLACEHOLDER = "@@tiergate-chunk-text@@"  # ASCII: JSON-encodes the same everywhere

    def __init__(self, plan: RequestPlan, *, chat: bool, timing: bool) -> None:
        self._plan, self._chat, self._timing = plan, chat, timing
        probe = Piece(self._PLACEHOLDER, 1, 0.0, None)
        rendered = _chunk(plan, probe, first=False, chat=chat, timing=False)
        parts = rendered.split(json.dumps(self._PLACEHOLDER).encode())
        self._parts = (parts[0], parts[1]) if len(parts) == 2 else None
        self._end = b"}\n\n"

    def render(self, piece: Piece, sent_tokens: int | None = None) -> bytes:
        """The chunk of `piece`; with the usage so far when `sent_tokens` (this chunk's
        included) is given."""
        if self._parts is None:  # the placeholder also occurs elsewhere: no shortcut
            usage = None if sent_tokens is None else _usage(self._plan, sent_tokens)
            return _chunk(
                self._plan, piece, first=False, chat=self._chat, timing=self._timing, usage=usage
            )
        head, tail = self._parts
        text = json.dumps(piece.text).encode()
        if not self._timing and sent_tokens is None:
            return head + text + tail
        # The optional `usage` and `tiergate` fields are the chunk's last keys, in that order
        # (see schemas._Chunk); the usage written as the Usage model writes it.
        extra = b""
        if sent_tokens is not None:
            prompt = self._plan.prompt_tokens
            extra += b',"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}' % (
                prompt,
                sent_tokens,
                prompt + sent_tokens,
            )
        if self._timing:
            extra += b',"tiergate":{"t":%r,"w":%r}' % (piece.time_s, time.monotonic())
        return head + text + tail[: -len(self._end)] + extra + self._end


def _fail(abort: Callable[[], None] | None, error: ApiError | None) -> bytes:
    if abort is not None:
        abort()
    return sse_json(error_body(error or ENGINE_ABORTED))


def _chunk(
    plan: RequestPlan,
    piece: Piece,
    *,
    first: bool,
    chat: bool,
    timing: bool,
    usage: Usage | None = None,
) -> bytes:
    stamp = Timing(t=piece.time_s, w=time.monotonic()) if timing else None
    if not chat:
        choice = CompletionChoice(text=piece.text, finish_reason=piece.finish_reason)
        return sse_data(
            CompletionChunk(
                id=f"cmpl-{plan.request_id}",
                created=plan.created,
                model=plan.model,
                choices=[choice],
                usage=usage,
                tiergate=stamp,
            )
        )
    delta = Delta(role="assistant" if first else None)
    if plan.tool_call is not None:
        call = plan.tool_call
        delta.tool_calls = [
            ToolCallDelta(
                index=0,
                id=call.call_id if first else None,
                type="function" if first else None,
                function=FunctionCall(name=call.name if first else None, arguments=piece.text),
            )
        ]
    else:
        delta.content = piece.text
    return sse_data(
        ChatCompletionChunk(
            id=f"chatcmpl-{plan.request_id}",
            created=plan.created,
            model=plan.model,
            choices=[ChatChunkChoice(delta=delta, finish_reason=piece.finish_reason)],
            usage=usage,
            tiergate=stamp,
        )
    )


def _usage_chunk(plan: RequestPlan, tokens: int, *, chat: bool) -> bytes:
    if chat:
        return sse_data(
            ChatCompletionChunk(
                id=f"chatcmpl-{plan.request_id}",
                created=plan.created,
                model=plan.model,
                choices=[],
                usage=_usage(plan, tokens),
            )
        )
    return sse_data(
        CompletionChunk(
            id=f"cmpl-{plan.request_id}",
            created=plan.created,
            model=plan.model,
            choices=[],
            usage=_usage(plan, tokens),
        )
    )
