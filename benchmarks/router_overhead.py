"""Benchmark: what the tiergate router adds to a request, next to nginx and LiteLLM, in one run.

Starts everything itself on 127.0.0.1 (free ports), measures, prints markdown tables (with the
command that produced them) and stops everything on any exit:

1. Non-streaming, fixed-reply upstream (a raw-asyncio server answering one constant small chat
   completion; isolates the proxies' own cost): upstream direct, nginx as a plain reverse proxy,
   LiteLLM's proxy (one worker, the upstream as an openai-compatible model) and the router.
   `wrk`, one connection (latency p50/p99) and 64 connections (req/s), several rounds,
   interleaved, medians reported.
   `pyfixed`: the same replies from uvicorn with its pure-Python defaults (h11, asyncio), the
   kind of upstream the issue's reference figures were measured with (direct ~4,100 req/s).
2. The same against a real `tiergate sim-node` (llama-3.1-8b on wse-3: fast tokens).
3. Streaming: `--streams` (512) concurrent streams from an async httpx client in a separate
   process (started evenly over 2 s: a gateway's steady state), through the router and
   directly. The source stamps every SSE chunk with the time it wrote it (CLOCK_MONOTONIC);
   received-minus-written through the router versus direct is the router's added delay per
   token. A stall is a chunk delivered more than 1 s after it was written. The default source
   is the fixed-rate upstream (a chunk every 100 ms per stream, 5,120 chunks/s for 512 streams,
   written from timers at next to no cost), so the machine's two cores go to the client and the
   router. `--stream-upstream sim` streams from a sim node instead (llama-3.1-70b on
   a100-80gb, ~5 tok/s per stream at 512; `x-tiergate-timing: 1` makes it stamp chunks): there
   the engine's own schedule also moves the figures, and a wse-3 node would schedule ~560,000
   tok/s for 512 streams, more than any Python process on this machine can write.
4. Endpoint count: the router with 3, 30 and 300 endpoints in one pool, and the 300 as 100
   pools of 3 (3 fixed-reply processes listening on 0.0.0.0; 300 distinct URLs through
   127.0.0.1..127.0.0.100, all loopback): the router's own CPU per request and req/s at 64
   connections, p50 at 1, and the idle router's CPU (metrics scraping, off the request path),
   which is also taken out of the CPU per request to give the request path's share. Each
   round starts every router afresh, in an order rotated every round.
5. Idle gaps: the router in front of the fixed upstream replying at once and after 20 ms
   (`--reply-delay-ms`), p50/p99 at 1 connection: what a request that waits upstream, as an
   LLM request does, finds.
6. Ledger: the router over the fixed upstream with its SQLite ledger and with a PostgreSQL
   ledger (a private server started for the run, tests/helpers/postgres_server.py), side by
   side; every request from one tenant with a budget and rate limits, so budgets and limits
   are held through the ledger (leases, with PostgreSQL) on every request.

`--profile` adds one 64-connection run per router under py-spy (installed into its own venv)
and prints where the router spends its time.

Tools: `wrk` and `nginx` (Debian packages; installed with apt-get when missing and running as
root, else the command to run is printed), LiteLLM in ~/.cache/tiergate/bench-venvs/litellm
(created on first use; its row says why when it cannot be installed or started).

    .venv/bin/python benchmarks/router_overhead.py [--quick] [--profile] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import os
import re
import shlex
import shutil
import signal
import socket
import statistics
import string
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ASSETS = HERE / "router_overhead"
FIXED_UPSTREAM = ASSETS / "fixed_upstream.py"
WRK_SCRIPT = ASSETS / "post.lua"
NGINX_TEMPLATE = ASSETS / "nginx.conf.template"
BENCH_VENVS = Path.home() / ".cache" / "tiergate" / "bench-venvs"
LITELLM_VENV = BENCH_VENVS / "litellm"
PYSPY_VENV = BENCH_VENVS / "py-spy"

MODEL = "llama-3.1-8b"
CHAT_BODY = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Say hello."}],
    "max_tokens": 8,
}

# The targets.
TARGET_ADDED_P50_MS = 0.5
TARGET_ADDED_P99_MS = 2.0
TARGET_NGINX_SHARE = 0.5
TARGET_STREAM_P99_MS = 2.0
#: The PostgreSQL ledger against the SQLite one, in the same run.
TARGET_POSTGRES_RPS_SHARE = 0.8
TARGET_POSTGRES_ADDED_P50_MS = 0.2
STALL_S = 1.0
SECTIONS = ("fixed", "pyfixed", "sim", "stream", "endpoints", "idle", "ledger")
#: The `idle` section's upstream delay: about an LLM's time to a short reply.
IDLE_DELAY_MS = 20.0
#: A direct-path p99 above this means the machine, not the router, sets the streaming figures.
BASELINE_SANE_MS = 50.0

_STAMP = re.compile(rb'"tiergate":\{"t":([-0-9.e+]+),"w":([-0-9.e+]+)\}')
_WRK_LINE = re.compile(r"TGRESULT (.*)")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- processes -------------------------------------------------------------------------------


def _child_setup() -> None:
    """In the child before exec: its own process group, and SIGKILL when we die (even -9)."""
    os.setsid()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Processes:
    """Every process the benchmark starts; each in its own group, all stopped by `stop_all`."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(
        self, name: str, cmd: Sequence[str], env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        logfile = (self.workdir / f"{name}.log").open("wb")
        try:
            proc = subprocess.Popen(
                list(cmd),
                stdin=subprocess.DEVNULL,
                stdout=logfile,
                stderr=subprocess.STDOUT,
                env=env,
                preexec_fn=_child_setup,  # noqa: PLW1509 - no threads in this process
            )
        finally:
            logfile.close()
        self.procs.append(proc)
        return proc

    def log_tail(self, name: str, lines: int = 8) -> str:
        path = self.workdir / f"{name}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, proc: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                pass
        # The group may outlive its leader (nginx workers, uvicorn children).
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        if proc in self.procs:
            self.procs.remove(proc)

    def stop_all(self) -> None:
        for proc in reversed(list(self.procs)):
            self.stop(proc, timeout_s=5.0)


