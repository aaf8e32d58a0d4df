"""`tiergate router --config FILE`: serve the tier router.

Pools come from the file (hot-reloaded) or, with `discovery.kubernetes`, from the cluster's
InferencePools and their pods. With `--workers N` (N > 1), N router processes share the port
and the metrics port (router/cli/supervisor.py).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tiergate.common.cli import (
    CliError,
    configure_logging,
    listen_socket,
    port_number,
    positive_int,
)
from tiergate.router.build import build_app, router_source
from tiergate.router.cli.serve import connection_cap, log_connection_limits, run_router
from tiergate.router.config import ConfigError, RouterConfig
from tiergate.router.discovery.view import PoolSource
from tiergate.router.http.app import RouterApp
from tiergate.router.ledger.postgres import open_check
from tiergate.router.ledger.records import LedgerError
from tiergate.router.tenants.registry import TenantConfigError

log = logging.getLogger("tiergate.router")
#: uvicorn's own default.
LISTEN_BACKLOG = 2048


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, required=True, help="router configuration (YAML)")
    p.add_argument("--host", default=None, help="listen address (default: from the config)")
    p.add_argument(
        "--port", type=port_number, default=None, help="listen port (default: from the config)"
    )
    p.add_argument(
        "--metrics-port",
        type=port_number,
        default=None,
        help="port of GET /metrics, apart from the tenants' port (default: from the config)",
    )
    p.add_argument(
        "--epp-port",
        type=port_number,
        default=None,
        help="serve the endpoint picker (Envoy ext_proc over gRPC) for a Gateway API gateway "
        "on this port too (default: router.eppPort; off when neither says)",
    )
    p.add_argument(
        "--workers",
        type=positive_int,
        default=1,
        help="router processes sharing the port, to use more than one core (default 1); more "
        "than 1 needs the PostgreSQL ledger (router.ledgerUrl or router.ledgerUrlFile)",
    )
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info")


def run(args: argparse.Namespace) -> int:
    configure_logging(args.log_level)
    if args.workers > 1:
        from tiergate.router.cli.supervisor import supervise

        if args.epp_port is not None:
            raise CliError(
                "--epp-port takes one router process; with --workers, set router.eppPort in "
                "the configuration (every worker serves the picker on it)"
            )
        return supervise(
            args.config,
            workers=args.workers,
            host=args.host,
            port=args.port,
            metrics_port=args.metrics_port,
            log_level=args.log_level,
        )
    config, source = load(args.config)
    if args.epp_port is not None:
        config.router.epp_port = args.epp_port
    check_epp_tls(config)
    check_ledger(config)  # before the port is taken
    addresses = Addresses.of(config, args.host, args.port, args.metrics_port)
    config.router.host = addresses.host  # where the endpoint picker listens too
    cap = connection_cap(config.router.connections)
    sock, metrics_sock = addresses.bind(listen_socket)  # a port in use: one line, first
    try:
        check_epp_port(config)
        app = build(config, source, cap)
        # Listening from here (uvicorn accepts what queued once it starts), so the line is true
        # and says the ports chosen for `--port 0`.
        sock.listen(LISTEN_BACKLOG)
        metrics_sock.listen(LISTEN_BACKLOG)
        log_connection_limits(config.router.connections, cap)
        log.info("event=listening %s", listening(sock, metrics_sock))
        ok = run_router(app, sock, metrics_sock, args.log_level)
    finally:
        sock.close()
        metrics_sock.close()
    return 0 if ok else 1


@dataclass(frozen=True)
class Addresses:
    """Where the router listens: its tenants' port and its metrics port."""

    host: str
    port: int
    metrics_host: str
    metrics_port: int

    @classmethod
    def of(
        cls, config: RouterConfig, host: str | None, port: int | None, metrics_port: int | None
    ) -> Addresses:
        """The configuration's addresses, with the command line's in place of its own (the
        metrics port listens on the router's host unless `router.metricsHost` says); CliError
        when both would be one port."""
        settings = config.router
        host = host or settings.host
        addresses = cls(
            host=host,
            port=port if port is not None else settings.port,
            metrics_host=settings.metrics_host or host,
            metrics_port=metrics_port if metrics_port is not None else settings.metrics_port,
        )
        if addresses.port == addresses.metrics_port != 0 and host == addresses.metrics_host:
            raise CliError(
                f"the metrics port (router.metricsPort, --metrics-port) {addresses.port} is "
                "also the router's port (router.port, --port)"
            )
        return addresses

    def bind(
        self, bind: Callable[[str, int], socket.socket]
    ) -> tuple[socket.socket, socket.socket]:
        """Both sockets, bound by `bind` (common.listen_socket or shared_port_socket); CliError
        saying which port cannot be had."""
        sock = bind(self.host, self.port)
        try:
            return sock, bind(self.metrics_host, self.metrics_port)
        except CliError as exc:
            sock.close()
            raise CliError(
                f"the metrics port (router.metricsPort, --metrics-port): {exc}"
            ) from None
        except BaseException:
            sock.close()
            raise


