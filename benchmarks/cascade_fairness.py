"""Benchmark: a well-behaved tenant's cascade throughput while other tenants send schemas that
take forever to check, before and after a change, in one run.

Starts two sim nodes (frontier-spark on wse-3 for the cascade's first tier, frontier on b200
for the second) and one router per code version on 127.0.0.1, each with the same tenants
file. `after` is this checkout; `before` is `--before` (a commit, default d611b28), exported
with `git archive` into a temporary directory and imported ahead of this checkout's editable
install (PYTHONPATH to a symlink view, as `make view` builds): same interpreter, same
dependencies, same sim nodes, only the router's code differs.

A measurement is one load process (async httpx): tenant `alice` with `--clients` clients
sending cascades (`x-tiergate-cascade: wafer-scale>premium`, a plain tool schema) back to
back, and 0, 1, 2 or 3 abusive tenants with `--abuser-clients` clients each, sending
cascades whose tool schema is exponential `$ref`-in-`anyOf` (a string tried 2^40 ways). The
abusers start `--warmup` seconds before the window, as in a sustained attack; alice's
requests completed within the window of `--seconds` are counted, and her non-escalated
replies whose tool call is malformed (her check was given up) too. Abusive tenants are fresh
for each measurement (a budget spent in one does not carry over). A control row has three
other tenants send as many requests with the plain schema: what their load alone costs alice.
Versions and scenarios alternate within each of `--rounds` rounds; medians are printed as a
markdown table.

Not a test: the figures go into benchmarks/README.md with the commit they were measured at.

    .venv/bin/python -P benchmarks/cascade_fairness.py [--rounds 3] [--seconds 5] [--warmup 4]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("router", "sim_nodes", "operator")
#: Other tenants sending at once, and whether their schemas are exponential; the last is the
#: control: as many requests from other tenants, with a schema that is quick to check.
SCENARIOS = ((0, True), (1, True), (2, True), (3, True), (3, False))
TOOL = {"type": "function", "function": {"name": "run", "parameters": {
    "type": "object", "required": ["cmd"], "additionalProperties": False,
    "properties": {"cmd": {"type": "string"}, "timeout": {"type": "integer"}},
}}}  # fmt: skip
# `cmd` is a string to the node; to the validator it must also match l0, which refers to l1
# twice (anyOf), and so on down to an integer.
EXPONENTIAL_TOOL = {"type": "function", "function": {"name": "run", "parameters": {
    "$defs": {**{f"l{n}": {"anyOf": [{"$ref": f"#/$defs/l{n + 1}"}] * 2} for n in range(40)},
              "l40": {"type": "integer"}},
    "type": "object", "required": ["cmd"],
    "properties": {"cmd": {"type": "string", "$ref": "#/$defs/l0"}},
}}}  # fmt: skip


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def key(tenant: str) -> str:
    return f"{tenant}-key-0123456789"


# -- processes -------------------------------------------------------------------------------


class Processes:
    """Every process started, each in its own group, all stopped on exit."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, cmd: Sequence[str], env: dict[str, str] | None = None) -> None:
        with (self.workdir / f"{name}.log").open("wb") as out:
            self.procs.append(
                subprocess.Popen(
                    list(cmd),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )  # fmt: skip
            )

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)


def wait_ready(url: str, within_s: float = 60.0) -> None:
    deadline = time.monotonic() + within_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not answer 200 within {within_s:g} s")
        time.sleep(0.1)


def start_sim_node(procs: Processes, name: str, flags: Sequence[str]) -> str:
    port = free_port()
    cmd = [sys.executable, "-P", "-m", "tiergate", "sim-node", *flags, "--port", str(port),
           "--log-level", "warning"]  # fmt: skip
    procs.start(name, cmd)
    url = f"http://127.0.0.1:{port}"
    wait_ready(url + "/ready")
    return url


def baseline_view(ref: str, workdir: Path) -> tuple[Path, str]:
    """`ref`'s packages laid out as `tiergate.*` (for PYTHONPATH), and its short hash."""
    commit = subprocess.check_output(
        ["git", "-C", str(ROOT), "rev-parse", "--short", ref], text=True
    ).strip()
    tree = workdir / f"src-{commit}"
    tree.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit, "tiergate", *PACKAGES],
        check=True, capture_output=True,
    ).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    view = workdir / f"view-{commit}"
    (view / "tiergate").mkdir(parents=True)
    for file in (tree / "tiergate").glob("*.py"):
        (view / "tiergate" / file.name).symlink_to(file)
    for package in PACKAGES:
        (view / "tiergate" / package).symlink_to(tree / package)
    return view, commit


