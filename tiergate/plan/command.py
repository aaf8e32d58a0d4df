"""`tiergate plan`: the cheapest fleet per tier that meets its SLO, from a plan file.

Exit status: 0 when every tier's SLO is met; 1 when some tier's is not (the table shows the
closest configuration, stderr one line per unmet tier); 2 for a bad plan file, trace or flag
(one line on stderr).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from tqdm import tqdm

from tiergate.common.cli import CliError
from tiergate.sim_nodes.catalogs import default_catalog

from .errors import PlanError
from .pools import write_pools
from .report import render
from .search import NO_PROGRESS, plan_fleet
from .spec import load_plan
from .traffic import plan_traffic

__all__ = ["HELP", "add_arguments", "run"]

HELP = "plan the cheapest pools per tier that meet latency SLOs (steady state + simulator)"
UNMET = 1


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of `tiergate plan`."""
    p.add_argument("plan", metavar="PLAN", help="plan file (YAML or JSON): tiers, traffic, SLOs")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--emit-pools",
        metavar="DIR",
        default=None,
        help="write an InferencePool YAML per met tier into DIR (for kubectl apply)",
    )
    p.add_argument(
        "--autoscale",
        action="store_true",
        help="with --emit-pools: each pool's replicas follow its load (spec.autoscaling from 1 "
        "to the planned replicas)",
    )
    p.add_argument(
        "--no-progress", action="store_true", help="no progress bar (default: on a terminal)"
    )


class _Bar:
    """A tqdm bar on stderr, shown only once a stage has run for a second."""

    def __init__(self) -> None:
        self._bar: tqdm[Any] | None = None

    def start(self, what: str, total: int) -> None:
        self.close()
        self._bar = tqdm(
            total=total, desc=what, unit="config", file=sys.stderr, delay=1.0, leave=False
        )

    def advance(self, steps: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(steps)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def run(args: argparse.Namespace) -> int:
    """Load the plan, search, print; emit pools if asked."""
    try:
        plan, base = load_plan(args.plan)
        traffic = plan_traffic(plan, base)
        bar = _Bar() if sys.stderr.isatty() and not args.no_progress else None
        try:
            report = plan_fleet(plan, traffic, default_catalog(), bar or NO_PROGRESS)
        finally:
            if bar is not None:
                bar.close()
        if args.autoscale and not args.emit_pools:
            raise PlanError("--autoscale needs --emit-pools DIR: it shapes the pools written")
        written = (
            write_pools(report, Path(args.emit_pools), args.autoscale) if args.emit_pools else []
        )
    except PlanError as exc:
        raise CliError(str(exc)) from None
    print(report.model_dump_json(indent=2) if args.json else render(report))
    for path in written:
        print(f"wrote {path}", file=sys.stderr)
    for tier in report.tiers:
        if not tier.met:
            print(f"tiergate plan: {tier.verdict}", file=sys.stderr)
    return 0 if report.met else UNMET
