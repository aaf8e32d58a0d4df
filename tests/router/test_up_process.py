"""`tiergate up` as a user runs it: a real process tree that must not outlive its parent."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

CONFIG = """
router: {{ledgerPath: {ledger}}}
pools:
  - {{name: tiny, tier: batched, model: llama-3.1-8b, accelerator: wse-3,
      batching: {{maxNumSeqs: 4}}, replicas: 1}}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_stopping_up_stops_its_nodes(tmp_path: Path, sig: signal.Signals) -> None:
    config = tmp_path / "up.yaml"
    config.write_text(CONFIG.format(ledger=tmp_path / "ledger.sqlite"))
    router_port, node_port = free_port(), free_port()
    argv = [sys.executable, "-P", "-m", "tiergate", "up", "--config", str(config),
            "--port", str(router_port), "--first-node-port", str(node_port)]  # fmt: skip
    up = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert up.poll() is None, "tiergate up exited early"
            assert time.monotonic() < deadline, "tiergate up did not become ready"
            try:
                if httpx.get(f"http://127.0.0.1:{router_port}/readyz").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        assert listening(node_port)
        os.kill(up.pid, sig)
        up.wait(timeout=20)
        deadline = time.monotonic() + 15
        while listening(node_port):
            assert time.monotonic() < deadline, f"the sim node outlived tiergate up ({sig.name})"
            time.sleep(0.1)
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