def start_router(
    procs: Processes, name: str, spark: str, full: str, tenants: Path, view: Path | None
) -> str:
    port = free_port()
    config = {
        "router": {"host": "127.0.0.1", "port": port, "metricsPort": free_port(),
                   "tenantsFile": str(tenants),
                   "ledgerPath": str(procs.workdir / f"{name}-ledger.sqlite")},
        "pools": [
            {"name": "spark", "tier": "wafer-scale", "model": "frontier-spark",
             "accelerator": "wse-3", "chips": 2, "batching": {"maxNumSeqs": 64},
             "endpoints": [spark]},
            {"name": "full", "tier": "premium", "model": "frontier", "accelerator": "b200",
             "chips": 8, "tensorParallel": 8, "weightDtype": "fp8", "kvDtype": "fp8",
             "batching": {"maxNumSeqs": 64}, "endpoints": [full]},
        ],
    }  # fmt: skip
    path = procs.workdir / f"{name}.yaml"
    path.write_text(json.dumps(config, indent=2))
    env = dict(os.environ)
    if view is not None:
        env["PYTHONPATH"] = str(view)
    cmd = [sys.executable, "-P", "-m", "tiergate", "router", "--config", str(path),
           "--log-level", "warning"]  # fmt: skip
    procs.start(name, cmd, env)
    url = f"http://127.0.0.1:{port}"
    wait_ready(url + "/readyz")
    return url


# -- the load (a process of its own) ---------------------------------------------------------


async def load(url: str, abusers: list[str], exponential: bool, clients: int,
               abuser_clients: int, warmup_s: float, seconds: float) -> dict[str, Any]:  # fmt: skip
    """Alice's completions in the window, and what else happened."""
    import httpx

    from tiergate.router.request.tool_calls import tool_call_problem

    loop = asyncio.get_running_loop()
    start = loop.time()
    window = (start + warmup_s, start + warmup_s + seconds)
    counts = {"alice": 0, "alice_malformed_served": 0, "alice_errors": 0, "abusive_sent": 0}

    async def send(client: httpx.AsyncClient, tenant: str, seed: int, tool: Any) -> Any:
        body = {"model": "frontier-spark", "messages": [{"role": "user", "content": "ls"}],
                "tools": [tool], "seed": seed, "max_tokens": 16}  # fmt: skip
        headers = {"x-tiergate-cascade": "wafer-scale>premium",
                   "authorization": f"Bearer {key(tenant)}"}  # fmt: skip
        return await client.post(url + "/v1/chat/completions", json=body, headers=headers)

    async def alice(client: httpx.AsyncClient, n: int) -> None:
        seed = n * 1_000_000
        while loop.time() < window[1]:
            r = await send(client, "alice", seed, TOOL)
            seed += 1
            if not window[0] <= loop.time() <= window[1]:
                continue
            if r.status_code != 200:
                counts["alice_errors"] += 1
                continue
            counts["alice"] += 1
            kept = r.headers.get("x-tiergate-escalated") == "false"
            if kept and tool_call_problem(r.json(), {"tools": [TOOL]}) is not None:
                counts["alice_malformed_served"] += 1

    async def abuse(client: httpx.AsyncClient, tenant: str, n: int) -> None:
        seed = n * 1_000_000
        while loop.time() < window[1]:
            with contextlib.suppress(httpx.HTTPError):
                await send(client, tenant, seed, EXPONENTIAL_TOOL if exponential else TOOL)
                counts["abusive_sent"] += 1
            seed += 1

    limits = httpx.Limits(max_connections=clients + len(abusers) * abuser_clients + 4)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        tasks = [abuse(client, t, n) for t in abusers for n in range(abuser_clients)]
        tasks += [alice(client, n) for n in range(clients)]
        await asyncio.gather(*tasks)
    return counts


def run_load(
    url: str, abusers: list[str], exponential: bool, args: argparse.Namespace
) -> dict[str, Any]:
    cmd = [sys.executable, "-P", str(Path(__file__).resolve()), "--load", url,
           "--abuser-names", ",".join(abusers), "--clients", str(args.clients),
           *([] if exponential else ["--plain"]),
           "--abuser-clients", str(args.abuser_clients), "--warmup", str(args.warmup),
           "--seconds", str(args.seconds)]  # fmt: skip
    result: dict[str, Any] = json.loads(subprocess.check_output(cmd))
    return result


# -- the run ---------------------------------------------------------------------------------


@dataclass
class Cell:
    alice: list[int]
    abusive: list[int]
    malformed_served: int = 0
    errors: int = 0


