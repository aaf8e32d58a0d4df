"""`tiergate router --config FILE`: serve the tier router.

Pools come from the file (hot-reloaded) or, with `discovery.kubernetes`, from the cluster's
InferencePools and their pods.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tiergate.sim_nodes.commands.common import (
    CliError,
    configure_logging,
    listen_socket,
    port_number,
)

from ..build import build_app, router_source
from ..config import ConfigError
from ..ledger import LedgerError
from ..tenants import TenantConfigError
from .serve import connection_cap, run_router


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, required=True, help="router configuration (YAML)")
    p.add_argument("--host", default=None, help="listen address (default: from the config)")
    p.add_argument(
        "--port", type=port_number, default=None, help="listen port (default: from the config)"
    )
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info")


def run(args: argparse.Namespace) -> int:
    configure_logging(args.log_level)
    try:
        config, source = router_source(args.config)
    except ConfigError as exc:
        raise CliError(str(exc)) from None
    host = args.host or config.router.host
    port = args.port if args.port is not None else config.router.port
    cap = connection_cap(config.router.connections)
    sock = listen_socket(host, port)  # a port in use is one line, before anything starts
    try:
        try:
            app = build_app(config, source, max_connections=cap)
        except (ConfigError, TenantConfigError, LedgerError) as exc:
            raise CliError(str(exc)) from None
        ok = run_router(app, sock, args.log_level)
    finally:
        sock.close()
    return 0 if ok else 1
