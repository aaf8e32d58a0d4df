"""A stand-in for someone else's OpenAI-compatible API, strict the way hosted providers are:
a real HTTP server on a loopback port that wants its own Bearer key and its own model name,
refuses `stream_options` fields OpenAI's API does not define (vLLM's
`continuous_usage_stats`) and an output cap in a spelling it does not take, and says the usage
of every reply (a stream's in a last chunk with no choices, as OpenAI does). It records what
it was sent and how many requests were open at once, and can be told to fail.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PROMPT_TOKENS, COMPLETION_TOKENS = 1000, 500
#: The model name the provider's replies give (dated, as OpenAI's are).
REPLY_MODEL_SUFFIX = "-2026-01-01"


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: dict[str, Any] | None


@dataclass
class Provider:
    """The server's state: what it was sent, and how it is to answer."""

    key: str
    model: str
    url: str = ""
    #: The one spelling of a chat request's output cap it takes; the other is refused as
    #: OpenAI's reasoning models refuse `max_tokens`.
    cap_field: str = "max_completion_tokens"
    received: list[Received] = field(default_factory=list)
    #: Other model names it serves besides `model`.
    also_models: tuple[str, ...] = ()
    #: None: answer well; an HTTP status: answer that (an error envelope); "hang": say nothing
    #: for `hang_s` seconds, then 504; "slow": say nothing for `hang_s` seconds, then answer
    #: well (a long generation); "held": say nothing until `release` is set (at most
    #: `hang_s`), then answer well; "cut": begin a stream, then close it before any event;
    #: "error-chunk": a stream's first token, then an error as OpenRouter sends one mid-stream
    #: (a chunk with `error` beside its choices, `finish_reason: "error"`), and no [DONE].
    fail: int | str | None = None
    #: With it set, `fail` applies only to requests for that model.
    failing_model: str | None = None
    hang_s: float = 5.0
    release: threading.Event = field(default_factory=threading.Event)
    #: With `fail` a status: the error envelope's message and param (`{model}`: the provider's
    #: model name, as providers' own errors name it), or a raw body in place of the envelope.
    fail_message: str = "the provider is unwell"
    fail_param: str | None = None
    fail_body: bytes | None = None
    #: Requests open now, and the most ever open at once.
    open_now: int = 0
    most_open: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def requests(self, path: str = "/v1/chat/completions") -> list[Received]:
        with self.lock:
            return [r for r in self.received if r.path == path]

    def paths(self) -> set[str]:
        with self.lock:
            return {r.path for r in self.received}


def _lower(items: Any) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in items}


def _error(
    handler: BaseHTTPRequestHandler,
    status: int,
    message: str,
    param: str | None = None,
    raw: bytes | None = None,
) -> None:
    error = {"message": message, "type": "invalid_request_error", "param": param}
    body = raw if raw is not None else json.dumps({"error": error}).encode()
    handler.send_response(status)
    handler.send_header("content-type", "application/json")
    handler.send_header("content-length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def _handler(provider: Provider) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            return None

        def do_GET(self) -> None:
            with provider.lock:
                provider.received.append(Received(self.path, _lower(self.headers.items()), None))
            _error(self, 404, "no such path")

        def do_POST(self) -> None:
            with provider.lock:
                provider.open_now += 1
                provider.most_open = max(provider.most_open, provider.open_now)
            try:
                self._post()
            finally:
                with provider.lock:
                    provider.open_now -= 1

        def _post(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length)
            try:
                body = json.loads(raw)
            except ValueError:
                body = None
            with provider.lock:
                provider.received.append(Received(self.path, _lower(self.headers.items()), body))
            if self.headers.get("authorization") != f"Bearer {provider.key}":
                return _error(self, 401, "Incorrect API key provided")
            asked = body.get("model") if isinstance(body, dict) else None
            fail = provider.fail
            if provider.failing_model is not None and asked != provider.failing_model:
                fail = None
            if fail == "held":
                provider.release.wait(provider.hang_s)
            elif fail in ("hang", "slow"):
                time.sleep(provider.hang_s)
                if fail == "hang":
                    return _error(self, 504, "too late")
            elif fail == "cut":
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("connection", "close")
                self.end_headers()
                self.close_connection = True
                return None
            if isinstance(fail, int):
                model = provider.model
                param = provider.fail_param.format(model=model) if provider.fail_param else None
                return _error(self, fail, provider.fail_message.format(model=model),
                              param, provider.fail_body)  # fmt: skip
            if self.path != "/v1/chat/completions" or not isinstance(body, dict):
                return _error(self, 404, "no such path")
            if asked != provider.model and asked not in provider.also_models:
                return _error(self, 404, f"The model {asked!r} does not exist")
            other = "max_tokens" if provider.cap_field != "max_tokens" else "max_completion_tokens"
            if other in body:
                return _error(self, 400, f"Unsupported parameter: '{other}' is not supported "
                              f"with this model. Use '{provider.cap_field}' instead.",
                              other)  # fmt: skip
            options = body.get("stream_options")
            if options is not None and set(options) - {"include_usage"}:
                return _error(self, 400, f"Unrecognized stream_options: {sorted(options)}")
            if body.get("stream"):
                usage = bool(options and options.get("include_usage"))
                return self._stream(str(asked), usage, error=fail == "error-chunk")
            reply = {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": 1,
                "model": str(asked) + REPLY_MODEL_SUFFIX,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"},
                             "finish_reason": "stop"}],
                "usage": {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": COMPLETION_TOKENS,
                          "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS},
            }  # fmt: skip
            data = json.dumps(reply).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _stream(self, model: str, include_usage: bool, *, error: bool = False) -> None:
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("connection", "close")
            self.end_headers()
            head = {"id": "chatcmpl-2", "object": "chat.completion.chunk", "created": 1,
                    "model": model + REPLY_MODEL_SUFFIX}  # fmt: skip
            usage_field = {"usage": None} if include_usage else {}
            for word in ("hel",) if error else ("hel", "lo"):
                chunk = {**head, "choices": [{"index": 0, "delta": {"content": word}}],
                         **usage_field}  # fmt: skip
                self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                self.wfile.flush()
            if error:
                failed = {**head, "error": {"code": 502, "message": f"{model} disconnected"},
                          "choices": [{"index": 0, "delta": {"content": ""},
                                       "finish_reason": "error"}]}  # fmt: skip
                self.wfile.write(b"data: " + json.dumps(failed).encode() + b"\n\n")
                self.wfile.flush()
                self.close_connection = True
                return
            if include_usage:
                usage = {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": COMPLETION_TOKENS,
                         "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS}  # fmt: skip
                last = {**head, "choices": [], "usage": usage}
                self.wfile.write(b"data: " + json.dumps(last).encode() + b"\n\n")
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            self.close_connection = True

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        return None  # the router hung up on a slow reply: expected, and no one to tell


@contextmanager
def running_provider(
    key: str, model: str, cap_field: str = "max_completion_tokens"
) -> Iterator[Provider]:
    """A provider on a free loopback port (`Provider.url`: its base URL, `.../v1`)."""
    provider = Provider(key, model, cap_field=cap_field)
    server = _Server(("127.0.0.1", 0), _handler(provider))
    provider.url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield provider
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
