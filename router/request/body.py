"""Parsing and checking a completion request before it is routed.

The router checks what it needs to route and bill (the model, the stream flag, token limits,
that the body is a JSON object with messages or a prompt). Everything else is the serving
node's to validate; unknown fields are passed through, as OpenAI ignores them.

Bodies are read with orjson, faster than the standard library's json
(router/base/jsonbytes.py). It is strict where JSON (RFC 8259) is: `NaN`, `Infinity` and an
unpaired surrogate escape are refused with a 400, which Python's `json` would let through (a
UTF-8 byte-order mark is dropped, as `json.loads(bytes)` skips it). Integers beyond 64 bits are
read as floats. The node receives the client's own bytes, with `stream_options` appended to a
stream's: the router asks for the usage on every chunk (vLLM's `continuous_usage_stats`), so a
stream cut short is billed the tokens the node counted; only a body the router must rewrite (a
stream that set its own `stream_options`, a cascade's second model) is written anew, such
integers as floats.

The router decides a request's output cap, and the node is sent exactly that: when a body
spells the cap twice (`max_completion_tokens` and `max_tokens`) or in a spelling the endpoint
does not read (`max_completion_tokens` on `/v1/completions`), it is rewritten so that every
spelling the node may read says the cap (`max_completion_tokens` wins, as in OpenAI's API).
What a budget holds is then bounded by what the node can produce (`CompletionRequest`'s
`prompt_tokens_most`, `max_tokens` or the model's context, and `sequences`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final

import orjson

from tiergate.common.nesting import MAX_BODY_NESTING, body_shape_problem
from tiergate.router.base.errors import RouterError
from tiergate.router.base.jsonbytes import dumps

TOO_DEEP = f"the request body nests arrays or objects more than {MAX_BODY_NESTING} levels deep"

#: A rough prompt size before the node counts it: ~4 characters per token, as for English.
CHARS_PER_TOKEN = 4
#: Output assumed when a request sets no cap, for rate limits and latency predictions (budgets
#: hold what the node may really produce: the rest of the model's context).
DEFAULT_MAX_TOKENS = 256
#: Prompt tokens a chat template may add beyond the body's bytes (system preamble, tool
#: instructions): every other token is at least one byte of the body.
TEMPLATE_TOKENS = 256
#: Prompt tokens an image or audio part is taken for before the node counts it: vision models
#: take a 1024x1024 image as 576 (LLaVA) to about 1,300 (Qwen2-VL) tokens.
MEDIA_TOKENS = 1000
#: The most prompt tokens a media part may be counted as, for the budget's hold: an image in
#: Qwen2-VL at its default largest size (12.8 megapixels) is 16,384 tokens, and a part is a
#: URL of a few bytes. A video part is taken for the whole context.
MEDIA_TOKENS_MOST = 16_384
#: The most sequences one request may ask for of each prompt (`n`, `best_of`).
MAX_SEQUENCES = 128
UTF8_BOM = b"\xef\xbb\xbf"
#: How much of the prompt the prefix-affinity hash looks at.
PREFIX_CHARS = 2048
#: The largest `max_tokens` accepted: far beyond any model's context (the node refuses what its
#: model cannot do), and small enough for the router's limits and predictions to compute with.
MAX_TOKENS_LIMIT = 2**31 - 1
#: The output cap's spellings, in the order of precedence.
CAP_FIELDS = ("max_completion_tokens", "max_tokens")


@dataclass(slots=True)
class CompletionRequest:
    """A validated completion request."""

    body: dict[str, Any]
    chat: bool
    model: str
    stream: bool
    include_usage: bool  # what the client asked for; the router always asks upstream
    max_tokens: int | None  # the output cap sent to the node; None: the node's (its context)
    prompt_tokens_estimate: int
    prefix_text: str  # the start of the prompt, for prefix affinity (never logged)
    slo: tuple[float | None, float | None] | None = None  # (TTFT s, TPOT s) the client asks for
    raw: bytes | None = None  # the client's bytes, forwarded as they are while `body` is unchanged
    #: Sequences generated: `n` (or `best_of`) for each prompt of a batch.
    sequences: int = 1
    #: Prompts: more than one in a completions batch, each up to the model's context.
    prompts: int = 1
    #: The choices each prompt gets (`n`): a stream's choice `i` is of prompt `i // n`.
    choices_per_prompt: int = 1
    #: The most prompt tokens the node may count: a token is at least one byte of the body.
    prompt_tokens_most: int = 0
    #: The client asked for the usage on every chunk too (`continuous_usage_stats`, which
    #: counts only with `include_usage`, as in vLLM); the router always asks upstream.
    continuous_usage: bool = False
    #: The URLs of its media parts that are not inline (`data:`): what a node would fetch.
    #: Each with where it is in the body (`messages[0].content[1]`).
    media_urls: tuple[tuple[str, str], ...] = ()
    #: The longest of its prompts (a completions batch has several), estimated as the rest.
    longest_prompt_tokens: int = 1

    @property
    def context_needed(self) -> int:
        """The context a sequence of it needs of its engine: its longest prompt (estimated)
        and its output cap, else a token (vLLM refuses prompt + max_tokens > max_model_len)."""
        return self.longest_prompt_tokens + (self.max_tokens or 1)

    @property
    def output_tokens_expected(self) -> int:
        """Output tokens expected of one sequence, for latency predictions and (times
        `sequences`) rate limits; budgets hold what the node may produce instead."""
        return self.max_tokens or DEFAULT_MAX_TOKENS

    @property
    def tokens_expected(self) -> int:
        """The whole request's tokens as the rate limiter estimates them before the reply."""
        return self.prompt_tokens_estimate + self.output_tokens_expected * self.sequences


