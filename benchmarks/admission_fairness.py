"""Benchmark: a tier's fair admission (`admissionOrder: fair`) against first come, first
served (`fcfs`), in one run: what the fair order costs the router, and what it gives tenants.

Starts everything itself on 127.0.0.1 (free ports), prints markdown tables (with the command
and the commit) and stops everything on any exit.

1. `cost`: router_overhead.py's 64-connection measurement (wrk against its fixed-reply
   upstream; the router's own CPU per request, read from /proc) of two routers that differ
   only in their admission order, in three settings: capacity 256 and no tenants (nothing
   waits: router_overhead's plain row); capacity 256 and four tenants (weights 1/1/2/4, wrk
   sending their keys in turn); capacity 32 and the four tenants, so that up to 32 of the 64
   requests wait in the router's queue and most slots are handed on by the queue's order.
   (Capacity 32, not less: a tier's wait queue holds as many requests as its capacity, at
   least 16, and a smaller tier would shed part of the 64 instead of queueing them.) The
   routers run side by side; each round measures every setting's pair back to back, the
   pair's order alternating. Target: fair's CPU per request within 5% of fcfs's.
2. `flood`: two sim nodes, each with a fair and a fcfs router in front of it, loaded by
   `tiergate bench --tenants` (its `--json`): tenants a, b and c (weights 1/1/2) from 24, 8
   and 8 clients, ten times the tier's 4 slots (llama-3.1-8b on one h100-sxm); and a heavy
   tenant (48 clients, 16-token prompts, replies of 8 to 24 tokens) with a light one (one
   client, a 1000-token prompt, 8 tokens, 1.5 s between a reply and its next request) on a
   tier of 16 slots (llama-3.1-70b on four a100-80gb), the light tenant also alone for its
   idle figures. Per tenant: its share of the tokens served against its weight's, TTFT
   p50/p90 (successful requests), 429s; medians over rounds, fair and fcfs alternating.

`--profile` adds one py-spy run per router of the queued setting (router_overhead's).

    .venv/bin/python -P benchmarks/admission_fairness.py [--quick] [--rounds 5]
        [--sections cost,flood] [--profile]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import router_overhead as ro  # noqa: E402  (its processes, servers, wrk and profiler)

SECTIONS = ("cost", "flood")
ORDERS = ("fair", "fcfs")
#: The flood section's routers: the two orders, and fair admission with a headroom slot per
#: pool held back for a tenant below its share (router.headroomPerPool).
VARIANTS: dict[str, dict[str, Any]] = {
    "fair": {"admissionOrder": "fair"},
    "fcfs": {"admissionOrder": "fcfs"},
    "fair, headroom": {"admissionOrder": "fair", "headroomPerPool": 1},
}
#: The cost section's tenants and their weights; wrk sends their keys in turn.
COST_WEIGHTS = {"t1": 1, "t2": 1, "t3": 2, "t4": 4}
#: The queued setting's capacity: half the 64 connections, and a wait queue (as long as the
#: capacity) that holds the other half.
QUEUED_CAPACITY = 32
#: Fair's CPU per request may exceed fcfs's by at most this share.
TARGET_CPU_GROWTH = 0.05
#: The flood section's tenants and their weights.
FLOOD_WEIGHTS = {"a": 1, "b": 1, "c": 2, "heavy": 1, "light": 1}


def key(tenant: str) -> str:
    return f"sk-bench-{tenant}-0123456789"


def tenants_file(path: Path, weights: dict[str, int]) -> Path:
    """The router's tenants file: each tenant its key and weight."""
    path.write_text(
        "tenants:\n"
        + "".join(
            f"  - {{name: {t}, apiKeys: [{key(t)}], weight: {w}}}\n" for t, w in weights.items()
        )
    )
    return path


# -- cost ------------------------------------------------------------------------------------


@dataclass
class Waits:
    """The router's admission waits over one wrk run (tiergate_admission_wait_seconds)."""

    count: float = 0.0
    total_s: float = 0.0
    over_5ms: float = 0.0