def check_epp_port(config: RouterConfig) -> None:
    """CliError (one line) when the endpoint picker's port is taken: the gRPC server binds it
    only once the router starts, where an error would be a failed startup."""
    port = config.router.epp_port
    if port:
        try:
            listen_socket(config.router.host, port).close()
        except CliError as exc:
            message = f"the endpoint picker's port (router.eppPort, --epp-port): {exc}"
            raise CliError(message) from None


def check_epp_tls(config: RouterConfig) -> None:
    """CliError (one line) when the endpoint picker would serve a certificate and key that
    cannot be read or are not a pair."""
    tls = config.router.epp_tls
    if config.router.epp_port is None or tls.cert_file is None or tls.key_file is None:
        return
    # Imported here: the picker's TLS loads only where the picker runs.
    from tiergate.router.epp.tls import TlsFiles, TlsProblem

    try:
        TlsFiles(tls.cert_file, tls.key_file).read()
    except TlsProblem as problem:
        raise CliError(f"router.eppTls: {problem}") from None


def listening(sock: socket.socket, metrics_sock: socket.socket) -> str:
    """The `event=listening` line's fields: the URLs both sockets serve."""
    return f"url={url_of(sock)} metrics_url={url_of(metrics_sock)}/metrics"


def load(path: Path) -> tuple[RouterConfig, PoolSource]:
    """The configuration in `path` and its pool source; CliError (one line) when it is bad."""
    try:
        return router_source(path)
    except ConfigError as exc:
        raise CliError(str(exc)) from None


def check_ledger(config: RouterConfig) -> str | None:
    """The PostgreSQL ledger's URL once it has been connected to and its schema created or
    migrated (None: the SQLite ledger); CliError (one line) when it cannot be used: an
    unreachable database, a refused login, a newer schema."""
    try:
        dsn = config.router.ledger_dsn()
        if dsn is not None:
            asyncio.run(open_check(dsn))
            spool = config.router.ledger_spool_dir
            spool.mkdir(parents=True, exist_ok=True)
            if not os.access(spool, os.W_OK | os.X_OK):
                raise PermissionError(f"{spool} is not writable")
    except (ConfigError, LedgerError) as exc:
        raise CliError(str(exc)) from None
    except OSError as exc:
        message = f"cannot use the ledger's spool folder (router.ledgerSpoolDir): {exc}"
        raise CliError(message) from None
    return dsn


def build(config: RouterConfig, source: PoolSource, max_connections: int) -> RouterApp:
    """The router app; CliError (one line) when its tenants or its ledger are unusable."""
    try:
        return build_app(config, source, max_connections=max_connections)
    except (ConfigError, TenantConfigError, LedgerError) as exc:
        raise CliError(str(exc)) from None


def url_of(sock: socket.socket) -> str:
    """The URL a bound socket serves."""
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"
