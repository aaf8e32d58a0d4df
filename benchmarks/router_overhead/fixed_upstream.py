"""A trivial fixed-reply upstream for `benchmarks/router_overhead.py`.

Raw asyncio HTTP/1.1 with keep-alive: every POST gets the same small chat completion, `GET
/metrics` a minimal vLLM-named exposition (so the router's scraper sees an idle endpoint),
anything else `{"status":"ok"}`. No framework, no JSON encoding per request: it isolates the
proxies' own cost. Prints `listening host=... port=...` once bound.

A POST with `"stream": true` gets `max_tokens` SSE chunks instead, one every
`--token-interval-ms`, each stamped like the sim node's (`"tiergate":{"t": scheduled, "w":
written}`, CLOCK_MONOTONIC seconds), then a usage chunk and `data: [DONE]`: a stream source that
costs next to nothing, so that hundreds of concurrent streams measure the relay in between.

`--server uvicorn` serves the same whole replies from a plain ASGI app on uvicorn with its
pure-Python defaults (h11, asyncio): a fixed-reply service as a Python team would write it,
~4-6k req/s on this machine, which is the upstream the issue's reference figures describe
(direct ~4,100 req/s, nginx ~3,200).

    python benchmarks/router_overhead/fixed_upstream.py [--host 0.0.0.0] [--port 0]
        [--token-interval-ms 100] [--server asyncio|uvicorn] [--reply-delay-ms 0]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

COMPLETION = json.dumps(
    {
        "id": "chatcmpl-fixed",
        "object": "chat.completion",
        "created": 1767225600,
        "model": "llama-3.1-8b",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello! How can I help?"},
                "finish_reason": "stop",
                "logprobs": None,
            }
        ],
        "usage": {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19},
    },
    separators=(",", ":"),
).encode()
METRICS = (
    b"# TYPE vllm:num_requests_running gauge\n"
    b'vllm:num_requests_running{model_name="llama-3.1-8b"} 0.0\n'
    b"# TYPE vllm:num_requests_waiting gauge\n"
    b'vllm:num_requests_waiting{model_name="llama-3.1-8b"} 0.0\n'
    b"# TYPE vllm:kv_cache_usage_perc gauge\n"
    b'vllm:kv_cache_usage_perc{model_name="llama-3.1-8b"} 0.0\n'
)
HEALTH = b'{"status":"ok"}'


def _response(body: bytes, content_type: bytes) -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\ncontent-type: "
        + content_type
        + b"\r\ncontent-length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )


REPLY_COMPLETION = _response(COMPLETION, b"application/json")
REPLY_METRICS = _response(METRICS, b"text/plain; version=0.0.4")
REPLY_HEALTH = _response(HEALTH, b"application/json")
BAD_REQUEST = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)
CHUNK = (
    'data: {{"id":"chatcmpl-fixed","object":"chat.completion.chunk","created":1767225600,'
    '"model":"llama-3.1-8b","choices":[{{"index":0,"delta":{{"content":" tok"}},'
    '"finish_reason":null}}],"tiergate":{{"t":{t:.6f},"w":{w:.6f}}}}}\n\n'
)
USAGE = (
    'data: {{"id":"chatcmpl-fixed","object":"chat.completion.chunk","created":1767225600,'
    '"model":"llama-3.1-8b","choices":[],"usage":{{"prompt_tokens":12,'
    '"completion_tokens":{n},"total_tokens":{total}}}}}\n\ndata: [DONE]\n\n'
)
#: Seconds between a stream's chunks (`--token-interval-ms`).
TOKEN_INTERVAL_S = [0.1]
#: Seconds before a whole reply is written (`--reply-delay-ms`).
REPLY_DELAY_S = [0.0]


def _chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class Stream:
    """One SSE reply: a chunk every TOKEN_INTERVAL_S on the event loop's timers."""

    def __init__(self, transport: asyncio.Transport, tokens: int) -> None:
        self.transport = transport
        self.tokens = tokens
        self.sent = 0
        self.loop = asyncio.get_running_loop()
        self.start = time.monotonic()
        transport.write(STREAM_HEAD)
        self.loop.call_soon(self.tick)

    def tick(self) -> None:
        if self.transport.is_closing():
            return  # the client left: stop writing
        scheduled = self.start + self.sent * TOKEN_INTERVAL_S[0]
        chunk = CHUNK.format(t=scheduled, w=time.monotonic()).encode()
        self.transport.write(_chunked(chunk))
        self.sent += 1
        if self.sent < self.tokens:
            next_at = self.start + self.sent * TOKEN_INTERVAL_S[0]
            self.loop.call_at(self.loop.time() + max(0.0, next_at - time.monotonic()), self.tick)
            return
        usage = USAGE.format(n=self.tokens, total=12 + self.tokens).encode()
        self.transport.write(_chunked(usage) + b"0\r\n\r\n")