def admission_waits(metrics_url: str) -> Waits:
    with urllib.request.urlopen(metrics_url, timeout=10) as reply:
        text = reply.read().decode()
    found = Waits()
    for family in text_string_to_metric_families(text):
        if family.name != "tiergate_admission_wait_seconds":
            continue
        for s in family.samples:
            if s.name.endswith("_count"):
                found.count += s.value
            elif s.name.endswith("_sum"):
                found.total_s += s.value
            elif s.name.endswith("_bucket") and s.labels.get("le") == "0.005":
                found.over_5ms -= s.value
    found.over_5ms += found.count
    return found


@dataclass
class CostRow:
    setting: str
    order: str
    row: ro.Row
    waits: list[Waits] = field(default_factory=list)


def measure(cost: CostRow, args: argparse.Namespace, prefix: str) -> None:
    """One wrk run at `args.connections`, the router's CPU and its admission waits around it."""
    server = cost.row.server
    assert server.proc is not None
    w0 = admission_waits(server.metrics_url)
    user0, sys0 = ro.cpu_times(server.proc.pid)
    load = ro.run_wrk(server.url, args.connections, args.duration, server.api_key, server.api_keys)
    user1, sys1 = ro.cpu_times(server.proc.pid)
    w1 = admission_waits(server.metrics_url)
    load.cpu_s, load.cpu_user_s = user1 + sys1 - user0 - sys0, user1 - user0
    cost.row.many.append(load)
    waits = Waits(w1.count - w0.count, w1.total_s - w0.total_s, w1.over_5ms - w0.over_5ms)
    cost.waits.append(waits)
    ro.log(
        f"{prefix} {cost.setting}, {cost.order}: {load.rps:,.0f} req/s, "
        f"{1e6 * load.cpu_s / max(load.requests, 1):.0f} us CPU/req, "
        f"{100 * waits.over_5ms / max(waits.count, 1):.0f}% waited > 5 ms"
        + (f"; {load.errors} errors" if load.errors else "")
    )


def cost_section(args: argparse.Namespace, procs: ro.Processes, out: list[str]) -> bool:
    ro.log("[cost] starting the fixed-reply upstream and six routers ...")
    upstream = ro.start_fixed(procs, "fixed")
    tenants = tenants_file(procs.workdir / "cost-tenants.yaml", COST_WEIGHTS)
    keys = [key(t) for t in COST_WEIGHTS]
    settings = [
        ("capacity 256, no tenants", 256, False),
        (f"capacity 256, {len(keys)} tenants", 256, True),
        (f"capacity {QUEUED_CAPACITY}, {len(keys)} tenants", QUEUED_CAPACITY, True),
    ]
    pairs: list[list[CostRow]] = []
    for n, (label, capacity, with_tenants) in enumerate(settings):
        pair = []
        for order in ORDERS:
            router = ro.start_router(
                procs, f"router-{n}-{order}", [upstream.url], capacity,
                tenants_file=tenants if with_tenants else None,
                api_keys=keys if with_tenants else (),
                extra_settings={"admissionOrder": order},
            )  # fmt: skip
            pair.append(CostRow(label, order, ro.Row(f"{label}, {order}", router)))
        pairs.append(pair)
    for cost in (c for pair in pairs for c in pair):  # warm up
        ro.run_wrk(cost.row.server.url, args.connections, 1, None, cost.row.server.api_keys)
    for i in range(args.rounds):
        for pair in pairs:
            for cost in pair if i % 2 == 0 else pair[::-1]:
                measure(cost, args, f"[cost] round {i + 1}/{args.rounds}")
    profiles = []
    if args.profile:
        for cost in pairs[-1]:
            ro.log(f"[cost] profiling the {cost.order} router, {cost.setting} ...")
            summary = ro.profile_router(procs, cost.row.server, args, cost.row.label)
            if summary:
                profiles += [summary, ""]
    lines, ok = cost_report(pairs, args)
    out += [*lines, *profiles]
    for cost in (c for pair in pairs for c in pair):
        if cost.row.server.proc is not None:
            procs.stop(cost.row.server.proc)
    return ok


