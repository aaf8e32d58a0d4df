"""Helpers of the sim-node tests (a uniquely named module: conftest names clash)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette

from tiergate.sim_nodes.perf import BatchingSpec, ServingSpec
from tiergate.sim_nodes.server import NodeConfig

MODEL = "llama-3.1-8b"

ClientFactory = Callable[..., Awaitable[httpx.AsyncClient]]


async def eventually(check: Callable[[], Awaitable[bool]], timeout_s: float = 5.0) -> None:
    """Poll `check` until true (yielding to the loop), failing after `timeout_s`."""
    async with asyncio.timeout(timeout_s):
        while not await check():
            await asyncio.sleep(0.001)


def node_config(**overrides: Any) -> NodeConfig:
    """A small, fast node: llama-3.1-8b on one H100, batch cap 8."""
    model = overrides.pop("model", MODEL)
    serving = overrides.pop("serving", None) or ServingSpec(
        model=model,
        accelerator="h100-sxm",
        batching=BatchingSpec(max_num_seqs=8),
    )
    return NodeConfig(serving=serving, **overrides)


def nested(levels: int, *, arrays: bool = False) -> dict[str, Any]:
    """A JSON schema (an object) nesting `levels` objects and arrays deep in all: mostly
    objects, or (`arrays`) one object holding nested arrays."""
    if arrays:
        inner: Any = "string"
        for _ in range(levels - 1):
            inner = [inner]
        return {"enum": inner}
    schema: dict[str, Any] = {"type": "string"}
    depth = 1
    while depth + 2 <= levels:
        schema, depth = {"type": "object", "properties": {"x": schema}}, depth + 2
    return {"type": "array", "items": schema} if depth < levels else schema


@contextmanager
def serve(app: Any) -> Iterator[tuple[str, int]]:
    """Serve `app` with uvicorn (as `tiergate sim-node` does) on a free localhost port in a
    thread of its own; yield (host, port). For tests about real connections."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
            time.sleep(0.01)
        yield "127.0.0.1", sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(20)
        sock.close()


def app_of(client: httpx.AsyncClient) -> Starlette:
    app: Starlette = client.app  # type: ignore[attr-defined]
    return app


def chat(content: str = "Hello there", **fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **fields}


async def sse(
    client: httpx.AsyncClient,
    path: str,
    body: dict[str, Any],
    headers: dict[str, str] | None = None,
) -> tuple[int, list[Any]]:
    """POST a streaming request; (status, events) with JSON decoded and '[DONE]' kept as is."""
    events: list[Any] = []
    async with client.stream("POST", path, json=body, headers=headers) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                data = line[len("data: ") :]
                events.append(data if data == "[DONE]" else json.loads(data))
        return response.status_code, events


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample in a Prometheus exposition."""
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        series, _, label_text = head.partition("{")
        if series != name:
            continue
        if all(f'{k}="{v}"' in label_text for k, v in labels.items()):
            return float(value)
    raise AssertionError(f"no sample {name} {labels}")
