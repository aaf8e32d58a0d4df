"""`tiergate up`: the whole system on localhost: sim nodes for every pool, and the router.

Without --config it runs the embedded default (router/local.yaml, the three seed tiers);
`tiergate up --print-config` shows it, to copy and edit. Ctrl-C or SIGTERM stops everything.
"""

from __future__ import annotations

import argparse
import signal
import sys
from importlib import resources
from pathlib import Path

from tiergate.common.cli import (
    CliError,
    configure_logging,
    listen_socket,
    port_number,
    table,
)
from tiergate.local.nodes import (
    NodeStartError,
    NodeSupervisor,
    node_ports,
    start_nodes,
    stop_nodes,
)
from tiergate.router.build import build_app
from tiergate.router.cli.router_cmd import LISTEN_BACKLOG, Addresses, url_of
from tiergate.router.cli.serve import connection_cap, log_connection_limits, run_router
from tiergate.router.config import ConfigError, RouterConfig, load_config, parse_config
from tiergate.router.discovery.view import PoolView, StaticSource, build_view
from tiergate.router.ledger.sqlite import LedgerError
from tiergate.router.tenants.registry import TenantConfigError
from tiergate.sim_nodes.catalogs import default_catalog
from tiergate.sim_nodes.perf import profile_label


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, default=None, help="configuration (default: embedded)")
    p.add_argument("--print-config", action="store_true", help="print the embedded default")
    p.add_argument("--host", default=None, help="router address (default 127.0.0.1)")
    p.add_argument("--port", type=port_number, default=None, help="router port (default 8080)")
    p.add_argument(
        "--metrics-port",
        type=port_number,
        default=None,
        help="router's GET /metrics port (default 8090)",
    )
    p.add_argument(
        "--first-node-port", type=port_number, default=None, help="first sim-node port (9000)"
    )
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="warning")


def default_config_text() -> str:
    return resources.files("tiergate.router").joinpath("local.yaml").read_text(encoding="utf-8")


def load(args: argparse.Namespace) -> RouterConfig:
    try:
        if args.config is None:
            config = parse_config(default_config_text(), "embedded local.yaml")
        else:
            config = load_config(args.config)
    except ConfigError as exc:
        raise CliError(str(exc)) from None
    if config.discovery.kubernetes is not None:
        raise CliError(
            "tiergate up runs the file's pools locally; for discovery.kubernetes use "
            "tiergate router --config FILE"
        )
    updates: dict[str, object] = {}
    if args.host is not None:
        updates["host"] = args.host
    if args.port is not None:
        updates["port"] = args.port
    if args.metrics_port is not None:
        updates["metrics_port"] = args.metrics_port
    router = config.router.model_copy(update=updates)
    local = config.local
    if args.first_node_port is not None:
        if args.first_node_port == 0:
            raise CliError("--first-node-port: nodes need real ports (1..65535), not 0")
        local = local.model_copy(update={"first_port": args.first_node_port})
    config = config.model_copy(update={"router": router, "local": local})
    ports = node_ports(config)
    if ports and ports[-1] > 65535:
        raise CliError(
            f"{len(ports)} sim nodes from port {ports[0]} would need ports past 65535: "
            "lower --first-node-port"
        )
    if not ports and not any(p.endpoint is not None and p.replicas for p in config.pools):
        raise CliError("the configuration has no pool replicas to run: nothing would serve")
    return config


def _check_node_ports(config: RouterConfig, router_ports: dict[int, str]) -> None:
    """Refuse ports something else holds before starting any node: a node that cannot bind
    exits, and the server already there (another `tiergate up`?) would answer in its place.
    `router_ports`: the router's bound ports, port -> its host."""
    host = config.local.host
    for port in node_ports(config):
        if router_ports.get(port) == host:
            raise CliError(f"port {port} is both the router's and a sim node's: move one")
        listen_socket(host, port).close()


def run(args: argparse.Namespace) -> int:
    if args.print_config:
        print(default_config_text(), end="")
        return 0
    configure_logging(args.log_level)
    # uvicorn re-raises the SIGTERM it caught once it has shut down; with the default handler
    # that would kill this process before it stops its nodes. Exit through Python instead.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    config = load(args)
    try:
        # Validate every pool (and its envelope) before starting any process.
        planned = build_view(config.pools, default_catalog())
    except ConfigError as exc:
        raise CliError(str(exc)) from None
    cap = connection_cap(config.router.connections)
    addresses = Addresses.of(config, None, None, None)
    sock, metrics_sock = addresses.bind(listen_socket)
    try:
        # The ones bound, for --port 0.
        port, metrics_port = sock.getsockname()[1], metrics_sock.getsockname()[1]
        _check_node_ports(config, {port: addresses.host, metrics_port: addresses.metrics_host})
        try:
            nodes = start_nodes(config, planned)
        except NodeStartError as exc:
            raise CliError(str(exc)) from None
        supervisor = NodeSupervisor(nodes)
        try:
            urls: dict[str, list[str]] = {}
            for node in nodes:
                urls.setdefault(node.pool.name, []).append(node.url)
            view = build_view(
                config.pools, default_catalog(), urls_of=lambda s: urls.get(s.name, [])
            )
            try:
                app = build_app(config, StaticSource(view), max_connections=cap)
            except (TenantConfigError, LedgerError) as exc:
                raise CliError(str(exc)) from None
            supervisor.start()
            sock.listen(LISTEN_BACKLOG)
            metrics_sock.listen(LISTEN_BACKLOG)
            log_connection_limits(config.router.connections, cap)
            print(summary(view, url_of(sock), url_of(metrics_sock) + "/metrics"), flush=True)
            ok = run_router(app, sock, metrics_sock, args.log_level)
            return 0 if ok else 1
        finally:
            supervisor.stop()
            stop_nodes(nodes)
    finally:
        sock.close()
        metrics_sock.close()


def summary(view: PoolView, router_url: str, metrics_url: str) -> str:
    rows = []
    for name, pool in view.pools.items():
        e, d = pool.envelope, pool.deployment
        model_source, accelerator_source = pool.profile_sources
        hosted = pool.spec.endpoint
        rows.append([
            pool.spec.tier, name, profile_label(pool.spec.names[0], model_source),
            f"{d.chips} x {profile_label(d.accelerator.name, accelerator_source)}"
            if d is not None else f"hosted ({hosted.model if hosted else '?'})",
            f"{e.output_tokens_per_s_per_stream:.0f}" if e is not None else "-",
            f"{pool.output_price_per_token_usd * 1e6:.2f}",
            " ".join(ep.url for ep in pool.endpoints),
        ])  # fmt: skip
    headers = ["tier", "pool", "model", "hardware", "tok/s/stream", "$/1M out", "endpoints"]
    return (
        f"{table(headers, rows, left=4)}\n\nrouter: {router_url}  (OpenAI-compatible; "
        f"try: tiergate bench --router {router_url})\nmetrics: {metrics_url}  (Prometheus; "
        "every tenant's spend: keep it from tenants)\nCtrl-C stops everything."
    )
