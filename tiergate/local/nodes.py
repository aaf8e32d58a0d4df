"""Starting and stopping the local sim-node processes of `tiergate up`."""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import IO

import httpx

from tiergate.router.config import PoolSpec, RouterConfig
from tiergate.router.discovery.view import PoolView
from tiergate.sim_nodes.replica_spec import pool_json

log = logging.getLogger("tiergate.router")


class NodeStartError(RuntimeError):
    """A sim node did not come up; the message says which and why."""


@dataclass
class LocalNode:
    pool: PoolSpec
    url: str
    command: list[str]
    process: subprocess.Popen[bytes]
    stderr: IO[bytes]  # a temporary file: a pipe nobody reads would fill and stall the node
    restarts: int = 0


def node_command(
    pool: PoolSpec,
    chips: int,
    tensor_parallel: int,
    host: str,
    port: int,
    seed: int,
    *,
    fault_injection: bool = False,
) -> list[str]:
    """The `tiergate sim-node` invocation for one replica of `pool`.

    The pool's spec goes whole (`--pool-json`), with chips and layout as the router resolved
    them (`chips: auto` included), so the node simulates exactly the hardware the router's
    envelope and prices assume.
    `fault_injection`: the node honours the x-tiergate-fault header (when the router
    forwards it: `router.forwardFaultHeader`).
    """
    return [
        sys.executable, "-P", "-m", "tiergate", "sim-node",
        "--host", host,
        "--port", str(port),
        "--seed", str(seed),
        "--node-name", f"{pool.name}-{seed}",
        "--log-level", "warning",
        *(["--enable-fault-injection"] if fault_injection else []),
        "--pool-json", pool_json(pool, chips=chips, tensor_parallel=tensor_parallel),
    ]  # fmt: skip


def start_nodes(
    config: RouterConfig, view: PoolView, *, timeout_s: float = 60.0
) -> list[LocalNode]:
    """Start every replica of every pool on consecutive ports and wait until all are ready.

    On any failure the nodes already started are stopped and NodeStartError says why.
    """
    host, port = config.local.host, config.local.first_port
    nodes: list[LocalNode] = []
    try:
        for pool in config.pools:
            d = view.pools[pool.name].deployment
            if d is None:  # a hosted pool: the provider serves it
                continue
            for _ in range(pool.replicas):
                cmd = node_command(
                    pool, d.chips, d.tensor_parallel, host, port, seed=port,
                    fault_injection=config.router.forward_fault_header,
                )  # fmt: skip
                stderr = tempfile.TemporaryFile()
                url = f"http://{host}:{port}"
                nodes.append(LocalNode(pool, url, cmd, _spawn(cmd, stderr), stderr))
                port += 1
        _wait_ready(nodes, timeout_s)
    except BaseException:
        stop_nodes(nodes)
        raise
    return nodes


def node_ports(config: RouterConfig) -> range:
    """The ports `start_nodes` gives the nodes, one per replica."""
    first = config.local.first_port
    return range(first, first + sum(p.replicas for p in config.pools if p.endpoint is None))


def _spawn(cmd: list[str], stderr: IO[bytes]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=stderr, preexec_fn=_die_with_parent
    )


#: Exit statuses of a node that was asked to stop (Popen gives -N for signal N).
_ASKED_TO_STOP = frozenset({0, -signal.SIGINT, -signal.SIGTERM, 128 + signal.SIGINT,
                            128 + signal.SIGTERM})  # fmt: skip


class NodeSupervisor:
    """Restarts a node that crashes while `tiergate up` runs (as a kubelet restarts a container),
    after `backoff_s` doubled for each restart of that node, up to `MAX_BACKOFF_S`; each exit
    is logged with the node's last line of stderr."""

    MAX_BACKOFF_S = 30.0

    def __init__(self, nodes: list[LocalNode], *, poll_s: float = 0.5, backoff_s: float = 1.0):
        self.nodes = nodes
        self.poll_s = poll_s
        self.backoff_s = backoff_s
        self._due: dict[int, float] = {}  # node index -> when to restart it
        self._left: set[int] = set()  # stopped as asked: not restarted
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="node-supervisor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:  # started
            self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.check(time.monotonic())

    def check(self, now: float) -> None:
        """One round: note nodes that exited, restart those whose backoff has passed. A node
        that stopped as asked (status 0, or SIGINT/SIGTERM: Ctrl-C reaches the whole process
        group while `up` shuts down) is left stopped."""
        for i, node in enumerate(self.nodes):
            code = node.process.poll()
            if code is None or i in self._left:
                continue
            if code in _ASKED_TO_STOP:
                self._left.add(i)
                log.info("event=sim_node_stopped pool=%s url=%s status=%s", node.pool.name,
                         node.url, code)  # fmt: skip
                continue
            due = self._due.get(i)
            if due is None:
                delay = min(self.MAX_BACKOFF_S, self.backoff_s * 2**node.restarts)
                self._due[i] = now + delay
                log.error(
                    "event=sim_node_exited pool=%s url=%s status=%s last=%r restart_in_s=%.0f",
                    node.pool.name, node.url, code, _last_line(node, code), delay,
                )  # fmt: skip
            elif now >= due and not self._stop.is_set():
                del self._due[i]
                node.restarts += 1
                node.process = _spawn(node.command, node.stderr)
                log.warning(
                    "event=sim_node_restarted pool=%s url=%s restarts=%d",
                    node.pool.name, node.url, node.restarts,
                )  # fmt: skip


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child: have Linux send SIGTERM when `tiergate up` dies, however it dies, so a
    killed `up` never leaves nodes holding its ports. Elsewhere this does nothing."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def _wait_ready(nodes: list[LocalNode], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    pending = list(nodes)
    with httpx.Client(timeout=1.0) as client:
        while pending:
            for node in list(pending):
                code = node.process.poll()
                if code is not None:
                    raise NodeStartError(
                        f"sim node of pool {node.pool.name} at {node.url} failed: "
                        f"{_last_line(node, code)}"
                    )
                try:
                    if client.get(node.url + "/ready").status_code == 200:
                        pending.remove(node)
                except httpx.HTTPError:
                    pass
            if pending and time.monotonic() > deadline:
                waiting = ", ".join(n.url for n in pending)
                raise NodeStartError(f"sim nodes not ready after {timeout_s:.0f} s: {waiting}")
            if pending:
                time.sleep(0.1)


def _last_line(node: LocalNode, code: int) -> str:
    """The last line the node wrote to stderr (its own error), or its exit status."""
    node.stderr.seek(0, os.SEEK_END)
    node.stderr.seek(max(0, node.stderr.tell() - 4096))
    text = node.stderr.read().decode(errors="replace").strip()
    return text.splitlines()[-1] if text else f"exit status {code}"


def stop_nodes(nodes: list[LocalNode], grace_s: float = 5.0) -> None:
    for node in nodes:
        if node.process.poll() is None:
            node.process.terminate()
    deadline = time.monotonic() + grace_s
    for node in nodes:
        try:
            node.process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            node.process.kill()
            node.process.wait()
        node.stderr.close()