def cost_report(pairs: list[list[CostRow]], args: argparse.Namespace) -> tuple[list[str], bool]:
    c = args.connections
    lines = [
        f"### Admission cost: fair against fcfs at {c} connections (fixed-reply upstream; "
        f"medians of {args.rounds} rounds of {args.duration} s)",
        "",
        f"| setting | order | req/s | router CPU per request (us) | of which user (us) "
        f"| p50 @{c} conns (ms) | requests waiting > 5 ms | mean wait (ms) | errors |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for cost in (c for pair in pairs for c in pair):
        row = cost.row
        waited = statistics.median(100 * w.over_5ms / max(w.count, 1) for w in cost.waits)
        mean_wait = statistics.median(1000 * w.total_s / max(w.count, 1) for w in cost.waits)
        lines.append(
            f"| {cost.setting} | {cost.order} | {row.rps():,.0f} | {row.cpu_us_per_request():.0f} "
            f"| {row.cpu_user_us_per_request():.0f} | {row.p50_many():.2f} | {waited:.0f}% "
            f"| {mean_wait:.2f} | {row.errors()} |"
        )
    lines.append("")
    all_ok = True
    for fair, fcfs in pairs:
        growth = fair.row.cpu_us_per_request() / fcfs.row.cpu_us_per_request() - 1
        rounds = [
            (a.cpu_s / max(a.requests, 1)) / (b.cpu_s / max(b.requests, 1)) - 1
            for a, b in zip(fair.row.many, fcfs.row.many, strict=True)
        ]
        ok = growth <= TARGET_CPU_GROWTH
        all_ok = all_ok and ok
        lines.append(
            f"- {fair.setting}: fair's CPU per request {100 * growth:+.1f}% against fcfs's "
            f"(round by round, the two back to back: median {100 * statistics.median(rounds):+.1f}%"
            f" [{', '.join(f'{100 * r:+.1f}%' for r in rounds)}]; target <= "
            f"+{100 * TARGET_CPU_GROWTH:.0f}%: {ro.verdict(ok)})."
        )
    return [*lines, ""], all_ok


# -- flood -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchRun:
    """One `tiergate bench --tenants` process: its tenants (name -> clients) and workload."""

    tenants: dict[str, int]
    input_tokens: int
    max_tokens: str  # N or LOW-HIGH
    pause_s: float = 0.0


@dataclass(frozen=True)
class Scenario:
    name: str
    tier: str  # which node and routers
    runs: list[BenchRun]
    duration_s: float
    variants: tuple[str, ...] = ORDERS  # the routers it runs against (VARIANTS)


@dataclass
class TenantRound:
    """One tenant's figures in one round (from the bench's --json `tenants`)."""

    tokens: int
    share: float  # of the scenario's tokens, all its bench processes together
    ttft_p50_ms: float | None
    ttft_p90_ms: float | None
    shed: int
    requests: int


#: (model, accelerator, chips, sequences at once) of each tier.
TIERS = {"small": ("llama-3.1-8b", "h100-sxm", 1, 4), "wide": ("llama-3.1-70b", "a100-80gb", 4, 16)}


def scenarios(args: argparse.Namespace) -> list[Scenario]:
    d = 8.0 if args.quick else args.flood_duration
    light = BenchRun({"light": 1}, 1000, "8", pause_s=1.5)
    in_step = BenchRun({"heavy": 48}, 16, "16")  # replies of one length: they end in step
    return [
        Scenario("three tenants", "small", [BenchRun({"a": 24, "b": 8, "c": 8}, 16, "32")], d),
        Scenario("heavy and light", "wide", [BenchRun({"heavy": 48}, 16, "8-24"), light], d),
        Scenario(
            "heavy in step and light", "wide", [in_step, light], d, ("fair", "fair, headroom")
        ),
        Scenario("light alone", "wide", [light], d / 2, ("fair",)),
    ]


def run_benches(
    procs: ro.Processes, url: str, scenario: Scenario, seed: int, name: str
) -> dict[str, TenantRound]:
    """The scenario's bench processes at once against `url`; each tenant's figures."""
    started = []
    for n, run in enumerate(scenario.runs):
        stem = procs.workdir / f"{name}-{n}"
        spec = "tenants:\n" + "".join(
            f"  - {{name: {t}, apiKey: {key(t)}, concurrency: {c}}}\n"
            for t, c in run.tenants.items()
        )
        stem.with_suffix(".tenants.yaml").write_text(spec)
        cmd = [sys.executable, "-P", "-m", "tiergate", "bench", "--router", url,
               "--tenants", str(stem.with_suffix(".tenants.yaml")), "--model", ro.MODEL,
               "--duration", f"{scenario.duration_s:g}", "--mix", "batched=1",
               "--tools-fraction", "0", "--input-tokens", str(run.input_tokens),
               "--max-tokens", run.max_tokens, "--pause", f"{run.pause_s:g}",
               "--seed", str(seed + n), "--timeout", "60",
               "--json", str(stem.with_suffix(".json"))]  # fmt: skip
        started.append((stem, procs.start(f"{name}-{n}", cmd)))
    rows: list[dict[str, Any]] = []
    for stem, proc in started:
        status = proc.wait(timeout=scenario.duration_s + 120)
        if status != 0:
            raise RuntimeError(f"bench exited {status}: {procs.log_tail(stem.name, 5)}")
        report = json.loads(stem.with_suffix(".json").read_text())
        rows += report["tenants"]
    total = sum(r["tokens_served"] for r in rows) or 1
    return {
        r["tenant"]: TenantRound(
            r["tokens_served"],
            r["tokens_served"] / total,
            r["ttft_p50_ms"],
            r["ttft_p90_ms"],
            r["shed"],
            r["requests"],
        )  # fmt: skip
        for r in rows
    }


def flood_section(args: argparse.Namespace, procs: ro.Processes, out: list[str]) -> None:
    ro.log(f"[flood] starting two sim nodes and {2 * len(VARIANTS)} routers ...")
    tenants = tenants_file(procs.workdir / "flood-tenants.yaml", FLOOD_WEIGHTS)
    routers: dict[tuple[str, str], ro.Server] = {}
    for tier, (model, accelerator, chips, seqs) in TIERS.items():
        node = ro.start_sim_node(
            procs, f"node-{tier}", model, accelerator, seqs, ["--chips", str(chips)]
        )
        for variant, settings in VARIANTS.items():
            routers[tier, variant] = ro.start_router(
                procs, f"router-{tier}-{variant.replace(', ', '-').replace(' ', '-')}",
                [node.url], seqs, tenants_file=tenants, api_key=key("a"),
                extra_settings=settings,
                pool_fields={"model": model, "accelerator": accelerator, "chips": chips},
            )  # fmt: skip
    found: dict[tuple[str, str], list[dict[str, TenantRound]]] = {}
    plan = scenarios(args)
    for i in range(args.flood_rounds):
        for scenario in plan:
            orders = scenario.variants
            for order in orders if i % 2 == 0 else orders[::-1]:
                slug = f"{scenario.name}-{order}".replace(", ", "-").replace(" ", "-")
                name = f"{slug}-{i}"
                got = run_benches(procs, routers[scenario.tier, order].url, scenario, i, name)
                found.setdefault((scenario.name, order), []).append(got)
                ro.log(
                    f"[flood] round {i + 1}/{args.flood_rounds} {scenario.name}, {order}: "
                    + "; ".join(
                        f"{t} {100 * r.share:.0f}% p90 {r.ttft_p90_ms or float('nan'):.0f} ms "
                        f"{r.shed} x 429"
                        for t, r in got.items()
                    )
                )
    out += flood_report(plan, found, args)


def _median(values: list[float | None]) -> float:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else float("nan")


def flood_report(
    plan: list[Scenario],
    found: dict[tuple[str, str], list[dict[str, TenantRound]]],
    args: argparse.Namespace,
) -> list[str]:
    lines = [
        "### Floods: fair against fcfs, and fair with headroom (`tiergate bench --tenants`; "
        f"medians of {args.flood_rounds} rounds of {plan[0].duration_s:g} s)",
        "",
    ]
    for scenario in plan:
        tier = TIERS[scenario.tier]
        clients = ", ".join(
            f"{t} {c} client{'s' if c > 1 else ''} ({run.input_tokens}-token prompts, "
            f"max_tokens {run.max_tokens}" + (f", {run.pause_s:g} s pause" if run.pause_s else "")
            + ")"
            for run in scenario.runs for t, c in run.tenants.items()
        )  # fmt: skip
        lines += [
            f"**{scenario.name}**: {clients}; {tier[0]} on {tier[2]} x {tier[1]}, {tier[3]} "
            f"sequences at once, {scenario.duration_s:g} s.",
            "",
            "| tenant | weight's share | order | share of tokens served | TTFT p50 (ms) "
            "| TTFT p90 (ms) | 429s | requests |",
            "|---|---:|---|---:|---:|---:|---:|---:|",
        ]
        names = [t for run in scenario.runs for t in run.tenants]
        weights = sum(FLOOD_WEIGHTS[t] for t in names)
        for tenant in names:
            for order in scenario.variants:
                rounds = [r[tenant] for r in found.get((scenario.name, order), []) if tenant in r]
                if not rounds:
                    continue
                lines.append(
                    f"| {tenant} | {100 * FLOOD_WEIGHTS[tenant] / weights:.0f}% | {order} "
                    f"| {100 * _median([r.share for r in rounds]):.1f}% "
                    f"| {_median([r.ttft_p50_ms for r in rounds]):.0f} "
                    f"| {_median([r.ttft_p90_ms for r in rounds]):.0f} "
                    f"| {_median([r.shed for r in rounds]):.0f} "
                    f"| {_median([r.requests for r in rounds]):.0f} |".replace("nan", "n/a")
                )
        lines.append("")
    return lines


# -- main ------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a short smoke run (~2 minutes)")
    p.add_argument("--rounds", type=int, default=None, help="cost rounds (default 7; quick 1)")
    p.add_argument("--duration", type=int, default=None, help="seconds per wrk run (2; quick 1)")
    p.add_argument("--connections", type=int, default=64)
    p.add_argument("--flood-rounds", type=int, default=None, help="default 3 (quick 1)")
    p.add_argument("--flood-duration", type=float, default=20.0, help="seconds per flood (20)")
    p.add_argument("--sections", default=",".join(SECTIONS), help="cost,flood or either")
    p.add_argument("--profile", action="store_true", help="py-spy the queued setting's routers")
    args = p.parse_args(argv)
    args.rounds = args.rounds or (1 if args.quick else 7)
    args.duration = args.duration or (1 if args.quick else 2)
    args.flood_rounds = args.flood_rounds or (1 if args.quick else 3)
    args.sections = {s.strip() for s in args.sections.split(",") if s.strip()}
    if not args.sections or args.sections - set(SECTIONS):
        p.error(f"--sections: choose from {', '.join(SECTIONS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, ro._raise_exit)
    signal.signal(signal.SIGHUP, ro._raise_exit)
    command = "python -P " + shlex.join(
        [os.path.relpath(__file__), *(sys.argv[1:] if argv is None else argv)]
    )
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True
    ).stdout.strip()
    if "cost" in args.sections:
        ro.ensure_debian_tools({"wrk": "wrk"})
    workdir = Path(tempfile.mkdtemp(prefix="tiergate-admission-fairness-"))
    procs = ro.Processes(workdir)
    started = time.monotonic()
    out: list[str] = []
    ok = True
    try:
        if "cost" in args.sections:
            ok = cost_section(args, procs, out)
        if "flood" in args.sections:
            flood_section(args, procs, out)
    finally:
        procs.stop_all()
        shutil.rmtree(workdir, ignore_errors=True)
    header = [
        "## Admission fairness benchmark",
        "",
        f"Command: `{command}` at commit {commit or '?'} ({time.monotonic() - started:.0f} s). "
        f"Machine: {os.cpu_count()} cores, {ro._cpu_name()}; Python {sys.version.split()[0]}. "
        "Everything on this machine, clients included.",
        "",
    ]
    print("\n".join(header + out))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
