"""`tiergate router --workers N`: N router processes on one port, and the one that watches them.

Each worker (router/cli/worker.py) is a whole router: its own app, event loop and connection
to the shared ledger, and its own sockets bound to the port and the metrics port with
SO_REUSEPORT, so the kernel spreads new connections (and scrapes) over the workers. The
supervisor checks the configuration once, holds both ports (bound sockets that never listen;
`--port 0` and a metrics port 0 are picked here), starts the workers, and from then on only
watches them:

- a worker that exits before it serves stops the router, with its error as the router's;
- a worker that exits later is started again (RestartBackoff: at once, then 1 s doubling to
  30 s while it keeps exiting soon after its start);
- SIGTERM or SIGINT goes on to the workers as SIGTERM: they stop accepting and finish what
  they serve (up to router.shutdownGraceS); a second one as SIGINT: they stop at once. A worker
  still running KILL_MARGIN_S past the grace period is killed;
- a worker gets SIGTERM from the kernel if the supervisor dies (router/cli/worker.py).

The workers share their metrics through a private folder the supervisor creates and removes
(router/http/shared_metrics.py): a scrape any worker answers has the whole fleet's sums.
"""

from __future__ import annotations

import logging
import math
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tiergate.common.cli import CliError, listen_socket, shared_port_socket
from tiergate.router.cli.router_cmd import Addresses, check_epp_tls, check_ledger, listening
from tiergate.router.cli.serve import connection_cap
from tiergate.router.config import ConfigError, RouterConfig, load_config
from tiergate.router.tenants.registry import TenantConfigError, load_tenants

__all__ = ["KILL_MARGIN_S", "RestartBackoff", "supervise"]

log = logging.getLogger("tiergate.router.supervisor")

#: How long past router.shutdownGraceS a stopping worker may take before it is killed.
KILL_MARGIN_S = 5.0
#: prometheus_client's multiprocess folder, read by the workers (set before they import it).
METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"


@dataclass
class RestartBackoff:
    """How long a worker that exited waits before it is started again: no time after a
    worker that ran `stable_after_s` or more, then `first_s`, doubling up to `max_s`, while
    it keeps exiting sooner, so a worker that cannot run does not spin a core."""

    first_s: float = 1.0
    max_s: float = 30.0
    stable_after_s: float = 60.0
    quick_exits: int = 0

    def delay_s(self, ran_s: float) -> float:
        """The wait before the next start of a worker that ran `ran_s` seconds."""
        if ran_s >= self.stable_after_s:
            self.quick_exits = 0
        exits, self.quick_exits = self.quick_exits, self.quick_exits + 1
        return 0.0 if exits == 0 else min(self.max_s, self.first_s * 2 ** (exits - 1))


def supervise(
    config_path: Path,
    *,
    workers: int,
    host: str | None,
    port: int | None,
    metrics_port: int | None,
    log_level: str,
) -> int:
    """Serve the router in `workers` processes until SIGTERM/SIGINT; the exit status.

    CliError (one line, before any worker starts) for a bad configuration, a port in use or
    the SQLite ledger; also when a worker cannot start, with its error.
    """
    config = _checked(config_path, workers)
    held, held_metrics = Addresses.of(config, host, port, metrics_port).bind(_hold_port)
    try:
        metrics_dir = _metrics_dir()
    except OSError as exc:
        held.close()
        held_metrics.close()
        raise CliError(
            "cannot create the workers' metrics folder in the temp dir ($TMPDIR, else /tmp; "
            f"it must be writable): {exc.strerror or exc}"
        ) from None
    try:
        bound_host, bound_port = held.getsockname()[:2]
        metrics_host, bound_metrics_port = held_metrics.getsockname()[:2]

        def command(index: int, status_fd: int, restarted: bool) -> list[str]:
            return [
                sys.executable, "-P", "-m", "tiergate.router.cli.worker",
                "--config", str(config_path), "--host", bound_host, "--port", str(bound_port),
                "--metrics-host", metrics_host, "--metrics-port", str(bound_metrics_port),
                "--log-level", log_level, "--index", str(index),
                "--status-fd", str(status_fd), "--supervisor-pid", str(os.getpid()),
                *(["--restarted"] if restarted else []),
            ]  # fmt: skip

        env = {**os.environ, METRICS_DIR_ENV: str(metrics_dir)}
        where = listening(held, held_metrics)
        grace_s = config.router.shutdown_grace_s
        return _Supervisor(workers, command, env, metrics_dir, where, grace_s).run()
    finally:
        held.close()
        held_metrics.close()
        shutil.rmtree(metrics_dir, ignore_errors=True)


