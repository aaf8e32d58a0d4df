"""The `tiergate` command: one entry point, one subcommand per job.

Each subcommand lives in a module exposing ``HELP``, ``add_arguments(parser)`` and
``run(args) -> int``. User errors (bad flags, unknown names, impossible values) print one line
and exit 2; nothing a user can type produces a traceback.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import sys
from collections.abc import Sequence
from types import ModuleType

from pydantic import ValidationError

from tiergate import __version__
from tiergate.common.cli import CliError
from tiergate.common.validation import first_problem
from tiergate.sim_nodes.catalogs import CatalogError
from tiergate.sim_nodes.perf import PerfConfigError

#: subcommand -> (module implementing it, one-line help). A module is imported only when its
#: subcommand runs, so `tiergate perf` never pays for the server's imports.
COMMANDS: dict[str, tuple[str, str]] = {
    "perf": (
        "tiergate.sim_nodes.commands.perf_cmd",
        "predict TTFT, per-stream speed, throughput and cost of one configuration",
    ),
    "calibrate": (
        "tiergate.sim_nodes.commands.calibrate_cmd",
        "compare the performance model with published measurements",
    ),
    "seeds": (
        "tiergate.sim_nodes.commands.seeds_cmd",
        "print the seed tiers side by side",
    ),
    "simulate": (
        "tiergate.sim_nodes.commands.simulate_cmd",
        "run a workload through replicas of the batching engine in virtual time",
    ),
    "plan": (
        "tiergate.plan.command",
        "plan the cheapest pools per tier that meet latency SLOs (steady state + simulator)",
    ),
    "router": (
        "tiergate.router.cli.router_cmd",
        "serve the tier router; pools from a (hot-reloaded) file or from Kubernetes",
    ),
    "up": (
        "tiergate.local.up_cmd",
        "run the whole system locally: sim nodes of every pool and the router",
    ),
    "demo": (
        "tiergate.local.demo_cmd",
        "start the local system, run a short bench through it, print the table, stop",
    ),
    "sim-node": (
        "tiergate.sim_nodes.commands.sim_node_cmd",
        "serve one simulated accelerator node (OpenAI-compatible API, vLLM metrics)",
    ),
    "bench": ("tiergate.bench.command", "drive load through a router; per-tier speed, cost"),
    "crds": (
        "tiergate.operator.commands.crds_cmd",
        "write the InferencePool CRD YAML generated from the API models (--check: drift)",
    ),
    "render": (
        "tiergate.operator.commands.render_cmd",
        "print the Deployment and Service the operator would create for a pool (no cluster)",
    ),
    "operator": (
        "tiergate.operator.commands.operator_cmd",
        "run the kopf operator that reconciles InferencePools into sim-node Deployments",
    ),
}

USAGE_ERROR = 2


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and still exit status 2)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(USAGE_ERROR, f"{self.prog}: error: {message}\n")


def _load(name: str) -> ModuleType:
    return importlib.import_module(COMMANDS[name][0])


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; only `command`'s module is imported and given its real arguments."""
    parser = _Parser(
        prog="tiergate", description="Tiered LLM inference: operator, router, simulated nodes."
    )
    parser.add_argument("--version", action="version", version=f"tiergate {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, (_, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == command:
            module = _load(name)
            module.add_arguments(p)
            p.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if a in COMMANDS), None)
    parser = build_parser(command)
    args = parser.parse_args(argv)
    if not hasattr(args, "_run"):
        parser.print_help()
        return USAGE_ERROR
    try:
        status = int(args._run(args))
        sys.stdout.flush()  # here, so that output nobody can take is handled below
        return status
    except (CliError, CatalogError, PerfConfigError) as exc:
        print(f"tiergate {args.command}: error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    except ValidationError as exc:
        print(f"tiergate {args.command}: error: {first_problem(exc)}", file=sys.stderr)
        return USAGE_ERROR
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader left (`tiergate perf ... | head -1`): stop quietly, as a tool killed by
        # SIGPIPE does, and exit as it would.
        _discard_stdout()
        return SIGPIPE_EXIT
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        # A full disk (the output redirected to it, or /dev/full): one line, not a traceback.
        _discard_stdout()
        where = f" ({exc.filename})" if exc.filename else ""
        print(f"tiergate {args.command}: error: {exc.strerror}{where}", file=sys.stderr)
        return 1


#: How a shell reports a process that SIGPIPE ended (128 + 13).
SIGPIPE_EXIT = 141


def _discard_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's flush at exit fails no more."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