def _raise_exit(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never a proxy


def http_status(url: str, timeout_s: float = 2.0) -> int | None:
    try:
        with _OPENER.open(url, timeout=timeout_s) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (OSError, ValueError):
        return None


def wait_ready(
    url: str, proc: subprocess.Popen[bytes], timeout_s: float, ok: Callable[[int], bool]
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with status {proc.returncode} before it was ready")
        status = http_status(url)
        if status is not None and ok(status):
            return
        time.sleep(0.1)
    raise RuntimeError(f"not ready after {timeout_s:.0f} s ({url})")


def post_ok(
    url: str, body: dict[str, Any], timeout_s: float = 30.0, api_key: str | None = None
) -> None:
    """One request that must succeed (a smoke test before measuring)."""
    headers = {"content-type": "application/json"}
    if api_key is not None:
        headers["authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(
        url + "/v1/chat/completions", data=json.dumps(body).encode(), headers=headers
    )
    with _OPENER.open(request, timeout=timeout_s) as response:
        reply = json.loads(response.read())
    if not reply.get("choices"):
        raise RuntimeError(f"unexpected reply: {str(reply)[:200]}")


def cpu_times(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds so far of process `pid` and the processes it started (a
    router's workers, its cascade checkers), those still running."""
    tick = os.sysconf("SC_CLK_TCK")
    user = system = 0.0
    for one in [pid, *descendants(pid)]:
        try:
            fields = Path(f"/proc/{one}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        user += int(fields[11]) / tick
        system += int(fields[12]) / tick
    return user, system


def descendants(pid: int) -> list[int]:
    """The processes `pid` started, and theirs."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def cpu_seconds(pid: int) -> float:
    return sum(cpu_times(pid))


# -- tools -----------------------------------------------------------------------------------


def ensure_debian_tools(names: dict[str, str]) -> None:
    """`names`: executable -> Debian package. Installs missing ones with apt-get as root."""
    missing = {exe: pkg for exe, pkg in names.items() if shutil.which(exe) is None}
    if not missing:
        return
    packages = sorted(set(missing.values()))
    command = f"apt-get update && apt-get install -y {' '.join(packages)}"
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise SystemExit(f"missing {', '.join(missing)}; install with: sudo sh -c '{command}'")
    log(f"installing {' '.join(packages)} with apt-get ...")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", *packages], check=True, env=env)


def ensure_venv_tool(venv: Path, requirement: str, executable: str) -> Path:
    """`executable` from `requirement` pip-installed into its own venv (never the project's)."""
    exe = venv / "bin" / executable
    if exe.exists():
        return exe
    log(f"installing {requirement} into {venv} ...")
    if not (venv / "bin" / "python").exists():
        subprocess.run([sys.executable, "-P", "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(venv / "bin" / "python"), "-P", "-m", "pip", "install", "-q", requirement],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    if not exe.exists():
        raise RuntimeError(f"{requirement} installed no {executable}")
    return exe


def tool_version(cmd: Sequence[str], pattern: str) -> str:
    try:
        out = subprocess.run(list(cmd), capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    match = re.search(pattern, out.stdout + out.stderr)
    return match.group(1) if match else "?"


# -- servers ---------------------------------------------------------------------------------


@dataclass
class Server:
    name: str
    url: str  # base URL, no trailing slash
    proc: subprocess.Popen[bytes] | None = None
    unavailable: str | None = None  # why, when it could not be started
    api_key: str | None = None  # sent as a bearer token when set
    api_keys: tuple[str, ...] = ()  # or these, one per request in turn (wrk rotates them)
    metrics_url: str = ""  # a tiergate router's /metrics, on its metrics port


def start_fixed(
    procs: Processes,
    name: str,
    token_interval_ms: float = 100.0,
    server: str = "asyncio",
    reply_delay_ms: float = 0.0,
) -> Server:
    port = free_port()
    proc = procs.start(
        name,
        [sys.executable, "-P", str(FIXED_UPSTREAM), "--host", "0.0.0.0", "--port", str(port),
         "--token-interval-ms", str(token_interval_ms), "--server", server,
         "--reply-delay-ms", str(reply_delay_ms)],
    )  # fmt: skip
    server = Server(name, f"http://127.0.0.1:{port}", proc)
    wait_ready(server.url + "/health", proc, 15, lambda s: s == 200)
    return server


def start_sim_node(
    procs: Processes,
    name: str,
    model: str,
    accelerator: str,
    max_num_seqs: int,
    extra_args: Sequence[str] = (),
) -> Server:
    """A sim node serving `model` as MODEL; `extra_args` are more `tiergate sim-node` flags."""
    port = free_port()
    cmd = [sys.executable, "-P", "-m", "tiergate", "sim-node", "--model", model,
           "--accelerator", accelerator, "--max-num-seqs", str(max_num_seqs),
           "--served-model-name", MODEL, "--port", str(port), "--log-level", "warning",
           *extra_args]  # fmt: skip
    proc = procs.start(name, cmd)
    server = Server(name, f"http://127.0.0.1:{port}", proc)
    wait_ready(server.url + "/ready", proc, 60, lambda s: s == 200)
    return server


def start_nginx(procs: Processes, name: str, upstream: Server, workers: int) -> Server:
    prefix = procs.workdir / name
    prefix.mkdir()
    port = free_port()
    upstream_port = upstream.url.rsplit(":", 1)[1]
    conf = string.Template(NGINX_TEMPLATE.read_text()).substitute(
        workers=workers, prefix=prefix, port=port, upstream_port=upstream_port
    )
    (prefix / "nginx.conf").write_text(conf)
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    proc = procs.start(name, [nginx, "-e", "stderr", "-p", str(prefix), "-c", "nginx.conf"])
    server = Server(name, f"http://127.0.0.1:{port}", proc)
    wait_ready(server.url + "/health", proc, 15, lambda s: s == 200)
    return server


def start_litellm(procs: Processes, name: str, upstream: Server) -> Server:
    """LiteLLM's proxy with one worker; an unavailable Server (with the reason) on failure."""
    try:
        exe = ensure_venv_tool(LITELLM_VENV, "litellm[proxy]", "litellm")
    except (subprocess.CalledProcessError, RuntimeError, OSError) as exc:
        return Server(name, "", unavailable=f"cannot install litellm[proxy]: {exc}")
    port = free_port()
    config = procs.workdir / f"{name}.yaml"
    config.write_text(
        json.dumps(  # JSON is YAML
            {
                "model_list": [
                    {
                        "model_name": MODEL,
                        "litellm_params": {
                            "model": f"openai/{MODEL}",
                            "api_base": upstream.url + "/v1",
                            "api_key": "unused",
                        },
                    }
                ],
                "litellm_settings": {"drop_params": True},
            },
            indent=2,
        )
    )
    env = {
        **os.environ,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no download of the price list at start
        "LITELLM_LOG": "ERROR",
        # No master key: unauthenticated like the router here (LiteLLM refuses by default).
        "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true",
        "NO_PROXY": "127.0.0.1,localhost",
    }
    cmd = [str(exe), "--config", str(config), "--host", "127.0.0.1", "--port", str(port),
           "--num_workers", "1"]  # fmt: skip
    proc = procs.start(name, cmd, env=env)
    server = Server(name, f"http://127.0.0.1:{port}", proc)
    try:
        wait_ready(server.url + "/health/liveliness", proc, 120, lambda s: s == 200)
        post_ok(server.url, CHAT_BODY)
    except (RuntimeError, OSError, ValueError) as exc:
        tail = procs.log_tail(name, 3).replace("\n", " / ")
        procs.stop(proc)
        return Server(name, "", unavailable=f"LiteLLM did not start: {exc} ({tail[-300:]})")
    return server


def start_router(
    procs: Processes,
    name: str,
    endpoints: Sequence[str],
    max_num_seqs: int,
    pools: int = 1,
    ledger_url: str | None = None,
    tenants_file: Path | None = None,
    api_key: str | None = None,
    workers: int = 1,
    api_keys: Sequence[str] = (),
    extra_settings: Mapping[str, Any] | None = None,
    pool_fields: Mapping[str, Any] | None = None,
) -> Server:
    """The router over `endpoints`, split evenly over `pools` pools serving the same model at
    the same tier (so every endpoint is a candidate for every request); its ledger SQLite, or
    PostgreSQL at `ledger_url`; open, or the tenants of `tenants_file` (`api_key` one's key,
    or `api_keys` several tenants' keys, sent in turn); `workers` processes (`--workers`,
    PostgreSQL only). `extra_settings` go under `router:` (e.g. `admissionOrder`),
    `pool_fields` into every pool (e.g. the `model` and `accelerator` a sim node serves)."""
    port, metrics_port = free_port(), free_port()
    size = -(-len(endpoints) // pools)
    settings: dict[str, Any] = {
        "host": "127.0.0.1",
        "port": port,
        "metricsPort": metrics_port,
        **(extra_settings or {}),
    }
    if ledger_url is not None:
        settings["ledgerUrl"] = ledger_url
    else:
        settings["ledgerPath"] = str(procs.workdir / f"{name}-ledger.sqlite")
    if tenants_file is not None:
        settings["tenantsFile"] = str(tenants_file)
    config = {
        "router": settings,
        "pools": [
            {
                "name": "bench" if i == 0 else f"bench-{i}",
                "tier": "batched",
                "model": "llama-3.1-8b",
                "accelerator": "wse-3",
                "servedModelName": MODEL,
                "batching": {"maxNumSeqs": max_num_seqs},
                "endpoints": list(endpoints[i * size : (i + 1) * size]),
                **(pool_fields or {}),
            }
            for i in range(pools)
        ],
    }
    path = procs.workdir / f"{name}.yaml"
    path.write_text(json.dumps(config, indent=2))
    cmd = [sys.executable, "-P", "-m", "tiergate", "router", "--config", str(path),
           "--log-level", "warning", "--workers", str(workers)]  # fmt: skip
    proc = procs.start(name, cmd)
    server = Server(
        name,
        f"http://127.0.0.1:{port}",
        proc,
        api_key=api_key,
        api_keys=tuple(api_keys),
        metrics_url=f"http://127.0.0.1:{metrics_port}/metrics",
    )
    try:
        wait_ready(server.url + "/readyz", proc, 60, lambda s: s == 200)
        for key in api_keys or [api_key]:
            post_ok(server.url, CHAT_BODY, api_key=key)
    except (RuntimeError, OSError, ValueError) as exc:
        log(f"{name} failed: {exc}; its log ends:\n{procs.log_tail(name, 40)}")
        raise
    return server


# -- wrk -------------------------------------------------------------------------------------


@dataclass
class Load:
    """One wrk run."""

    requests: int
    duration_s: float
    p50_ms: float
    p99_ms: float
    errors: int
    cpu_s: float = float("nan")  # the measured process's CPU time during the run
    cpu_user_s: float = float("nan")  # of which in user space

    @property
    def rps(self) -> float:
        return self.requests / self.duration_s if self.duration_s else 0.0


def run_wrk(
    url: str,
    connections: int,
    duration_s: int,
    api_key: str | None = None,
    api_keys: Sequence[str] = (),
) -> Load:
    """`api_key` on every request, or `api_keys` one per request in turn."""
    cmd = ["wrk", "-t1", f"-c{connections}", f"-d{duration_s}s", "--timeout", "10s",
           "-s", str(WRK_SCRIPT), url + "/v1/chat/completions"]  # fmt: skip
    env = {**os.environ, "TG_WRK_BODY": json.dumps(CHAT_BODY, separators=(",", ":"))}
    if api_key is not None:
        env["TG_WRK_API_KEY"] = api_key
    if api_keys:
        env["TG_WRK_API_KEYS"] = ",".join(api_keys)
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=duration_s + 60)
    match = _WRK_LINE.search(out.stdout)
    if out.returncode != 0 or match is None:
        raise RuntimeError(f"wrk failed ({out.returncode}): {out.stdout[-300:]} {out.stderr}")
    f = {k: int(v) for k, v in (kv.split("=") for kv in match.group(1).split())}
    errors = f["connect"] + f["read"] + f["write"] + f["status"] + f["timeout"]
    if f["requests"] == 0:  # nothing answered within the run: no latency to speak of
        return Load(0, f["duration_us"] / 1e6, float("nan"), float("nan"), errors)
    return Load(f["requests"], f["duration_us"] / 1e6, f["p50_us"] / 1e3, f["p99_us"] / 1e3, errors)


@dataclass
class Row:
    """A path's wrk runs: at 1 connection and at 64, one per round."""

    label: str
    server: Server
    one: list[Load] = field(default_factory=list)
    many: list[Load] = field(default_factory=list)

    @property
    def available(self) -> bool:
        return self.server.unavailable is None and bool(self.one) and bool(self.many)

    def p50(self) -> float:
        return statistics.median(r.p50_ms for r in self.one)

    def p99(self) -> float:
        return statistics.median(r.p99_ms for r in self.one)

    def rps(self) -> float:
        return statistics.median(r.rps for r in self.many)

    def p50_many(self) -> float:
        return statistics.median(r.p50_ms for r in self.many)

    def cpu_us_per_request(self) -> float:
        """The server's own CPU per request at many connections (its cost, whatever else the
        machine's cores were doing)."""
        return statistics.median(1e6 * r.cpu_s / max(r.requests, 1) for r in self.many)

    def cpu_user_us_per_request(self) -> float:
        return statistics.median(1e6 * r.cpu_user_s / max(r.requests, 1) for r in self.many)

    def errors(self) -> int:
        return sum(r.errors for r in self.one + self.many)


def measure_rows(rows: list[Row], args: argparse.Namespace, section: str) -> None:
    """Warm each path up, then `args.rounds` rounds, paths interleaved within a round."""
    live = [r for r in rows if r.server.unavailable is None]
    for row in live:
        run_wrk(row.server.url, args.connections, 1, row.server.api_key, row.server.api_keys)
    for i in range(args.rounds):
        for row in live:
            measure_round(row, args, f"[{section}] round {i + 1}/{args.rounds}")


def measure_round(row: Row, args: argparse.Namespace, prefix: str) -> None:
    """One wrk run at 1 connection and one at `args.connections`, the server's CPU read
    around the second; appended to `row`."""
    keys = row.server.api_keys
    one = run_wrk(row.server.url, 1, args.duration, row.server.api_key, keys)
    pid = row.server.proc.pid if row.server.proc is not None else None
    user0, sys0 = cpu_times(pid) if pid is not None else (float("nan"), float("nan"))
    many = run_wrk(row.server.url, args.connections, args.duration, row.server.api_key, keys)
    if pid is not None:
        user1, sys1 = cpu_times(pid)
        many.cpu_s, many.cpu_user_s = user1 + sys1 - user0 - sys0, user1 - user0
    row.one.append(one)
    row.many.append(many)
    errors = one.errors + many.errors
    cpu = f", {1e6 * many.cpu_s / max(many.requests, 1):.0f} us CPU/req" if pid else ""
    log(
        f"{prefix} {row.label}: 1 conn p50 {one.p50_ms:.3f} ms p99 {one.p99_ms:.3f} ms; "
        f"{args.connections} conns {many.rps:,.0f} req/s{cpu}"
        + (f"; {errors} errors" if errors else "")
    )


# -- streaming -------------------------------------------------------------------------------


@dataclass
class StreamRound:
    lags_s: list[float] = field(default_factory=list)  # received - written, every chunk
    max_gaps_s: list[float] = field(default_factory=list)  # per stream, between chunks
    max_lags_s: list[float] = field(default_factory=list)  # per stream, worst received-written
    first_chunk_s: list[float] = field(default_factory=list)
    chunks: int = 0
    failed: int = 0
    failures: list[str] = field(default_factory=list)
    wall_s: float = 0.0


def stream_worker(
    url: str, health_path: str, streams: int, max_tokens: int, start_at: float, ramp_s: float
) -> StreamRound:
    """Runs in a client process: `streams` concurrent streams, started evenly over `ramp_s`
    from `start_at` (a gateway's steady state, not 512 prefills in the same millisecond).

    aiohttp, not httpx: httpx's pool (httpcore) checks every pooled connection on each request,
    which at 512 connections made this client, not the path measured, the bottleneck (first
    chunks seconds late, the client at 100% CPU).
    """
    import aiohttp

    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Benchmark the router's stream relay. " * 4}],
        "max_tokens": max_tokens,
        "stream": True,
    }
    out = StreamRound()

    async def one(client: aiohttp.ClientSession, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        started = time.monotonic()
        last = started
        max_gap = max_lag = 0.0
        try:
            async with client.post(
                "/v1/chat/completions", json=body, headers={"x-tiergate-timing": "1"}
            ) as response:
                if response.status != 200:
                    out.failed += 1
                    out.failures.append(f"HTTP {response.status}")
                    await response.read()
                    return
                pending = b""
                first = True
                async for raw in response.content.iter_any():
                    received = time.monotonic()
                    pending += raw
                    end = pending.rfind(b"\n\n") + 2
                    if end < 2:
                        continue
                    complete, pending = pending[:end], pending[end:]
                    stamps = _STAMP.findall(complete)
                    if not stamps:
                        continue
                    if first:  # time to first token is the node's prefill queue, not a stall
                        out.first_chunk_s.append(received - started)
                        first = False
                    else:
                        max_gap = max(max_gap, received - last)
                    last = received
                    for _t, w in stamps:
                        lag = received - float(w)
                        out.lags_s.append(lag)
                        max_lag = max(max_lag, lag)
                    out.chunks += len(stamps)
        except (aiohttp.ClientError, TimeoutError) as exc:
            out.failed += 1
            out.failures.append(type(exc).__name__)
            return
        out.max_gaps_s.append(max_gap)
        out.max_lags_s.append(max_lag)

    async def health(client: aiohttp.ClientSession) -> None:
        async with client.get(health_path) as response:
            await response.read()

    async def go() -> None:
        async with aiohttp.ClientSession(
            base_url=url,
            connector=aiohttp.TCPConnector(limit=streams + 8),
            timeout=aiohttp.ClientTimeout(total=120),
        ) as client:
            # Open the connections before the common start: setup is not what is measured.
            await asyncio.gather(*(health(client) for _ in range(streams)))
            await asyncio.sleep(max(0.0, start_at - time.monotonic()))
            step = ramp_s / streams
            await asyncio.gather(*(one(client, i * step) for i in range(streams)))
            out.wall_s = time.monotonic() - start_at

    asyncio.run(go())
    return out


def run_streams(
    pool: ProcessPoolExecutor, url: str, health: str, args: argparse.Namespace, max_tokens: int
) -> StreamRound:
    clients = args.stream_clients
    shares = [args.streams // clients] * clients
    shares[0] += args.streams - sum(shares)
    start_at = time.monotonic() + 1.5
    futures = [
        pool.submit(stream_worker, url, health, n, max_tokens, start_at, args.stream_ramp)
        for n in shares
        if n
    ]
    total = StreamRound()
    for future in futures:
        part = future.result()
        total.lags_s += part.lags_s
        total.max_gaps_s += part.max_gaps_s
        total.max_lags_s += part.max_lags_s
        total.first_chunk_s += part.first_chunk_s
        total.chunks += part.chunks
        total.failed += part.failed
        total.failures += part.failures
        total.wall_s = max(total.wall_s, part.wall_s)
    return total


def quantile_ms(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class StreamStats:
    rounds: list[StreamRound] = field(default_factory=list)

    def lag(self, q: float) -> float:
        return statistics.median(quantile_ms(r.lags_s, q) for r in self.rounds)

    def stalled(self) -> int:
        """Streams with a chunk held back more than 1 s after the node wrote it."""
        return sum(sum(g > STALL_S for g in r.max_lags_s) for r in self.rounds)

    def max_gap_ms(self) -> float:
        return 1000 * max((max(r.max_gaps_s, default=0.0) for r in self.rounds), default=0.0)

    def first_chunk_p99(self) -> float:
        return statistics.median(quantile_ms(r.first_chunk_s, 0.99) for r in self.rounds)

    def failed(self) -> int:
        return sum(r.failed for r in self.rounds)

    def tokens_per_s(self) -> float:
        return statistics.median(r.chunks / r.wall_s if r.wall_s else 0.0 for r in self.rounds)


# -- profiling -------------------------------------------------------------------------------


def profile_router(
    procs: Processes, router: Server, args: argparse.Namespace, label: str
) -> str | None:
    """py-spy on the router during one 64-connection run; a markdown summary, or None."""
    assert router.proc is not None
    try:
        pyspy = ensure_venv_tool(PYSPY_VENV, "py-spy", "py-spy")
    except (subprocess.CalledProcessError, RuntimeError, OSError) as exc:
        log(f"profile: py-spy unavailable: {exc}")
        return None
    raw = procs.workdir / f"profile-{label}.txt"
    duration = max(args.duration, 4)
    spy = subprocess.Popen(
        [str(pyspy), "record", "--pid", str(router.proc.pid), "--duration", str(duration),
         "--rate", "200", "--format", "raw", "--output", str(raw)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=_child_setup,  # noqa: PLW1509
    )  # fmt: skip
    try:
        time.sleep(0.5)
        run_wrk(router.url, args.connections, duration, router.api_key, router.api_keys)
        _, err = spy.communicate(timeout=duration + 30)
    finally:
        if spy.poll() is None:
            spy.kill()
            spy.wait()
    if not raw.exists():
        log(f"profile: py-spy failed: {err.decode(errors='replace')[-300:]}")
        return None
    keep = BENCH_VENVS.parent / "router-overhead-profiles"
    keep.mkdir(parents=True, exist_ok=True)
    kept = keep / f"{re.sub(r'[^a-z0-9]+', '-', label.lower()).strip('-')}.txt"
    shutil.copyfile(raw, kept)
    log(f"profile: collapsed stacks in {kept} (flamegraph.pl or speedscope read them)")
    return summarize_profile(raw.read_text(), label)


_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")
_TIERGATE_DIRS = ("router", "sim_nodes", "tiergate", "operator")


def _area(path: str) -> str:
    """Where a frame's code lives: a tiergate module, else a package or stdlib module."""
    if path.startswith("<frozen importlib") or "__editable__" in path:
        return "import machinery (importlib)"
    if path.startswith("<frozen "):
        return path.strip("<>").replace("frozen ", "")
    parts = path.split("/")
    if parts[0] in _TIERGATE_DIRS:
        return f"tiergate {path}"
    return parts[0].removesuffix(".py")


def summarize_profile(text: str, label: str, top: int = 14) -> str:
    """Self time by area (a router module, a package), and the heaviest functions inclusive.

    `text` is py-spy's raw (collapsed) format: `frame;frame;... count`, root first.
    """
    self_area: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    total = 0
    for line in text.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [f for f in stack.split(";") if f and not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        total += count
        matches = [_FRAME.match(f) for f in frames]
        leaf = matches[-1]
        area = _area(leaf.group("file")) if leaf else frames[-1]
        self_area[area] = self_area.get(area, 0) + count
        seen: set[str] = set()
        for m, f in zip(matches, frames, strict=True):
            key = f"{m.group('func')} ({m.group('file')})" if m else f
            if key not in seen:
                seen.add(key)
                inclusive[key] = inclusive.get(key, 0) + count
    if not total:
        return f"(profile {label}: no samples)"
    lines = [f"**Where the router spends its time ({label}; py-spy, {total:,} samples)**", ""]
    lines += ["| self time in | share |", "|---|---:|"]
    for area, n in sorted(self_area.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"| {area} | {100 * n / total:.1f}% |")
    # Inclusive: skip the frames every request passes through (event loop, uvicorn's cycle).
    ranked = [(k, n) for k, n in inclusive.items() if n < 0.6 * total]
    lines += ["", "| function (inclusive, below the event loop) | share |", "|---|---:|"]
    for key, n in sorted(ranked, key=lambda kv: -kv[1])[:top]:
        lines.append(f"| `{key}` | {100 * n / total:.1f}% |")
    return "\n".join(lines)


# -- report ----------------------------------------------------------------------------------


def verdict(ok: bool) -> str:
    return "met" if ok else "**not met**"


def wrk_table(title: str, rows: list[Row], args: argparse.Namespace) -> list[str]:
    c = args.connections
    lines = [f"### {title}", ""]
    lines += [f"| path | p50 @1 conn (ms) | p99 @1 conn (ms) | req/s @{c} conns "
              f"| p50 @{c} conns (ms) | errors |", "|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    for row in rows:
        if row.server.unavailable is not None:
            lines.append(f"| {row.label} | unavailable: {row.server.unavailable} | | | | |")
        elif not row.available:
            lines.append(f"| {row.label} | not measured | | | | |")
        else:
            lines.append(
                f"| {row.label} | {row.p50():.3f} | {row.p99():.3f} | {row.rps():,.0f} "
                f"| {row.p50_many():.2f} | {row.errors()} |".replace("nan", "n/a")
            )
    return lines


def overhead_lines(rows: list[Row], args: argparse.Namespace) -> tuple[list[str], list[bool]]:
    by = {r.label.split(" ")[0]: r for r in rows}
    direct, nginx, router = by["direct"], by["nginx"], by["tiergate"]
    litellm = by.get("LiteLLM")
    if not (direct.available and router.available):
        return ["(router or direct not measured)"], []
    add50 = router.p50() - direct.p50()
    add99 = router.p99() - direct.p99()
    lines = [
        "",
        f"Router added latency at 1 connection: p50 {add50:+.3f} ms (target <= "
        f"{TARGET_ADDED_P50_MS} ms: {verdict(add50 <= TARGET_ADDED_P50_MS)}), p99 {add99:+.3f} ms "
        f"(target <= {TARGET_ADDED_P99_MS} ms: {verdict(add99 <= TARGET_ADDED_P99_MS)}).",
    ]
    oks = [add50 <= TARGET_ADDED_P50_MS, add99 <= TARGET_ADDED_P99_MS]
    if nginx.available:
        share = router.rps() / nginx.rps()
        oks.append(share >= TARGET_NGINX_SHARE)
        extra = ""
        if litellm is not None and litellm.available and litellm.rps() > 0:
            extra = f"; {router.rps() / litellm.rps():,.0f}x LiteLLM's"
        lines.append(
            f"Router throughput at {args.connections} connections: {100 * share:.0f}% of nginx's "
            f"(target >= {100 * TARGET_NGINX_SHARE:.0f}%: {verdict(share >= TARGET_NGINX_SHARE)})"
            f"{extra}; {100 * router.rps() / direct.rps():.0f}% of direct."
        )
    return lines, oks


# -- main ------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="~1-minute smoke run")
    p.add_argument("--rounds", type=int, default=None, help="wrk rounds per path (default 3)")
    p.add_argument("--duration", type=int, default=None, help="seconds per wrk run (default 2)")
    p.add_argument("--connections", type=int, default=64, help="the throughput load (64)")
    p.add_argument("--sections", default=",".join(SECTIONS),
                   help="comma-separated subset of " + ",".join(SECTIONS))  # fmt: skip
    p.add_argument("--nginx-workers", type=int, default=1,
                   help="nginx workers (1: one process, like the router)")  # fmt: skip
    p.add_argument("--no-litellm", action="store_true", help="skip LiteLLM (row unavailable)")
    p.add_argument("--streams", type=int, default=512)
    p.add_argument("--stream-tokens", type=int, default=None, help="tokens per stream (24)")
    p.add_argument("--stream-rounds", type=int, default=None, help="default 2 (quick: 1)")
    p.add_argument("--stream-clients", type=int, default=1, help="client processes")
    p.add_argument("--stream-ramp", type=float, default=2.0, help="seconds to start all streams")
    p.add_argument(
        "--stream-upstream",
        choices=("fixed", "sim"),
        default="fixed",
        help="what streams: the fixed-rate upstream (default) or a sim node",
    )
    p.add_argument(
        "--stream-interval-ms",
        type=float,
        default=100.0,
        help="the fixed-rate upstream's time between chunks (100)",
    )
    p.add_argument("--stream-model", default="llama-3.1-70b")
    p.add_argument("--stream-accelerator", default="a100-80gb")
    p.add_argument("--endpoints", type=int, default=300, help="the large pool's endpoint count")
    p.add_argument("--profile", action="store_true", help="py-spy the router at 64 connections")
    p.add_argument("--json", type=Path, default=None, help="also write raw figures here")
    args = p.parse_args(argv)
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.duration = args.duration or (1 if args.quick else 2)
    args.stream_tokens = args.stream_tokens or (12 if args.quick else 24)
    args.stream_rounds = args.stream_rounds or (1 if args.quick else 2)
    args.sections = {s.strip() for s in args.sections.split(",") if s.strip()}
    unknown = args.sections - set(SECTIONS)
    if unknown:
        p.error(f"unknown sections: {', '.join(sorted(unknown))}")
    if args.endpoints % 3 or args.endpoints > 3 * 254:
        p.error("--endpoints must be a multiple of 3, at most 762")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _raise_exit)
    signal.signal(signal.SIGHUP, _raise_exit)
    command = "python " + shlex.join(
        [os.path.relpath(__file__), *(sys.argv[1:] if argv is None else argv)]
    )
    ensure_debian_tools({"wrk": "wrk", "nginx": "nginx-light"})
    workdir = Path(tempfile.mkdtemp(prefix="tiergate-router-overhead-"))
    procs = Processes(workdir)
    started = time.monotonic()
    out: list[str] = []
    raw: dict[str, Any] = {"command": command}
    targets: list[tuple[str, bool]] = []
    try:
        run(args, procs, out, raw, targets)
    finally:
        procs.stop_all()
        shutil.rmtree(workdir, ignore_errors=True)
    elapsed = time.monotonic() - started
    header = [
        "## Router overhead benchmark",
        "",
        f"Command: `{command}` ({elapsed:.0f} s). Machine: {os.cpu_count()} cores, "
        f"{_cpu_name()}; Python {sys.version.split()[0]}; "
        f"nginx {tool_version(['nginx', '-v'], r'nginx/([0-9.]+)')} "
        f"({args.nginx_workers} worker{'s' if args.nginx_workers > 1 else ''}); "
        f"wrk {tool_version(['wrk', '-v'], r'wrk (?:debian/)?([0-9.]+)')} (1 thread); "
        f"rounds {args.rounds} x {args.duration} s, medians. Everything on this machine, "
        "client included.",
        "",
    ]
    if targets:
        out += ["### Targets", "", "| target | result |", "|---|---|"]
        out += [f"| {name} | {verdict(ok)} |" for name, ok in targets]
    print("\n".join(header + out))
    if args.json is not None:
        args.json.write_text(json.dumps(raw, indent=2, default=str))
    return 0


def litellm_installed_version() -> str:
    pip = LITELLM_VENV / "bin" / "pip"
    return tool_version([str(pip), "show", "litellm"], r"Version: (\S+)") if pip.exists() else "?"


def _cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown CPU"


def run(
    args: argparse.Namespace,
    procs: Processes,
    out: list[str],
    raw: dict[str, Any],
    targets: list[tuple[str, bool]],
) -> None:
    litellm_version = "" if args.no_litellm else litellm_installed_version()
    for section in ("fixed", "pyfixed", "sim"):
        if section not in args.sections:
            continue
        log(f"[{section}] starting the upstream and the proxies ...")
        if section == "fixed":
            upstream = start_fixed(procs, "fixed")
            title = "Non-streaming, fixed-reply upstream (the proxies' own cost)"
        elif section == "pyfixed":
            upstream = start_fixed(procs, "pyfixed", server="uvicorn")
            title = (
                "Non-streaming, fixed-reply upstream on uvicorn (h11, asyncio: the issue's "
                "reference upstream)"
            )
        else:
            upstream = start_sim_node(procs, "sim", "llama-3.1-8b", "wse-3", 512)
            title = "Non-streaming, sim node upstream (llama-3.1-8b on wse-3, max_tokens 8)"
        nginx = start_nginx(procs, f"nginx-{section}", upstream, args.nginx_workers)
        if args.no_litellm:
            litellm = Server("litellm", "", unavailable="skipped (--no-litellm)")
        else:
            litellm = start_litellm(procs, f"litellm-{section}", upstream)
            if litellm.unavailable is None and litellm_version == "?":
                litellm_version = litellm_installed_version()
        router = start_router(procs, f"router-{section}", [upstream.url], 256)
        rows = [
            Row("direct (upstream)", upstream),
            Row(f"nginx {args.nginx_workers}w", nginx),
            Row(f"LiteLLM {litellm_version} (1 worker)", litellm),
            Row("tiergate router", router),
        ]
        measure_rows(rows, args, section)
        out += wrk_table(title, rows, args)
        lines, oks = overhead_lines(rows, args)
        out += [*lines, ""]
        if section == "fixed" and len(oks) == 3:
            targets += [
                ("added latency p50 <= 0.5 ms at 1 client (fixed upstream)", oks[0]),
                ("added latency p99 <= 2 ms at 1 client (fixed upstream)", oks[1]),
                ("throughput at 64 clients >= 50% of nginx's (raw-asyncio fixed upstream)", oks[2]),
            ]
        if section == "pyfixed" and len(oks) == 3:
            targets.append(
                ("throughput at 64 clients >= 50% of nginx's (uvicorn fixed upstream)", oks[2])
            )
        raw[section] = {r.label: {"one": r.one, "many": r.many,
                                  "unavailable": r.server.unavailable} for r in rows}  # fmt: skip
        if args.profile and section == "fixed":
            log("[fixed] profiling the router ...")
            summary = profile_router(procs, router, args, "1 endpoint, fixed upstream")
            if summary:
                out += [summary, ""]
        for server in (router, litellm, nginx, upstream):
            if server.proc is not None:
                procs.stop(server.proc)
    if "stream" in args.sections:
        stream_section(args, procs, out, raw, targets)
    if "endpoints" in args.sections:
        endpoints_section(args, procs, out, raw, targets)
    if "idle" in args.sections:
        idle_section(args, procs, out, raw)
    if "ledger" in args.sections:
        ledger_section(args, procs, out, raw, targets)


def idle_section(
    args: argparse.Namespace, procs: Processes, out: list[str], raw: dict[str, Any]
) -> None:
    """The router's added latency when each request waits upstream (as an LLM's does) versus
    back-to-back requests: the same router and upstream code, the reply delayed or not."""
    rows: list[Row] = []
    for delay_ms in (0.0, IDLE_DELAY_MS):
        log(f"[idle] upstream replying after {delay_ms:g} ms ...")
        upstream = start_fixed(procs, f"idle-{delay_ms:g}", reply_delay_ms=delay_ms)
        router = start_router(procs, f"router-idle-{delay_ms:g}", [upstream.url], 256)
        pair = [Row(f"direct, reply after {delay_ms:g} ms", upstream),
                Row(f"tiergate router, reply after {delay_ms:g} ms", router)]  # fmt: skip
        measure_rows(pair, args, "idle")
        rows += pair
        for server in (router, upstream):
            if server.proc is not None:
                procs.stop(server.proc)
    out += [
        f"### Idle gaps: the same fixed upstream replying at once and after {IDLE_DELAY_MS:g} ms",
        "",
        "| path | p50 @1 conn (ms) | p99 @1 conn (ms) |",
        "|---|---:|---:|",
        *(f"| {r.label} | {r.p50():.3f} | {r.p99():.3f} |" for r in rows),
        "",
        f"Router added p50 at 1 connection: {rows[1].p50() - rows[0].p50():+.3f} ms with replies "
        f"at once, {rows[3].p50() - rows[2].p50():+.3f} ms with replies after "
        f"{IDLE_DELAY_MS:g} ms (the same router code; it sleeps between requests there).",
        "",
    ]
    raw["idle"] = {r.label: {"one": r.one} for r in rows}


#: The ledger section's tenant: a budget and rate limits that the run never reaches, so every
#: request is admitted through them (and, with PostgreSQL, through the replica's leases).
LEDGER_TENANTS = """\
tenants:
  - name: bench
    apiKeys: ["{key}"]
    requestsPerMinute: 100000000
    tokensPerMinute: 1000000000
    budgetUsd: 1000000
    budgetPeriod: day
"""


def ledger_section(
    args: argparse.Namespace,
    procs: Processes,
    out: list[str],
    raw: dict[str, Any],
    targets: list[tuple[str, bool]],
) -> None:
    """The router with its SQLite ledger and with a PostgreSQL ledger, over the same fixed
    upstream, in alternating order each round; one tenant with a budget and rate limits."""
    sys.path.insert(0, str(HERE.parent / "tests" / "helpers"))
    from postgres_server import started_server  # the tests' private server

    log("[ledger] starting PostgreSQL, the upstream and the routers ...")
    postgres = started_server("tiergate-bench-pg-")
    try:
        key = "sk-bench-" + os.urandom(8).hex()
        tenants = procs.workdir / "ledger-tenants.yaml"
        tenants.write_text(LEDGER_TENANTS.format(key=key))
        upstream = start_fixed(procs, "ledger-fixed")
        sqlite = start_router(procs, "router-sqlite", [upstream.url], 256,
                              tenants_file=tenants, api_key=key)  # fmt: skip
        pg = start_router(procs, "router-postgres", [upstream.url], 256,
                          ledger_url=postgres.dsn(postgres.create_database()),
                          tenants_file=tenants, api_key=key)  # fmt: skip
        rows = [Row("SQLite ledger", sqlite), Row("PostgreSQL ledger", pg)]
        for row in rows:
            run_wrk(row.server.url, args.connections, 1, row.server.api_key)
        for i in range(args.rounds):
            for row in rows if i % 2 == 0 else rows[::-1]:
                measure_round(row, args, f"[ledger] round {i + 1}/{args.rounds}")
        out += ledger_report(rows, args, targets, postgres_version(postgres.bin))
        raw["ledger"] = {r.label: {"one": r.one, "many": r.many} for r in rows}
        if args.profile:
            for row in rows:
                log(f"[ledger] profiling the router with its {row.label} ...")
                summary = profile_router(procs, row.server, args, f"{row.label}, tenant")
                if summary:
                    out += [summary, ""]
        for server in (pg, sqlite, upstream):
            if server.proc is not None:
                procs.stop(server.proc)
    finally:
        postgres.close()


def postgres_version(bin_dir: Path) -> str:
    return tool_version([str(bin_dir / "postgres"), "--version"], r"\) ([0-9.]+)")


def ledger_report(
    rows: list[Row], args: argparse.Namespace, targets: list[tuple[str, bool]], version: str
) -> list[str]:
    """The two ledgers' table, the PostgreSQL row against the SQLite row, and the targets."""
    c = args.connections
    lines = [
        f"### Ledger: SQLite against PostgreSQL {version} (fixed upstream, one tenant with a "
        "budget and rate limits)",
        "",
        f"| ledger | p50 @1 conn (ms) | p99 @1 conn (ms) | req/s @{c} conns "
        f"| router CPU per request @{c} conns (us) | errors |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r.label} | {r.p50():.3f} | {r.p99():.3f} | {r.rps():,.0f} "
        f"| {r.cpu_us_per_request():.0f} | {r.errors()} |"
        for r in rows
    ]
    sqlite, pg = rows
    share = pg.rps() / sqlite.rps() if sqlite.rps() else float("nan")
    added = pg.p50() - sqlite.p50()
    rps_ok = share >= TARGET_POSTGRES_RPS_SHARE
    p50_ok = added <= TARGET_POSTGRES_ADDED_P50_MS
    # Each round measures the two back to back: their ratio there is what a noisy machine moves
    # least.
    pairs = list(zip(sqlite.many, pg.many, strict=True))
    round_share = statistics.median(b.rps / a.rps for a, b in pairs if a.rps)
    ones = zip(sqlite.one, pg.one, strict=True)
    round_added = statistics.median(b.p50_ms - a.p50_ms for a, b in ones)
    lines += [
        "",
        f"PostgreSQL against SQLite: {100 * share:.0f}% of the throughput at {c} connections "
        f"(target >= {100 * TARGET_POSTGRES_RPS_SHARE:.0f}%: {verdict(rps_ok)}), p50 at 1 "
        f"connection {added:+.3f} ms (target <= +{TARGET_POSTGRES_ADDED_P50_MS} ms: "
        f"{verdict(p50_ok)}). Round by round (the two measured back to back), medians: "
        f"{100 * round_share:.0f}% of the throughput, p50 {round_added:+.3f} ms.",
        "",
    ]
    targets += [
        (f"PostgreSQL ledger throughput at {c} clients >= 80% of SQLite's", rps_ok),
        ("PostgreSQL ledger p50 at 1 client <= SQLite's + 0.2 ms", p50_ok),
    ]
    return lines


def stream_section(
    args: argparse.Namespace,
    procs: Processes,
    out: list[str],
    raw: dict[str, Any],
    targets: list[tuple[str, bool]],
) -> None:
    if args.stream_upstream == "sim":
        log("[stream] starting a sim node and the router ...")
        node = start_sim_node(procs, "stream-node", args.stream_model, args.stream_accelerator, 512)
        source = f"sim node ({args.stream_model} on {args.stream_accelerator}"
    else:
        log("[stream] starting the fixed-rate stream upstream and the router ...")
        node = start_fixed(procs, "stream-fixed", args.stream_interval_ms)
        source = f"fixed-rate upstream (a chunk every {args.stream_interval_ms:g} ms"
    router = start_router(procs, "router-stream", [node.url], 512)
    direct, routed = StreamStats(), StreamStats()
    with ProcessPoolExecutor(args.stream_clients, mp_context=get_context("spawn")) as pool:
        run_streams(pool, node.url, "/health", args, 4)  # warm-up, both paths
        run_streams(pool, router.url, "/healthz", args, 4)
        for i in range(args.stream_rounds):
            for name, url, health, stats in (
                ("direct", node.url, "/health", direct),
                ("router", router.url, "/healthz", routed),
            ):
                r = run_streams(pool, url, health, args, args.stream_tokens)
                stats.rounds.append(r)
                log(
                    f"[stream] round {i + 1}/{args.stream_rounds} {name}: {r.chunks} chunks in "
                    f"{r.wall_s:.1f} s; received-written p50 {quantile_ms(r.lags_s, 0.5):.2f} "
                    f"ms p99 {quantile_ms(r.lags_s, 0.99):.2f} ms; max gap "
                    f"{1000 * max(r.max_gaps_s, default=0):.0f} ms; failed {r.failed}"
                    + (f" ({', '.join(sorted(set(r.failures)))})" if r.failures else "")
                )
    gc_line = router_gc_pauses(router)
    for server in (router, node):
        if server.proc is not None:
            procs.stop(server.proc)
    add50 = routed.lag(0.5) - direct.lag(0.5)
    add99 = routed.lag(0.99) - direct.lag(0.99)
    c = args.streams
    out += [
        f"### Streaming: {c} concurrent streams, {source}, {args.stream_tokens} tokens each)",
        "",
        "| path | tokens/s | received - written p50 (ms) | p99 (ms) | first chunk p99 (ms) "
        "| max gap between chunks (ms) | streams stalled | failed |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, s in (("direct", direct), ("tiergate router", routed)):
        out.append(
            f"| {name} | {s.tokens_per_s():,.0f} | {s.lag(0.5):.2f} | {s.lag(0.99):.2f} "
            f"| {s.first_chunk_p99():.0f} | {s.max_gap_ms():.0f} | {s.stalled()} | {s.failed()} |"
        )
    stalls = routed.stalled() + routed.failed()
    baseline_ok = direct.lag(0.99) <= BASELINE_SANE_MS and direct.stalled() == 0
    delay_verdict = (
        verdict(add99 <= TARGET_STREAM_P99_MS)
        if baseline_ok
        else f"inconclusive: direct p99 is {direct.lag(0.99):.0f} ms, the machine is saturated"
    )
    out += [
        "",
        f"Router added delay per token: p50 {add50:+.2f} ms, p99 {add99:+.2f} ms (target p99 <= "
        f"{TARGET_STREAM_P99_MS} ms: {delay_verdict}); streams through the router that stalled "
        f"(a chunk delivered > {STALL_S:.0f} s after the node wrote it) or failed: {stalls} of "
        f"{c * len(routed.rounds)} ({verdict(stalls == 0)}). Received-minus-written includes the "
        "Python client's own lag, the same on both paths; gaps between chunks include the "
        "source's own schedule.",
        "",
        gc_line,
        "",
    ]
    targets += [
        (f"{c} streams through the router without stalls", stalls == 0),
        ("per-token added delay p99 <= 2 ms", baseline_ok and add99 <= TARGET_STREAM_P99_MS),
    ]
    raw["stream"] = {
        "direct": {"p50_ms": direct.lag(0.5), "p99_ms": direct.lag(0.99)},
        "router": {"p50_ms": routed.lag(0.5), "p99_ms": routed.lag(0.99)},
    }


_GC_SAMPLE = re.compile(r'^tiergate_gc_pause_seconds_(count|sum)\{generation="(\d)"\} (\S+)$', re.M)


def router_gc_pauses(router: Server) -> str:
    """The router's garbage-collector pauses so far (its /metrics), as one line."""
    try:
        with urllib.request.urlopen(router.metrics_url, timeout=10) as reply:
            text = reply.read().decode()
    except OSError as exc:
        return f"(the router's GC pauses could not be read: {exc})"
    found: dict[tuple[str, str], float] = {
        (generation, kind): float(value) for kind, generation, value in _GC_SAMPLE.findall(text)
    }
    parts = []
    for generation in ("0", "1", "2"):
        count = found.get((generation, "count"), 0.0)
        total = found.get((generation, "sum"), 0.0)
        mean = f", mean {1000 * total / count:.2f} ms" if count else ""
        parts.append(f"generation {generation}: {count:.0f} pauses{mean}")
    return (
        "Router GC pauses over the section (tiergate_gc_pause_seconds): " + "; ".join(parts) + "."
    )


#: The router's metrics scraper's cap (`max_scrapes_per_s`, router/discovery/scraper.py).
SCRAPES_PER_S = 50


@dataclass
class Layout:
    """One router of the endpoint-count section: its endpoints, over how many pools."""

    urls: list[str]
    pools: int
    row: Row | None = None
    idle: list[float] = field(default_factory=list)  # the idle router's CPU, cores, per round

    @property
    def label(self) -> str:
        return f"{len(self.urls)}" + (f" in {self.pools} pools" if self.pools > 1 else "")

    def background_us(self) -> list[float]:
        """Per round: the idle router's CPU rate (metrics scraping, timers) spread over that
        round's requests, us per request. It runs under load too, off the request path."""
        assert self.row is not None
        return [
            1e6 * idle / max(m.rps, 1e-9) for m, idle in zip(self.row.many, self.idle, strict=True)
        ]

    def request_path_us(self) -> float:
        """Median over rounds of the CPU per request less the background."""
        assert self.row is not None
        return statistics.median(
            1e6 * m.cpu_s / max(m.requests, 1) - bg
            for m, bg in zip(self.row.many, self.background_us(), strict=True)
        )


def endpoints_section(
    args: argparse.Namespace,
    procs: Processes,
    out: list[str],
    raw: dict[str, Any],
    targets: list[tuple[str, bool]],
) -> None:
    """Routers over 3, 30 and `--endpoints` endpoints in one pool, and over the large count in
    pools of 3. One router runs at a time (an idle one still scrapes its endpoints), each
    round starts each afresh, in an order rotated every round, so the machine's drift over
    the section falls on every layout alike."""
    log("[endpoints] starting 3 fixed-reply upstreams ...")
    upstreams = [start_fixed(procs, f"fixed-ep{i}") for i in range(3)]
    ports = [u.url.rsplit(":", 1)[1] for u in upstreams]

    def urls(count: int) -> list[str]:
        return [f"http://127.0.0.{host}:{p}" for host in range(1, count // 3 + 1) for p in ports]

    # 3 (fewer than the router's sample of 8), a tenth of the large pool, the large pool, and
    # the large count as pools of 3 (the pool count on the request path).
    counts = sorted({3, max(3, args.endpoints // 30 * 3), args.endpoints})
    layouts = [Layout(urls(count), 1) for count in counts]
    if args.endpoints > 3:
        layouts.append(Layout(urls(args.endpoints), args.endpoints // 3))
    profiles: list[str] = []
    for i in range(args.rounds):
        shift = i % len(layouts)
        for layout in layouts[shift:] + layouts[:shift]:
            name = f"router-ep{len(layout.urls)}-p{layout.pools}"
            router = start_router(procs, name, layout.urls, 256, pools=layout.pools)
            assert router.proc is not None
            # Until the scraper (50 endpoints a second) has opened a connection to every
            # endpoint, as it has in a router that has been up for a while.
            time.sleep(1.0 + len(layout.urls) / SCRAPES_PER_S)
            before, t0 = cpu_seconds(router.proc.pid), time.monotonic()
            time.sleep(2.0 if not args.quick else 1.0)
            layout.idle.append((cpu_seconds(router.proc.pid) - before) / (time.monotonic() - t0))
            if layout.row is None:
                layout.row = Row(f"tiergate router, {layout.label} endpoints", router)
            layout.row.server = router
            run_wrk(router.url, args.connections, 1)  # warm up
            measure_round(layout.row, args, f"[endpoints] round {i + 1}/{args.rounds}")
            if args.profile and i == 0:
                log(f"[endpoints] profiling the router with {layout.label} endpoints ...")
                summary = profile_router(procs, router, args, f"{layout.label} endpoints")
                if summary:
                    profiles += [summary, ""]
            procs.stop(router.proc)
    for u in upstreams:
        if u.proc is not None:
            procs.stop(u.proc)
    out += endpoints_report(layouts, args, targets, profiles)
    raw["endpoints"] = {
        layout.label: {"one": layout.row.one, "many": layout.row.many, "idle_cpu": layout.idle}
        for layout in layouts
        if layout.row is not None
    }


def endpoints_report(
    layouts: list[Layout],
    args: argparse.Namespace,
    targets: list[tuple[str, bool]],
    profiles: list[str],
) -> list[str]:
    c = args.connections
    out = [
        f"### Endpoint count: one pool of 3 vs {args.endpoints} endpoints, and "
        f"{args.endpoints} in pools of 3 (3 fixed-reply processes; medians of {args.rounds} "
        "rounds, each router started afresh)",
        "",
        f"| endpoints | router CPU per request @{c} conns (us) | of which background (us) "
        f"| request path (us) | user (us) | req/s @{c} conns | p50 @{c} conns (ms) "
        "| p50 @1 conn (ms) | p99 @1 conn (ms) | idle router CPU | errors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for layout in layouts:
        row = layout.row
        assert row is not None
        out.append(
            f"| {layout.label} | {row.cpu_us_per_request():.0f} "
            f"| {statistics.median(layout.background_us()):.0f} "
            f"| {layout.request_path_us():.0f} | {row.cpu_user_us_per_request():.0f} "
            f"| {row.rps():,.0f} | {row.p50_many():.2f} | {row.p50():.3f} | {row.p99():.3f} "
            f"| {100 * statistics.median(layout.idle):.0f}% of a core "
            f"| {row.errors()} |".replace("nan", "n/a (no reply in the run)")
        )
    one_pool = [layout for layout in layouts if layout.pools == 1]
    large = one_pool[-1]
    lines: list[str] = []
    flat = True
    comparisons = [(large, small) for small in one_pool[:-1]]
    comparisons += [(layout, large) for layout in layouts if layout.pools > 1]
    for big, small in comparisons:
        assert big.row is not None and small.row is not None
        path_change = big.request_path_us() / small.request_path_us() - 1
        cpu_change = big.row.cpu_us_per_request() / small.row.cpu_us_per_request() - 1
        p50_change = big.row.p50() - small.row.p50()
        ok = path_change <= 0.10 and p50_change <= 0.1  # False when nan (no reply at all)
        if (small.pools == 1 and len(small.urls) == 3) or big.pools > 1:
            flat = flat and ok
        lines.append(
            f"{big.label} vs {small.label} endpoints: the router's CPU per request on the "
            f"request path {100 * path_change:+.0f}% (all of it {100 * cpu_change:+.0f}%), p50 "
            f"at 1 connection {p50_change:+.3f} ms ({verdict(ok)}: flat means the request "
            "path within 10% and p50 within 0.1 ms).".replace("+nan", "n/a: no reply")
        )
    targets.append(
        (f"router cost on the request path flat from 3 to {args.endpoints} endpoints, and "
         "from 1 pool to many", flat)
    )  # fmt: skip
    return [
        *out,
        "",
        *lines,
        "(Background: the idle router's CPU rate, mostly metrics scraping, capped at 50 "
        "endpoints a second, spread over the run's requests; it runs under load as well, off "
        "the request path. req/s is the whole machine's: wrk, the router and the upstreams "
        "share its 2 cores.)",
        "",
        *profiles,
    ]


if __name__ == "__main__":
    sys.exit(main())
