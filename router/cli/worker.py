"""One worker of `tiergate router --workers N`, started by the supervisor
(router/cli/supervisor.py) as `python -m tiergate.router.cli.worker`.

A whole router on sockets of its own bound to the shared port and the shared metrics port
(SO_REUSEPORT), its metrics added up with the other workers' (router/http/shared_metrics.py),
so whichever worker a scrape reaches answers with the whole fleet's. It writes one line to the
supervisor's pipe: `ready` once it serves, or `error MESSAGE` when it cannot start. It asks the
kernel for SIGTERM when the supervisor dies, so a killed supervisor leaves no worker behind.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from tiergate.common.cli import CliError, configure_logging, shared_port_socket
from tiergate.router.cli.router_cmd import LISTEN_BACKLOG, Addresses, build, load
from tiergate.router.cli.serve import connection_cap, log_connection_limits, run_router
from tiergate.router.cli.supervisor import METRICS_DIR_ENV

#: prctl(2): the signal this process gets when its parent dies.
PR_SET_PDEATHSIG = 1


def main(argv: list[str] | None = None) -> int:
    """Run one worker to its end; its exit status (2: it could not start, and said why)."""
    args = _parser().parse_args(argv)
    configure_logging(args.log_level, context=f"worker={args.index} pid={os.getpid()}")
    status = os.fdopen(args.status_fd, "w", encoding="utf-8")

    def report(line: str) -> None:
        if not status.closed:
            try:
                status.write(line + "\n")
                status.close()
            except OSError:  # the supervisor is gone (and this worker has its SIGTERM)
                pass

    try:
        _die_with_supervisor(args.supervisor_pid)
        return serve_worker(args, on_started=lambda: report("ready"))
    except CliError as exc:
        report("error " + " ".join(str(exc).splitlines()))
        return 2
    except KeyboardInterrupt:  # Ctrl-C reaches every process of the terminal's group
        return 130
    finally:
        try:
            status.close()
        except OSError:
            pass


def serve_worker(args: argparse.Namespace, on_started: Callable[[], None]) -> int:
    """Build the router and serve it on the shared port until SIGTERM/SIGINT."""
    metrics_dir = os.environ.get(METRICS_DIR_ENV)
    if not metrics_dir:
        raise CliError(f"a router worker needs {METRICS_DIR_ENV}: `tiergate router --workers N`")
    config, source = load(args.config)
    cap = connection_cap(config.router.connections)
    addresses = Addresses(args.host, args.port, args.metrics_host, args.metrics_port)
    sock, metrics_sock = addresses.bind(shared_port_socket)
    try:
        app = build(config, source, cap)
        app.services.append(app.metrics.share(Path(metrics_dir), restarted=args.restarted))
        sock.listen(LISTEN_BACKLOG)
        metrics_sock.listen(LISTEN_BACKLOG)
        log_connection_limits(config.router.connections, cap)
        ok = run_router(app, sock, metrics_sock, args.log_level, on_started)
    finally:
        sock.close()
        metrics_sock.close()
    return 0 if ok else 1


def _die_with_supervisor(supervisor_pid: int) -> None:
    """SIGTERM when the supervisor dies (Linux), and CliError if it already has."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, os.strerror(errno))
    if os.getppid() != supervisor_pid:
        raise CliError("the router's supervisor exited before its worker started")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tiergate router worker")
    p.add_argument("--config", type=Path, required=True)
    p.add_argument("--host", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--metrics-host", required=True)
    p.add_argument("--metrics-port", type=int, required=True)
    p.add_argument("--log-level", required=True)
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--status-fd", type=int, required=True)
    p.add_argument("--supervisor-pid", type=int, required=True)
    p.add_argument("--restarted", action="store_true")
    return p


if __name__ == "__main__":
    sys.exit(main())
