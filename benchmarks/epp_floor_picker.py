"""A bare endpoint picker on grpc.aio: every request to one `ip:port`, nothing decided, nothing
billed. It sends the answers tiergate's picker sends (router/epp/protocol.py's builders), over
the same gRPC server on the same event loop (uvloop), so Envoy with it in front is the floor
under tiergate as picker: what grpc.aio and the ext_proc exchange cost by themselves.

    python -P benchmarks/epp_floor_picker.py --port 9002 --destination 127.0.0.1:8000
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from typing import Any

import grpc
import uvloop

from tiergate.router.epp import protocol


def answers(request: Any, destination: str, body: list[bytes]) -> list[Any]:
    """What the picker sends for one of Envoy's messages (full-duplex streamed bodies)."""
    kind = protocol.phase(request)
    if kind == "request_headers" and request.request_headers.end_of_stream:
        return [protocol.pick_in_headers(destination, {}, ()),
                *protocol.streamed_body("request_body", b"", True)]  # fmt: skip
    if kind == "request_body":
        body.append(bytes(request.request_body.body))
        if not request.request_body.end_of_stream:
            return []
        return [protocol.pick_in_headers(destination, {}, ()),
                *protocol.streamed_body("request_body", b"".join(body), True)]  # fmt: skip
    if kind == "response_headers":
        return [protocol.reply_headers({}, ())]
    if kind == "response_body":
        part = request.response_body
        return protocol.streamed_body("response_body", bytes(part.body), part.end_of_stream)
    if kind in ("request_trailers", "response_trailers"):
        return [protocol.ack(kind)]
    return []


class FloorPicker:
    """`envoy.service.ext_proc.v3.ExternalProcessor`, answering in the stream's own task."""

    def __init__(self, destination: str) -> None:
        self.destination = destination

    async def Process(  # noqa: N802 (the gRPC method's name)
        self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        body: list[bytes] = []
        async for request in requests:
            for answer in answers(request, self.destination, body):
                yield answer


async def serve(port: int, destination: str) -> None:
    server = grpc.aio.server()
    protocol.add_servicer(FloorPicker(destination), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print(f"event=floor_picker_listening port={port}", flush=True)
    await server.wait_for_termination()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--destination", required=True, help="ip:port every request goes to")
    args = p.parse_args()
    uvloop.run(serve(args.port, args.destination))


if __name__ == "__main__":
    main()
