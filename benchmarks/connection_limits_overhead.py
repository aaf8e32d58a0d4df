"""Benchmark: what the connection limits (tiergate/common/limited_protocol.py) cost a request.

One tiny ASGI app (reads the body, answers 2 bytes) served by uvicorn on uvloop twice: with
uvicorn's own httptools protocol, and with the limited one the router and the sim nodes use.
A client process keeps `--connections` connections busy with small POSTs, each sent in one
write (as nearly all requests arrive: no read timer is armed for them). The server's CPU time
(user + system, from /proc) over the requests gives its CPU per request; the two servers
alternate over `--rounds` rounds and the medians are printed. Compare the difference with the
router's own CPU per request (benchmarks/router_overhead.py).

    .venv/bin/python -P benchmarks/connection_limits_overhead.py [--rounds 6]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time

SERVER = r"""
import logging, socket, sys, uvicorn, uvloop
from tiergate.common.connection_limits import ConnectionGate, ConnectionLimits
from tiergate.common.limited_protocol import server_options

async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    await receive()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})

sock = socket.socket()
sock.bind(("127.0.0.1", 0))
print(sock.getsockname()[1], flush=True)
if sys.argv[1] == "limited":
    options = server_options(ConnectionGate(ConnectionLimits(), logging.getLogger("bench")))
else:
    options = {"http": "httptools"}
config = uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False, **options)
uvloop.run(uvicorn.Server(config).serve(sockets=[sock]))
"""

BODY = b'{"model": "m", "messages": [{"role": "user", "content": "hello there"}]}'
REQUEST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n"
    b"content-length: %d\r\n\r\n%s" % (len(BODY), BODY)
)


async def load(port: int, requests: int, connections: int) -> None:
    async def one() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(requests):
            writer.write(REQUEST)
            await reader.readuntil(b"\r\n\r\nok")
        writer.close()

    await asyncio.gather(*(one() for _ in range(connections)))


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def accepting(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def cpu_us_per_request(kind: str, requests: int, connections: int) -> float:
    argv = [sys.executable, "-P", "-c", SERVER, kind]
    with subprocess.Popen(argv, stdout=subprocess.PIPE) as server:
        try:
            assert server.stdout is not None
            port = int(server.stdout.readline())
            deadline = time.monotonic() + 30
            while not accepting(port):
                assert time.monotonic() < deadline, "the server did not start"
                time.sleep(0.05)
            asyncio.run(load(port, 100, connections))  # warm up
            before = cpu_s(server.pid)
            asyncio.run(load(port, requests, connections))
            return (cpu_s(server.pid) - before) / (requests * connections) * 1e6
        finally:
            server.kill()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--requests", type=int, default=2000, help="per connection and round")
    p.add_argument("--connections", type=int, default=16)
    args = p.parse_args()
    figures: dict[str, list[float]] = {"uvicorn httptools": [], "limited": []}
    kinds = {"uvicorn httptools": "plain", "limited": "limited"}
    for round_ in range(args.rounds):
        order = list(figures) if round_ % 2 == 0 else list(reversed(figures))
        for name in order:
            figures[name].append(cpu_us_per_request(kinds[name], args.requests, args.connections))
    print(f"    {' '.join(sys.argv)}\n")
    print("| protocol | server CPU per request (us), median | rounds |")
    print("|---|---|---|")
    for name, values in figures.items():
        rounds = ", ".join(f"{v:.1f}" for v in values)
        print(f"| {name} | {statistics.median(values):.1f} | {rounds} |")


if __name__ == "__main__":
    main()