def _checked(path: Path, workers: int) -> RouterConfig:
    """The configuration, checked as far as it can be without building a router."""
    try:
        config = load_config(path)
        dsn = config.router.ledger_dsn()
    except ConfigError as exc:
        raise CliError(str(exc)) from None
    if dsn is None:
        raise CliError(
            f"--workers {workers} needs a shared ledger (router.ledgerUrl or "
            "router.ledgerUrlFile): with the SQLite ledger each worker would enforce budgets "
            "and rate limits on its own"
        )
    if config.router.tenants_file is not None:
        try:
            load_tenants(config.router.tenants_file)
        except TenantConfigError as exc:
            raise CliError(str(exc)) from None
    connection_cap(config.router.connections)  # per worker: each has its own open-file limit
    check_epp_tls(config)  # files here, before the ledger's server is asked
    check_ledger(config)
    return config


def _metrics_dir() -> Path:
    """A new folder for the workers' metrics, in the temp dir ($TMPDIR). Folders that killed
    supervisors left behind (their pid is gone, or is this process's own: a restarted
    container) are removed first."""
    for old in Path(tempfile.gettempdir()).glob("tiergate-metrics-*-*"):
        pid = old.name.split("-")[2]
        if pid.isdigit() and (int(pid) == os.getpid() or not _alive(int(pid))):
            shutil.rmtree(old, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"tiergate-metrics-{os.getpid()}-"))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


def _hold_port(host: str, port: int) -> socket.socket:
    """A socket that holds host:port for the workers (bound with SO_REUSEPORT, never
    listening). The port is first bound without SO_REUSEPORT, so that a port another router's
    workers serve is refused rather than shared."""
    probe = listen_socket(host, port)
    port = probe.getsockname()[1]
    probe.close()
    return shared_port_socket(host, port)


@dataclass
class _Worker:
    index: int
    process: subprocess.Popen[bytes]
    status_fd: int
    started_at: float
    ready: bool = False
    error: str = ""
    unread: bytes = b""


@dataclass
class _Failure:
    message: str
    user_error: bool