SLO_TTFT_HEADER = "x-slo-ttft-ms"
#: SLO headers are below this many milliseconds (a figure the router can compute with).
MAX_SLO_MS = 1e9
SLO_TPOT_HEADER = "x-slo-tpot-ms"


def parse_slo(headers: dict[str, str]) -> tuple[float | None, float | None] | None:
    """The per-request SLO headers, in seconds; None when neither is set."""
    values: list[float | None] = []
    for name in (SLO_TTFT_HEADER, SLO_TPOT_HEADER):
        text = headers.get(name)
        if text is None:
            values.append(None)
            continue
        try:
            ms = float(text)
        except ValueError:
            ms = -1.0
        if not (ms > 0 and ms < MAX_SLO_MS):
            raise _bad(f"`{name}` must be a positive number of milliseconds", param=name)
        values.append(ms / 1000.0)
    return None if values == [None, None] else (values[0], values[1])


def parse_completion(raw: bytes, *, chat: bool) -> CompletionRequest:
    if raw.startswith(UTF8_BOM):
        raw = raw[3:]  # the node is sent the body without it (Python's json.loads(str) refuses it)
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if exc.msg.startswith("str is not valid UTF-8"):
            raise _bad("the request body is not valid UTF-8") from None
        if exc.msg.startswith("depth limit"):
            raise _bad(TOO_DEEP) from None
        raise _bad(f"the request body is not valid JSON ({exc.msg} at {exc.pos})") from None
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object")
    problem = body_shape_problem(raw, body)
    if problem is not None:  # the node refuses it too: its refusal would mislead
        raise _bad(f"the request body {problem}")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("`model` is required and must be a string", param="model")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _bad("`stream` must be a boolean", param="stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise _bad("`stream_options` must be an object", param="stream_options")
    include_usage = options.get("include_usage") if options else None
    continuous = options.get("continuous_usage_stats") if options else None
    for key, value in (("include_usage", include_usage), ("continuous_usage_stats", continuous)):
        if value is not None and not isinstance(value, bool):
            raise _bad(f"`stream_options.{key}` must be a boolean", param="stream_options")
    max_tokens, capped = _output_cap(body, chat)
    text, tokens, prompts, longest = _prompt(body, chat)
    choices, generated = _per_prompt(body)
    parts = _media_parts(body) if chat else ()
    media = tuple(kind for kind, _, _ in parts)
    return CompletionRequest(
        body=body if capped is None else capped,
        chat=chat,
        model=model,
        stream=stream,
        include_usage=include_usage is True,
        max_tokens=max_tokens,
        prompt_tokens_estimate=max(1, tokens + MEDIA_TOKENS * len(media)),
        longest_prompt_tokens=max(1, longest + MEDIA_TOKENS * len(media)),
        prefix_text=text[:PREFIX_CHARS],
        raw=raw if capped is None else None,
        sequences=generated * prompts,
        prompts=prompts,
        choices_per_prompt=choices,
        prompt_tokens_most=(
            len(raw) + TEMPLATE_TOKENS + MEDIA_TOKENS_MOST * len(media)
            if "video" not in media
            else MAX_TOKENS_LIMIT
        ),
        continuous_usage=include_usage is True and continuous is True,
        media_urls=tuple((where, url) for _, where, url in parts if url is not None),
    )


#: What the router asks of every stream: the usage on every chunk (the tokens it carries, the
#: prompt as the node counted it) and at the end.
UPSTREAM_STREAM_OPTIONS: Final = MappingProxyType(
    {"include_usage": True, "continuous_usage_stats": True}
)
_STREAM_OPTIONS_FIELD = b',"stream_options":' + dumps(dict(UPSTREAM_STREAM_OPTIONS)) + b"}"


def upstream_body(request: CompletionRequest) -> bytes:
    """The body sent upstream: the client's, asking for the usage on every chunk of a stream
    (`UPSTREAM_STREAM_OPTIONS`, for billing).

    The client's own bytes go through untouched when nothing needs changing: re-encoding a
    long prompt on every request is work the request path does not need.
    """
    body = request.body
    needs_usage = request.stream and not request.continuous_usage
    if request.raw is not None and not needs_usage:
        return request.raw
    if needs_usage:
        if request.raw is not None and "stream_options" not in body:
            # Appended to the client's bytes (no key is repeated): nothing else is rewritten.
            head = request.raw.rstrip(b" \t\r\n")
            return head[:-1] + _STREAM_OPTIONS_FIELD
        body = {
            **body,
            "stream_options": {**(body.get("stream_options") or {}), **UPSTREAM_STREAM_OPTIONS},
        }
    try:
        return dumps(body)
    except ValueError:  # orjson read it (1,024 levels); neither orjson nor json writes it
        raise _bad(TOO_DEEP) from None


#: What the router asks of a hosted API's stream: the usage at its end, the one stream option
#: OpenAI's API defines (a strict provider refuses vLLM's `continuous_usage_stats`). A hosted
#: stream cut short is therefore billed by the router's count of what it relayed.
HOSTED_STREAM_OPTIONS: Final = MappingProxyType({"include_usage": True})
#: Fields of the client's body a hosted API is never sent: what the provider bills or keeps on
#: the operator's account. `service_tier: priority` is billed at the provider's priority
#: price while the router bills the tier it served; `store` keeps the tenant's prompts and
#: replies in the operator's account, with `metadata` to find them by.
HOSTED_WITHHELD: Final = frozenset({"service_tier", "store", "metadata"})


def hosted_body(
    request: CompletionRequest, model: str, cap_field: str = "max_completion_tokens"
) -> bytes:
    """The body sent to a hosted API: the client's but for `HOSTED_WITHHELD`, naming the
    provider's `model`, a chat request's output cap in `cap_field` alone (a node reads both
    spellings; OpenAI's reasoning models refuse `max_tokens`, some providers read only it),
    and for a stream asking for its usage (`HOSTED_STREAM_OPTIONS`, nothing else)."""
    body = {k: v for k, v in request.body.items() if k not in HOSTED_WITHHELD}
    body["model"] = model
    if request.chat:
        for field in CAP_FIELDS:
            body.pop(field, None)
        if request.max_tokens is not None:
            body[cap_field] = request.max_tokens
    if request.stream:
        body["stream_options"] = dict(HOSTED_STREAM_OPTIONS)
    try:
        return dumps(body)
    except ValueError:
        raise _bad(TOO_DEEP) from None


def cap_output(request: CompletionRequest, cap: int) -> None:
    """Set `request`'s output cap to `cap` tokens, in every spelling its endpoint reads (the
    body is re-encoded upstream)."""
    said = (
        {"max_tokens": cap, "max_completion_tokens": cap} if request.chat else {"max_tokens": cap}
    )
    request.body = {**{k: v for k, v in request.body.items() if k not in CAP_FIELDS}, **said}
    request.raw = None
    request.max_tokens = cap


def _output_cap(body: dict[str, Any], chat: bool) -> tuple[int | None, dict[str, Any] | None]:
    """The request's output cap, and the body rewritten to say it in every spelling the node
    may read (None when the body already does)."""
    given = {key: _token_count(body, key) for key in CAP_FIELDS if body.get(key) is not None}
    if not given:
        return None, None
    cap = given.get("max_completion_tokens", given.get("max_tokens"))
    assert cap is not None
    # Chat endpoints read either spelling (max_completion_tokens first); completions read
    # max_tokens only.
    said = {"max_tokens": cap, "max_completion_tokens": cap} if chat else {"max_tokens": cap}
    as_sent = {key: body[key] for key in given}
    exact = all(type(value) is int for value in as_sent.values())  # not 5.0: the node reads ints
    if exact and (given == said or (chat and len(given) == 1)):
        return cap, None
    rewritten = {k: v for k, v in body.items() if k not in CAP_FIELDS}
    return cap, {**rewritten, **said}


def _whole(value: Any) -> int | None:
    """`value` as an integer if JSON calls it one (5 or 5.0, as JSON Schema does), else None."""
    if type(value) is int:
        return value
    if type(value) is float and value.is_integer():
        return int(value)
    return None


def _token_count(body: dict[str, Any], key: str) -> int:
    value = _whole(body[key])
    if value is None:
        raise _bad(f"`{key}` must be an integer", param=key)
    if value < 1:
        raise _bad(f"`{key}` must be at least 1 (got {value})", param=key)
    if value > MAX_TOKENS_LIMIT:
        raise _bad(f"`{key}` must be at most {MAX_TOKENS_LIMIT}", param=key)
    return value


def _per_prompt(body: dict[str, Any]) -> tuple[int, int]:
    """For each of the request's prompts: the choices it gets (`n`) and the sequences the node
    generates (`n`, or `best_of` when larger: vLLM generates that many and picks from them)."""
    asked = {"n": 1, "best_of": 1}
    for key in asked:
        if body.get(key) is None:
            continue
        value = _whole(body[key])
        if value is None or not 1 <= value <= MAX_SEQUENCES:
            raise _bad(f"`{key}` must be an integer from 1 to {MAX_SEQUENCES}", param=key)
        asked[key] = value
    return asked["n"], max(asked.values())


def _prompt(body: dict[str, Any], chat: bool) -> tuple[str, int, int, int]:
    """The prompt's text (what prefix affinity hashes), its size in tokens (estimated for
    text, counted for token ids), how many prompts it is (a completions batch) and the size
    of the longest of them."""
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _bad("`messages` must be a non-empty array", param="messages")
        parts: list[str] = []
        # What the prompt holds besides its text: the tools' schemas and the calls made, as
        # their JSON (its media parts are counted by the caller).
        extra = _json_tokens(body.get("tools")) + _json_tokens(body.get("functions"))
        for i, message in enumerate(messages):
            if not isinstance(message, dict):
                raise _bad(f"`messages[{i}]` must be an object", param="messages")
            content = message.get("content")
            parts.append(_content_text(content, i))
            extra += _json_tokens(message.get("tool_calls"))
        text = "\n".join(parts)
        tokens = len(text) // CHARS_PER_TOKEN + extra
        return text, tokens, 1, tokens
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        tokens = len(prompt) // CHARS_PER_TOKEN
        return prompt, tokens, 1, tokens
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            text = "\n".join(prompt)
            longest = max(len(p) for p in prompt) // CHARS_PER_TOKEN
            return text, len(text) // CHARS_PER_TOKEN, len(prompt), longest
        if _token_ids(prompt):  # OpenAI's and vLLM's pre-tokenised prompt
            return _ids_text(prompt), len(prompt), 1, len(prompt)
        if all(isinstance(p, list) and p and _token_ids(p) for p in prompt):
            sizes = [len(p) for p in prompt]
            return _ids_text(prompt[0]), sum(sizes), len(prompt), max(sizes)
    raise _bad(
        "`prompt` must be a string, a non-empty array of strings, an array of token ids "
        "(non-negative integers) or a non-empty array of such arrays",
        param="prompt",
    )


def _token_ids(values: list[Any]) -> bool:
    """Whether `values` are token ids: whole numbers from 0 (5.0 too, as JSON Schema says)."""
    return all(
        (type(v) is int and v >= 0) or ((w := _whole(v)) is not None and w >= 0) for v in values
    )


def _ids_text(ids: list[int]) -> str:
    """Token ids as text for prefix affinity: the same leading ids give the same leading text.
    Only as many as the prefix hash can look at are written out."""
    return " ".join(map(str, map(int, ids[: PREFIX_CHARS // 2])))  # 5.0 and 5 alike


def _json_tokens(value: Any) -> int:
    """The tokens `value` (a part of the body, None if absent) is estimated at, as JSON."""
    if value is None:
        return 0
    try:
        text = orjson.dumps(value)
    except TypeError:  # deeper than orjson goes (254); the body may nest up to 512
        text = json.dumps(value, separators=(",", ":")).encode()
    return len(text) // CHARS_PER_TOKEN


#: The kinds of content part that are media, by their `type` (without an `input_` prefix).
_MEDIA = {"image": "image", "image_url": "image", "audio": "audio", "audio_url": "audio",
          "video": "video", "video_url": "video"}  # fmt: skip
#: The fields of a media part that may hold a URL (a string, or an object's `url`).
_URL_FIELDS = ("image_url", "audio_url", "video_url")


def _media_parts(body: dict[str, Any]) -> tuple[tuple[str, str, str | None], ...]:
    """Each image, audio or video part of a chat body's messages: its kind, where it is, and
    the URL a node would fetch for it (None when inline: `data:`, or base64 data). A part is
    media by its `type`, or by a URL field whatever its `type` says: vLLM reads a part with no
    `type` by its `image_url`, `audio_url` or `video_url`."""
    parts: list[tuple[str, str, str | None]] = []
    for i, message in enumerate(body.get("messages") or ()):
        content = message.get("content") if isinstance(message, dict) else None
        for j, part in enumerate(content if isinstance(content, list) else ()):
            if not isinstance(part, dict):
                continue
            kind = part.get("type")
            media = _MEDIA.get(kind.removeprefix("input_") if isinstance(kind, str) else "")
            media = media or next((_MEDIA[f] for f in _URL_FIELDS if f in part), None)
            if media is not None:
                parts.append((media, f"messages[{i}].content[{j}]", _fetched_url(part)))
    return tuple(parts)


def _fetched_url(part: dict[str, Any]) -> str | None:
    """The URL a node would fetch for a media part, unless it is inline (`data:`)."""
    for field in _URL_FIELDS:
        value = part.get(field)
        url = value.get("url") if isinstance(value, dict) else value
        if isinstance(url, str) and url[:5].lower() != "data:":
            return url
    return None


def _content_text(content: Any, i: int) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    texts: list[str] = []  # multi-part content: every part's text counts, as the node counts it
    for j, part in enumerate(content):
        if not isinstance(part, dict):
            continue
        text = part.get("text")
        if part.get("type") == "text" or text is not None:  # "input_text" too, say
            if not isinstance(text, str):
                raise _bad(f"`messages[{i}].content[{j}].text` must be a string", param="messages")
            texts.append(text)
    return "".join(texts)


def _bad(message: str, *, param: str | None = None) -> RouterError:
    return RouterError(400, message, code="invalid_request", param=param)
