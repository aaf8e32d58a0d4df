"""Real `tiergate router` and `tiergate sim-node` processes, as users start them, each on a
loopback port the kernel chose (`--port 0`): the address is read from the line the process
logs once it listens, so no port is guessed (a uniquely named module: conftest names clash).

Output goes to a log file, never to a pipe nobody reads (a full pipe would stall the process).
"""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
from polling_helpers import until

#: The longest a process may take to listen (the machine may be busy with other work).
START_WITHIN_S = 60.0
#: `tiergate router`'s line once it listens (it logs the ports `--port 0` and
#: `--metrics-port 0` chose).
ROUTER_LISTENING = re.compile(
    r"event=listening url=(?P<url>http://\S+) metrics_url=(?P<metrics>\S+)"
)
#: `tiergate sim-node`'s first line on stdout.
NODE_LISTENING = re.compile(r"^listening host=(?P<host>\S+) port=(?P<port>\d+)", re.M)


@dataclass
class Running:
    """A started process, its base URL and the file its output goes to; a router's metrics
    URL too (its `/metrics` on the metrics port)."""

    process: subprocess.Popen[bytes]
    url: str
    log: Path
    metrics_url: str = ""

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> int:
        """Send `sig` (if it still runs) and wait for it to exit; its exit status."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait(30)


def launch(command: list[str], log: Path, preexec_fn: Callable[[], None] | None = None) -> Running:
    """Start `tiergate COMMAND...` with its output in `log`; its URL is not known yet."""
    argv = [sys.executable, "-P", "-m", "tiergate", *command]
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            preexec_fn=preexec_fn,
        )  # fmt: skip
    return Running(process, "", log)


def wait_listening(running: Running, pattern: re.Pattern[str]) -> Running:
    """Wait until `running` has logged `pattern` (its URL, or its host and port) and accepts
    connections there; fail with its log if it exits first or takes over START_WITHIN_S."""

    def listening() -> bool:
        assert running.process.poll() is None, f"exited early:\n{running.log_text()}"
        match = pattern.search(running.log_text())
        if match is not None:
            found = match.groupdict()
            running.url = found.get("url") or f"http://{found['host']}:{found['port']}"
            running.metrics_url = found.get("metrics") or ""
        return match is not None

    try:
        until(listening, f"{running.process.args} did not start", START_WITHIN_S)
        # The port is bound (and logged) before the server listens on it.
        until(lambda: accepting(running.url), f"{running.url} does not accept", START_WITHIN_S)
    except BaseException:
        running.stop()
        raise
    return running


def accepting(url: str) -> bool:
    parts = urlsplit(url)
    with socket.socket() as sock:
        return sock.connect_ex((parts.hostname or "", parts.port or 0)) == 0


def start_router(
    config: Path, log: Path, *flags: str, preexec_fn: Callable[[], None] | None = None
) -> Running:
    """`tiergate router --config CONFIG --port 0 --metrics-port 0 FLAGS...`, listening."""
    command = ["router", "--config", str(config), "--port", "0", "--metrics-port", "0", *flags]
    return wait_listening(launch(command, log, preexec_fn), ROUTER_LISTENING)


def start_ready_router(config: Path, log: Path, *flags: str) -> Running:
    """`start_router`, then wait until its `/readyz` says 200 (stopped if it never does)."""
    router = start_router(config, log, *flags)
    try:
        until(lambda: readyz(router.url), "the router is not ready", 60)
    except BaseException:
        router.stop()
        raise
    return router


def readyz(url: str) -> bool:
    """Whether the router at `url` answers its `/readyz` with 200."""
    try:
        return httpx.get(url + "/readyz", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def start_sim_nodes(logs_and_flags: list[tuple[Path, list[str]]]) -> list[Running]:
    """`tiergate sim-node --port 0 FLAGS...` for each entry, started together (each takes a
    second or so to import), returned once all listen."""
    launched = [launch(["sim-node", "--port", "0", *flags], log) for log, flags in logs_and_flags]
    try:
        return [wait_listening(node, NODE_LISTENING) for node in launched]
    except BaseException:
        for node in launched:
            node.stop()
        raise


def start_sim_node(log: Path, *flags: str) -> Running:
    """One `tiergate sim-node --port 0 FLAGS...`, listening."""
    (node,) = start_sim_nodes([(log, list(flags))])
    return node
