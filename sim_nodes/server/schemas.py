"""Request and response bodies of the OpenAI-compatible API (the subset the node serves).

Requests are validated strictly (a string where a number belongs is an error, not coerced),
and unknown fields are ignored, as OpenAI does. Responses serialise to OpenAI's shapes; the
optional `tiergate` field of stream chunks (the engine's release time of those tokens) only
appears when a client asks for timing.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from tiergate.common.nesting import JsonObject

__all__ = [
    "ChatChoice",
    "ChatChunkChoice",
    "ChatCompletion",
    "ChatCompletionChunk",
    "ChatCompletionRequest",
    "ChatMessage",
    "Completion",
    "CompletionChoice",
    "CompletionChunk",
    "CompletionRequest",
    "Delta",
    "FunctionCall",
    "ModelCard",
    "ModelList",
    "NamedToolChoice",
    "ReplyMessage",
    "ResponseFormat",
    "StreamOptions",
    "Timing",
    "Tool",
    "ToolCall",
    "ToolCallDelta",
    "Usage",
]


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)


class _Response(BaseModel):
    model_config = ConfigDict(extra="forbid")


# -- requests --------------------------------------------------------------------------------


class ContentPart(_Request):
    """One part of multi-part message content; only `text` parts carry tokens here."""

    type: str
    text: str | None = None


class ChatMessage(_Request):
    """One message of a chat prompt."""

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[JsonObject] | None = None
    tool_call_id: str | None = None

    def text_pieces(self) -> list[str]:
        """The texts whose tokens this message's content (and earlier tool calls) costs."""
        pieces: list[str] = []
        if isinstance(self.content, str):
            pieces.append(self.content)
        elif self.content is not None:
            pieces.extend(p.text for p in self.content if p.text is not None)
        for call in self.tool_calls or ():
            function = call.get("function")
            if isinstance(function, dict):
                pieces.extend(str(v) for v in function.values())
        return pieces


class FunctionDefinition(_Request):
    name: str = Field(min_length=1, max_length=256)
    description: str | None = None
    parameters: JsonObject | None = None


class Tool(_Request):
    """A function the model may call (its `parameters` are a JSON schema)."""

    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(_Request):
    name: str = Field(min_length=1)


class NamedToolChoice(_Request):
    """`tool_choice` naming one tool."""

    type: Literal["function"]
    function: FunctionName


class StreamOptions(_Request):
    """What a stream reports beside its tokens: with `include_usage`, a last chunk with the
    usage; with `continuous_usage_stats` too (vLLM's extension), every chunk carries the
    usage so far (the prompt, and the tokens generated up to and including that chunk)."""

    include_usage: bool = False
    continuous_usage_stats: bool = False


class _Generation(_Request):
    """Fields both endpoints share."""

    model: str = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    seed: int | None = None
    n: int = Field(default=1, ge=1, le=1, description="Only one choice per request.")
    # Sampling, checked as vLLM checks it (a node samples nothing, but a client's mistake is
    # a 400 here as it is from a real engine).
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    stop: str | list[str] | None = None
    logit_bias: dict[str, Annotated[float, Field(ge=-100, le=100)]] | None = None
    user: str | None = None

    @field_validator("stream_options")
    @classmethod
    def _only_when_streaming(
        cls, options: StreamOptions | None, info: ValidationInfo
    ) -> StreamOptions | None:
        # vLLM refuses them on a whole reply; a client (or router) that sends them gets a 400.
        if options is not None and not info.data.get("stream", False):
            raise ValueError("stream options can only be defined when `stream=True`")
        return options

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        """Usage on every chunk: asked for, and only with `include_usage` (as vLLM has it)."""
        options = self.stream_options
        return options is not None and options.include_usage and options.continuous_usage_stats


class ResponseFormat(_Request):
    """`response_format`: plain text, any JSON object, or JSON matching `json_schema`."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonObject | None = None

    @model_validator(mode="after")
    def _schema_for_its_type(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("a response_format of type json_schema needs `json_schema`")
        return self


class ChatCompletionRequest(_Generation):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    response_format: ResponseFormat | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)

    @property
    def requested_max_tokens(self) -> int | None:
        """`max_completion_tokens` wins over the older `max_tokens`."""
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_Generation):
    """POST /v1/completions: one prompt (text or token ids)."""

    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool | None = False
    suffix: str | None = None
    best_of: int | None = Field(default=None, ge=1, le=1, description="One choice per request.")

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_tokens


# -- responses -------------------------------------------------------------------------------


class Usage(_Response):
    """Token counts of a reply."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class FunctionCall(_Response):
    name: str | None = None
    arguments: str

    @model_serializer(mode="wrap")
    def _drop_none(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _without_none(handler(self))


class ToolCall(_Response):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ToolCallDelta(_Response):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCall

    @model_serializer(mode="wrap")
    def _drop_none(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _without_none(handler(self))


class ReplyMessage(_Response):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] | None = None

    @model_serializer(mode="wrap")
    def _drop_none(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if data.get("tool_calls") is None:
            data.pop("tool_calls", None)
        return data


class ChatChoice(_Response):
    index: int = 0
    message: ReplyMessage
    finish_reason: str | None
    logprobs: None = None


class ChatCompletion(_Response):
    """A whole chat reply."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class Delta(_Response):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None

    @model_serializer(mode="wrap")
    def _drop_none(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _without_none(handler(self))


class Timing(_Response):
    """When a chunk's tokens were due and when the node wrote them (benchmarks only).

    t: engine time of the release (the node's clock); w: `time.monotonic()` as the chunk was
    rendered for sending. With the real clock both are CLOCK_MONOTONIC, so w - t is the node's
    own lateness and a client on the same machine can compare its receipt time with t.
    """

    t: float
    w: float


class ChatChunkChoice(_Response):
    index: int = 0
    delta: Delta
    finish_reason: str | None = None
    logprobs: None = None


class _Chunk(_Response):
    usage: Usage | None = None
    tiergate: Timing | None = None

    @model_serializer(mode="wrap")
    def _drop_optional(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        for key in ("usage", "tiergate"):  # last, and only when set
            value = data.pop(key, None)
            if value is not None:
                data[key] = value
        return data


class ChatCompletionChunk(_Chunk):
    """One SSE chunk of a streamed chat reply."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]


class CompletionChoice(_Response):
    index: int = 0
    text: str
    finish_reason: str | None = None
    logprobs: None = None


class Completion(_Response):
    """A whole text completion."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class CompletionChunk(_Chunk):
    """One SSE chunk of a streamed text completion."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]


class ModelCard(_Response):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "tiergate"
    root: str
    max_model_len: int


class ModelList(_Response):
    """GET /v1/models."""

    object: Literal["list"] = "list"
    data: list[ModelCard]


def _without_none(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if v is not None}