@dataclass
class _Supervisor:
    count: int
    command: Callable[[int, int, bool], list[str]]
    env: dict[str, str]
    metrics_dir: Path
    #: The `event=listening` line's URLs (router/cli/router_cmd.py: listening).
    where: str
    #: How long a stopping worker may finish what it serves (router.shutdownGraceS).
    grace_s: float
    clock: Callable[[], float] = time.monotonic
    workers: dict[int, _Worker] = field(default_factory=dict)
    restart_at: dict[int, float] = field(default_factory=dict)
    backoffs: dict[int, RestartBackoff] = field(default_factory=dict)
    stopping: bool = False
    kill_at: float = math.inf
    killed: bool = False
    listening: bool = False
    failure: _Failure | None = None
    selector: selectors.BaseSelector = field(default_factory=selectors.DefaultSelector)

    def run(self) -> int:
        selector = self.selector
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        selector.register(wake_r, selectors.EVENT_READ)
        handled = (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD)
        previous = {sig: signal.signal(sig, lambda *_: None) for sig in handled}
        previous_wakeup = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        try:
            for index in range(self.count):
                self.backoffs[index] = RestartBackoff()
                self._start(index, restarted=False)
            while self.workers or (self.restart_at and not self.stopping):
                for key, _ in selector.select(self._timeout()):
                    if key.data is None:
                        self._signalled(os.read(wake_r, 512))
                    else:
                        self._read_status(key.data)
                self._reap()
                self._restart_due()
                self._kill_overdue()
        finally:
            for worker in self.workers.values():  # only after an error of the supervisor's
                worker.process.kill()
                worker.process.wait()
            signal.set_wakeup_fd(previous_wakeup)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            selector.close()
            os.close(wake_r)
            os.close(wake_w)
        if self.failure is not None:
            if self.failure.user_error:
                raise CliError(self.failure.message)
            log.error("event=worker_failed_to_start %s", self.failure.message)
            return 1
        return 1 if self.killed else 0

    def _start(self, index: int, *, restarted: bool) -> None:
        status_r, status_w = os.pipe()
        try:
            process = subprocess.Popen(
                self.command(index, status_w, restarted),
                stdin=subprocess.DEVNULL,
                env=self.env,
                pass_fds=(status_w,),
            )
        finally:
            os.close(status_w)
        os.set_blocking(status_r, False)
        worker = _Worker(index, process, status_r, self.clock())
        self.workers[index] = worker
        self.selector.register(status_r, selectors.EVENT_READ, worker)
        log.info("event=worker_started worker=%d pid=%d", index, process.pid)

    def _read_status(self, worker: _Worker) -> None:
        """Take the lines the worker wrote (`ready`, or `error MESSAGE`); close at its end."""
        while worker.status_fd >= 0:
            try:
                chunk = os.read(worker.status_fd, 4096)
            except BlockingIOError:
                return
            if not chunk:
                self.selector.unregister(worker.status_fd)
                os.close(worker.status_fd)
                worker.status_fd = -1
                return
            *lines, worker.unread = (worker.unread + chunk).split(b"\n")
            for line in lines:
                self._status_line(worker, line.decode("utf-8", "replace"))

    def _status_line(self, worker: _Worker, line: str) -> None:
        if line == "ready":
            worker.ready = True
            log.info("event=worker_ready worker=%d pid=%d", worker.index, worker.process.pid)
            if not self.listening and len(self.workers) == self.count:
                if all(w.ready for w in self.workers.values()):
                    self.listening = True
                    log.info("event=listening %s workers=%d", self.where, self.count)
        elif line.startswith("error "):
            worker.error = line.removeprefix("error ")

    def _reap(self) -> None:
        for worker in list(self.workers.values()):
            code = worker.process.poll()
            if code is not None:
                self._exited(worker, code)

    def _exited(self, worker: _Worker, code: int) -> None:
        self._read_status(worker)  # what it wrote before it exited
        if worker.status_fd >= 0:
            self.selector.unregister(worker.status_fd)
            os.close(worker.status_fd)
        del self.workers[worker.index]
        _mark_dead(worker.process.pid, self.metrics_dir)
        pid, index = worker.process.pid, worker.index
        how = f"code={code}" + (f" signal={signal.Signals(-code).name}" if code < 0 else "")
        if self.stopping:
            log.info("event=worker_stopped worker=%d pid=%d %s", index, pid, how)
        elif not worker.ready:
            message = worker.error or (
                f"router worker {index} exited ({how}) before it served; its log says why"
            )
            self.failure = _Failure(message, user_error=bool(worker.error))
            self._stop()
        else:
            delay_s = self.backoffs[index].delay_s(self.clock() - worker.started_at)
            log.warning(
                "event=worker_exited worker=%d pid=%d %s restart_in_s=%.1f",
                index, pid, how, delay_s,
            )  # fmt: skip
            self.restart_at[index] = self.clock() + delay_s

    def _restart_due(self) -> None:
        now = self.clock()
        for index, at in list(self.restart_at.items()):
            if at <= now and not self.stopping:
                del self.restart_at[index]
                self._start(index, restarted=True)

    def _signalled(self, signals: bytes) -> None:
        for number in signals:
            if number in (signal.SIGTERM, signal.SIGINT):
                self._stop()

    def _stop(self) -> None:
        """Ask every worker to stop: to finish what it serves first, then (asked again) at
        once."""
        forward = signal.SIGINT if self.stopping else signal.SIGTERM
        if not self.stopping:
            self.stopping = True
            self.restart_at.clear()
            self.kill_at = self.clock() + self.grace_s + KILL_MARGIN_S
            log.info("event=stopping workers=%d", len(self.workers))
        for worker in self.workers.values():
            worker.process.send_signal(forward)

    def _kill_overdue(self) -> None:
        if self.clock() < self.kill_at:
            return
        self.kill_at = math.inf
        for worker in self.workers.values():
            log.error("event=worker_killed worker=%d pid=%d", worker.index, worker.process.pid)
            worker.process.kill()
            self.killed = True

    def _timeout(self) -> float | None:
        due = min([*self.restart_at.values(), self.kill_at])
        return None if due == math.inf else max(0.0, due - self.clock())


def _mark_dead(pid: int, metrics_dir: Path) -> None:
    """Drop a dead worker's live gauges from the shared metrics (its counters stay)."""
    from prometheus_client.multiprocess import mark_process_dead

    mark_process_dead(pid, str(metrics_dir))  # type: ignore[no-untyped-call]
