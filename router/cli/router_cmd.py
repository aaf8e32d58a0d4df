"""`tiergate router --config FILE`: serve the tier router.

Pools come from the file (hot-reloaded) or, with `discovery.kubernetes`, from the cluster's
InferencePools and their pods.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from pathlib import Path

from tiergate.router.build import build_app, router_source
from tiergate.router.cli.serve import connection_cap, run_router
from tiergate.router.config import ConfigError
from tiergate.router.ledger.postgres import open_check
from tiergate.router.ledger.records import LedgerError
from tiergate.router.tenants.registry import TenantConfigError
from tiergate.sim_nodes.commands.common import (
    CliError,
    configure_logging,
    listen_socket,
    port_number,
)

log = logging.getLogger("tiergate.router")
#: uvicorn's own default.
LISTEN_BACKLOG = 2048


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
        dsn = config.router.ledger_dsn()
        if dsn is not None:
            # An unreachable database, a refused login or a newer schema: one line, before
            # the port is taken.
            asyncio.run(open_check(dsn))
    except (ConfigError, LedgerError) as exc:
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
        # Listening from here (uvicorn accepts what queued once it starts), so the line is true
        # and says the port chosen for `--port 0`.
        sock.listen(LISTEN_BACKLOG)
        bound_host, bound_port = sock.getsockname()[:2]
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host
        log.info("event=listening url=http://%s:%d", shown, bound_port)
        ok = run_router(app, sock, args.log_level)
    finally:
        sock.close()
    return 0 if ok else 1
