"""From a validated request to what the node will generate: the `RequestPlan`.

Planning counts the prompt, settles the number of output tokens (the client's cap, or
``min(default, context left)``), rejects prompts that do not fit the model's context, and
decides the reply: filler text, or a tool call whose arguments the stream delivers one
tokenizer piece per token. `pieces` then turns the engine's token events into text.

Output length: the node always generates exactly the planned number of tokens. The finish
reason is ``length`` when the client set the cap (it was hit), ``stop`` when the default
was used, ``tool_calls`` for a complete tool call and ``length`` for one cut by the cap.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

from ..engine.realtime import RequestStream
from .errors import bad_request, context_length_exceeded
from .schemas import ChatCompletionRequest, CompletionRequest
from .tokenizer import FillerText, count_chat_tokens, count_tokens, split_tokens
from .tool_calls import PlannedToolCall, plan_tool_call

__all__ = [
    "Outcome",
    "Piece",
    "PlanContext",
    "RequestPlan",
    "pieces",
    "plan_chat",
    "plan_completion",
]


@dataclass(frozen=True, slots=True)
class PlanContext:
    """What planning needs to know about the node, plus this request's random stream."""

    max_context_tokens: int
    default_max_tokens: int
    quality: float
    rng: random.Random
    #: Token ids run from 0 to vocab_size - 1 (a token-id prompt is checked against it).
    vocab_size: int


@dataclass(slots=True)
class RequestPlan:
    """What one request will produce."""

    model: str
    prompt_tokens: int
    output_tokens: int
    capped: bool
    filler: FillerText
    tool_call: PlannedToolCall | None = None
    tool_pieces: list[str] = field(default_factory=list)
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))
    _next_piece: int = 0

    @property
    def finish_reason(self) -> str:
        """The OpenAI finish reason once all planned tokens are out."""
        if self.tool_call is not None:
            return "length" if self.tool_call_truncated else "tool_calls"
        return "length" if self.capped else "stop"

    @property
    def tool_call_truncated(self) -> bool:
        return self.tool_call is not None and "".join(self.tool_pieces) != self.tool_call.arguments

    def take(self, tokens: int) -> str:
        """Text (or tool-call argument text) of the next `tokens` tokens."""
        if self.tool_call is None:
            return self.filler.take(tokens)
        start, self._next_piece = self._next_piece, self._next_piece + tokens
        return "".join(self.tool_pieces[start : self._next_piece])


@dataclass(frozen=True, slots=True)
class Piece:
    """Text released by one engine event; `finish_reason` set on the last one."""

    text: str
    tokens: int
    time_s: float
    finish_reason: str | None
    aborted: bool = False


def plan_chat(request: ChatCompletionRequest, ctx: PlanContext) -> RequestPlan:
    """The plan of a chat completion (raises ApiError for requests that cannot be served)."""
    prompt_tokens = count_chat_tokens((m.name, m.text_pieces()) for m in request.messages)
    tool = _chosen_tool(request)
    if request.tools:
        prompt_tokens += sum(count_tokens(t.model_dump_json()) for t in request.tools)
    max_tokens, capped = _output_budget(prompt_tokens, request.requested_max_tokens, ctx)
    plan = RequestPlan(request.model, prompt_tokens, max_tokens, capped, FillerText(ctx.rng))
    if tool is not None:
        call = plan_tool_call(tool[0], tool[1], ctx.quality, ctx.rng)
        all_pieces = split_tokens(call.arguments)
        plan.tool_call = call
        plan.tool_pieces = all_pieces[:max_tokens]
        plan.output_tokens = max(len(plan.tool_pieces), 1)
    return plan


def plan_completion(request: CompletionRequest, ctx: PlanContext) -> RequestPlan:
    """The plan of a text completion."""
    prompt = request.prompt
    if isinstance(prompt, list):
        if len(prompt) == 0:
            raise bad_request("'prompt' must not be empty.", param="prompt")
        if isinstance(prompt[0], str | list):
            if len(prompt) != 1:
                raise bad_request("Only one prompt per request is supported.", param="prompt")
            prompt = prompt[0]
    if isinstance(prompt, str):
        prompt_tokens = count_tokens(prompt)
    else:
        prompt_tokens = len(prompt)
        outside = next((t for t in prompt if not 0 <= t < ctx.vocab_size), None)
        if outside is not None:  # as vLLM refuses it
            raise bad_request(
                f"Token id {outside} is out of vocabulary (0 to {ctx.vocab_size - 1}).",
                param="prompt",
            )
    if prompt_tokens == 0:
        raise bad_request("'prompt' must not be empty.", param="prompt")
    max_tokens, capped = _output_budget(prompt_tokens, request.requested_max_tokens, ctx)
    return RequestPlan(request.model, prompt_tokens, max_tokens, capped, FillerText(ctx.rng))


@dataclass(slots=True)
class Outcome:
    """How a request went, filled in as its events arrive (read for metrics at the end)."""

    submitted_s: float
    generated_tokens: int = 0
    first_token_s: float | None = None
    last_token_s: float | None = None
    finish_reason: str = "abort"


async def pieces(
    plan: RequestPlan, stream: RequestStream, outcome: Outcome
) -> AsyncGenerator[Piece, None]:
    """The engine's token events as text, in release order; `outcome` tracks progress."""
    async for event in stream:
        text = plan.take(event.tokens) if event.tokens else ""
        if event.tokens:
            outcome.generated_tokens += event.tokens
            outcome.last_token_s = event.time_s
            if outcome.first_token_s is None:
                outcome.first_token_s = event.time_s
        finish = None
        aborted = False
        if event.finished:
            aborted = event.finish_reason == "abort"
            finish = "abort" if aborted else plan.finish_reason
            outcome.finish_reason = finish
        yield Piece(text, event.tokens, event.time_s, finish, aborted)


def _chosen_tool(request: ChatCompletionRequest) -> tuple[str, dict[str, object] | None] | None:
    """(name, JSON schema) of the tool the reply calls, or None for a text reply."""
    choice = request.tool_choice
    if request.tools is not None and len(request.tools) == 0:
        raise bad_request("'tools' must not be empty.", param="tools")
    if not request.tools:
        if choice not in (None, "none", "auto"):
            raise bad_request("'tool_choice' is set but no 'tools' are given.", param="tool_choice")
        return None
    if choice == "none":
        return None
    tools = {t.function.name: t.function.parameters for t in request.tools}
    if isinstance(choice, str) or choice is None:
        first = request.tools[0].function
        return first.name, first.parameters
    name = choice.function.name
    if name not in tools:
        raise bad_request(f"Tool '{name}' in 'tool_choice' is not in 'tools'.", param="tool_choice")
    return name, tools[name]


def _output_budget(prompt_tokens: int, requested: int | None, ctx: PlanContext) -> tuple[int, bool]:
    """(tokens to generate, whether the client set them)."""
    left = ctx.max_context_tokens - prompt_tokens
    if requested is None:
        if left < 1:
            raise context_length_exceeded(ctx.max_context_tokens, prompt_tokens, 1)
        return min(ctx.default_max_tokens, left), False
    if requested > left:
        raise context_length_exceeded(ctx.max_context_tokens, prompt_tokens, requested)
    return requested, True
