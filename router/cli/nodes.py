"""Starting and stopping the local sim-node processes of `tiergate up`."""

from __future__ import annotations

import ctypes
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import httpx

from tiergate.operator.api import sim_node_flags

from ..config import PoolSpec, RouterConfig
from ..discovery import PoolView


class NodeStartError(RuntimeError):
    """A sim node did not come up; the message says which and why."""


@dataclass
class LocalNode:
    pool: PoolSpec
    url: str
    process: subprocess.Popen[bytes]


def node_command(
    pool: PoolSpec, chips: int, tensor_parallel: int, host: str, port: int, seed: int
) -> list[str]:
    """The `tiergate sim-node` invocation for one replica of `pool`.

    Chips and layout are passed as the router resolved them (`chips: auto` included), so the
    node simulates exactly the hardware the router's envelope and prices assume.
    """
    return [
        sys.executable, "-P", "-m", "tiergate", "sim-node",
        "--host", host,
        "--port", str(port),
        "--seed", str(seed),
        "--node-name", f"{pool.name}-{seed}",
        "--log-level", "warning",
        *sim_node_flags(pool, chips=chips, tensor_parallel=tensor_parallel),
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
            for _ in range(pool.replicas):
                cmd = node_command(pool, d.chips, d.tensor_parallel, host, port, seed=port)
                process = subprocess.Popen(
                    cmd,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    preexec_fn=_die_with_parent,
                )
                nodes.append(LocalNode(pool, f"http://{host}:{port}", process))
                port += 1
        _wait_ready(nodes, timeout_s)
    except BaseException:
        stop_nodes(nodes)
        raise
    return nodes


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
                    err = (
                        node.process.stderr.read().decode(errors="replace")
                        if node.process.stderr
                        else ""
                    )
                    last = err.strip().splitlines()[-1] if err.strip() else f"exit status {code}"
                    raise NodeStartError(
                        f"sim node of pool {node.pool.name} at {node.url} failed: {last}"
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
    stderr = node.process.stderr
    text = stderr.read().decode(errors="replace").strip() if stderr is not None else ""
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