def measure(args: argparse.Namespace) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="tiergate-cascade-fairness-"))
    procs = Processes(workdir)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        view, before = baseline_view(args.before, workdir)
        after = subprocess.check_output(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], text=True
        ).strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "diff", "--quiet", "HEAD"]).returncode
        after += "+changes" if dirty else ""

        def others(r: int, s: int) -> list[str]:
            return [f"m{r}-{s}-{i}" for i in range(SCENARIOS[s][0])]

        names = [t for r in range(args.rounds) for s in range(len(SCENARIOS)) for t in others(r, s)]
        tenants = workdir / "tenants.yaml"
        tenants.write_text("tenants:\n" + "".join(
            f"  - {{name: {t}, apiKeys: [{key(t)}]}}\n" for t in ["alice", *names]))  # fmt: skip
        spark = start_sim_node(procs, "spark", ["--model", "frontier-spark", "--accelerator",
                               "wse-3", "--chips", "2", "--max-num-seqs", "64"])  # fmt: skip
        full = start_sim_node(procs, "full", ["--model", "frontier", "--accelerator", "b200",
                              "--chips", "8", "--tensor-parallel", "8", "--weight-dtype", "fp8",
                              "--kv-dtype", "fp8", "--max-num-seqs", "64"])  # fmt: skip
        versions = {
            f"before ({before})": start_router(procs, "before", spark, full, tenants, view),
            f"after ({after})": start_router(procs, "after", spark, full, tenants, None),
        }
        cells = {(v, s): Cell([], []) for v in versions for s in range(len(SCENARIOS))}
        for r in range(args.rounds):
            order = list(versions.items())
            if r % 2:
                order.reverse()
            for s, (n, exponential) in enumerate(SCENARIOS):
                for version, url in order:
                    counts = run_load(url, others(r, s), exponential, args)
                    cell = cells[(version, s)]
                    cell.alice.append(counts["alice"])
                    cell.abusive.append(counts["abusive_sent"])
                    cell.malformed_served += counts["alice_malformed_served"]
                    cell.errors += counts["alice_errors"]
                    label = f"{n} {'exponential' if exponential else 'plain'}"
                    log(f"round {r + 1} {version} others={label}: {json.dumps(counts)}")
                    time.sleep(args.gap)  # the last slow checks end (their 1 s deadline)
        print_table(args, versions, cells)
    finally:
        procs.stop_all()
        if args.keep_logs:
            log(f"logs kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def print_table(args: argparse.Namespace, versions: dict[str, str],
                cells: dict[tuple[str, int], Cell]) -> None:  # fmt: skip
    command = " ".join(["python -P benchmarks/cascade_fairness.py", *sys.argv[1:]])
    print(f"\n`{command}`: alice's cascades completed per {args.seconds:g} s "
          f"({args.clients} clients; other tenants {args.abuser_clients} clients each, started "
          f"{args.warmup:g} s before the window), median of {args.rounds} rounds [each round]; "
          f"the other tenants' requests in the same runs, median; malformed tool calls served "
          f"to alice (her check given up), all rounds\n")  # fmt: skip
    names = list(versions)
    print("| other tenants | alice: " + " | alice: ".join(names)
          + " | theirs (before / after) | malformed served (before / after) |")  # fmt: skip
    print("|---|" + "---|" * len(names) + "---|---|")
    for s, (n, exponential) in enumerate(SCENARIOS):
        label = f"{n}, exponential schemas" if exponential else f"{n}, plain schemas (control)"
        row = [f"{statistics.median(cells[(v, s)].alice):g} {cells[(v, s)].alice}" for v in names]
        theirs = " / ".join(f"{statistics.median(cells[(v, s)].abusive):g}" for v in names)
        served = " / ".join(str(cells[(v, s)].malformed_served) for v in names)
        errors = sum(cells[(v, s)].errors for v in names)
        note = f" ({errors} errors)" if errors else ""
        print(f"| {label} | " + " | ".join(row) + f" | {theirs} | {served}{note} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="d611b28", help="the commit to compare with")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0, help="the counted window")
    parser.add_argument("--warmup", type=float, default=4.0, help="seconds before the window opens")
    parser.add_argument("--gap", type=float, default=1.0, help="pause between measurements")
    parser.add_argument("--clients", type=int, default=4, help="alice's concurrent clients")
    parser.add_argument("--abuser-clients", type=int, default=2)
    parser.add_argument("--keep-logs", action="store_true", help="keep the processes' logs")
    parser.add_argument("--load", help=argparse.SUPPRESS)  # internal: be the load process
    parser.add_argument("--abuser-names", default="", help=argparse.SUPPRESS)
    parser.add_argument("--plain", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.load:
        abusers = [a for a in args.abuser_names.split(",") if a]
        counts = asyncio.run(load(args.load, abusers, not args.plain, args.clients,
                                  args.abuser_clients, args.warmup, args.seconds))  # fmt: skip
        print(json.dumps(counts))
        return
    measure(args)


if __name__ == "__main__":
    main()