def stream_tokens(body: bytes) -> int | None:
    """`max_tokens` of a streaming request, or None for a whole reply."""
    if b'"stream"' not in body:
        return None
    try:
        request = json.loads(body)
    except ValueError:
        return None
    if request.get("stream") is not True:
        return None
    tokens = request.get("max_tokens")
    return tokens if isinstance(tokens, int) and tokens > 0 else 16


class FixedReply(asyncio.Protocol):
    """One connection: parse requests (pipelined or not) and answer each at once."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end]
            length = 0
            close = False
            lines = head.split(b"\r\n")
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"content-length":
                    try:
                        length = int(value.strip())
                    except ValueError:
                        self.transport.write(BAD_REQUEST)
                        self.transport.close()
                        return
                elif name == b"connection" and value.strip().lower() == b"close":
                    close = True
            if len(self.buffer) < end + 4 + length:
                return  # the body is still coming
            body = self.buffer[end + 4 : end + 4 + length]
            self.buffer = self.buffer[end + 4 + length :]
            request_line = lines[0]
            if request_line.startswith(b"POST "):
                tokens = stream_tokens(body)
                if tokens is None:
                    if REPLY_DELAY_S[0]:
                        loop = asyncio.get_running_loop()
                        loop.call_later(REPLY_DELAY_S[0], self.transport.write, REPLY_COMPLETION)
                    else:
                        self.transport.write(REPLY_COMPLETION)
                else:
                    Stream(self.transport, tokens)
            elif request_line.startswith(b"GET /metrics"):
                self.transport.write(REPLY_METRICS)
            else:
                self.transport.write(REPLY_HEALTH)
            if close:
                self.transport.close()
                return


async def serve(host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(FixedReply, host, port, backlog=4096, reuse_address=True)
    bound = server.sockets[0].getsockname()[1]
    print(f"listening host={host} port={bound}", flush=True)
    async with server:
        await server.serve_forever()


async def asgi_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The same whole replies as an ASGI app (no streaming)."""
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    if scope["method"] == "POST":
        body = COMPLETION
    elif scope["path"] == "/metrics":
        body = METRICS
    else:
        body = HEALTH
    kind = b"text/plain; version=0.0.4" if body is METRICS else b"application/json"
    # With its length, as a web framework's JSON response has it (not chunked).
    headers = [(b"content-type", kind), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def serve_uvicorn(host: str, port: int) -> None:
    # uvicorn binds the port itself: its accepted sockets then get TCP_NODELAY from asyncio (a
    # socket bound here, with proto 0, does not, and Nagle's algorithm plus delayed ACKs made
    # every reply take 40 ms).
    import uvicorn

    print(f"listening host={host} port={port}", flush=True)
    config = uvicorn.Config(asgi_app, host=host, port=port, http="h11", loop="asyncio",
                            lifespan="off", access_log=False, log_level="warning",
                            backlog=4096)  # fmt: skip
    uvicorn.Server(config).run()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--token-interval-ms", type=float, default=100.0)
    parser.add_argument("--server", choices=("asyncio", "uvicorn"), default="asyncio")
    parser.add_argument("--reply-delay-ms", type=float, default=0.0,
                        help="wait this long before each whole reply (asyncio server)")  # fmt: skip
    args = parser.parse_args()
    TOKEN_INTERVAL_S[0] = args.token_interval_ms / 1000
    REPLY_DELAY_S[0] = args.reply_delay_ms / 1000
    if args.server == "uvicorn":
        serve_uvicorn(args.host, args.port)
        return 0
    try:
        asyncio.run(serve(args.host, args.port))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
