"""A trivial fixed-reply upstream for `benchmarks/router_overhead.py`.

Raw asyncio HTTP/1.1 with keep-alive: every POST gets the same small chat completion, `GET
/metrics` a minimal vLLM-named exposition (so the router's scraper sees an idle endpoint),
anything else `{"status":"ok"}`. No framework, no JSON encoding per request: it isolates the
proxies' own cost. Prints `listening host=... port=...` once bound.

    python benchmarks/router_overhead/fixed_upstream.py [--host 0.0.0.0] [--port 0]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

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
            self.buffer = self.buffer[end + 4 + length :]
            request_line = lines[0]
            if request_line.startswith(b"POST "):
                self.transport.write(REPLY_COMPLETION)
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    try:
        asyncio.run(serve(args.host, args.port))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
