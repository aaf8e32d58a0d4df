"""`tiergate router --epp-port` as users run it: a real router process serving the picker
beside its port, a real Envoy asking it, a sim node behind; and its clear refusals."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import openai
import pytest
from envoy_gateway import GatewayConfig, start_envoy
from epp_system import node
from polling_helpers import until
from process_helpers import start_router

from tiergate.sim_nodes.server import create_app

#: Real processes and servers: left out of `make test-fast`.
pytestmark = pytest.mark.slow

EPP_LISTENING = re.compile(r"event=epp_listening epp_url=grpcs?://127\.0\.0\.1:(\d+)")


def config(folder: Path, node_url: str, router: str = "") -> Path:
    path = folder / "router.yaml"
    path.write_text(
        f"router: {{ledgerPath: {folder / 'ledger.sqlite'}{router}}}\n"
        "pools:\n"
        "  - {name: b, tier: batched, model: llama-3.1-8b, accelerator: wse-3, "
        f"servedModelName: coder, endpoints: [{node_url}]}}\n"
    )
    return path


def test_tiergate_router_serves_the_picker_for_envoy(
    served: Callable[[Any], AbstractContextManager[str]], tmp_path: Path
) -> None:
    with served(create_app(node(["coder"]))) as node_url:
        router = start_router(config(tmp_path, node_url), tmp_path / "router.log",
                              "--epp-port", "0")  # fmt: skip
        try:
            until(lambda: EPP_LISTENING.search(router.log_text()) is not None, "no picker")
            match = EPP_LISTENING.search(router.log_text())
            assert match is not None
            envoy = start_envoy(GatewayConfig(epp_port=int(match[1])), tmp_path)
            try:
                client = openai.OpenAI(base_url=envoy.url + "/v1", api_key="unused")
                reply = client.chat.completions.with_raw_response.create(
                    model="coder", messages=[{"role": "user", "content": "Hi"}], max_tokens=3
                )
                assert reply.headers["x-tiergate-pool"] == "b"
                assert reply.parse().usage.completion_tokens == 3
            finally:
                envoy.stop()
        finally:
            status = router.stop()
    assert status in (0, -signal.SIGTERM), router.log_text()
    assert "Traceback" not in router.log_text(), router.log_text()


def run_router(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-P", "-m", "tiergate", "router", *args],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def test_a_taken_picker_port_is_one_clear_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        path = config(tmp_path, "http://127.0.0.1:9")
        ports = ["--port", "0", "--metrics-port", "0", "--epp-port", str(port)]
        done = run_router("--config", str(path), *ports)
    assert done.returncode == 2, done.stderr
    assert "router.eppPort" in done.stderr and "Traceback" not in done.stderr


def test_the_picker_port_flag_with_workers_says_to_use_the_config(tmp_path: Path) -> None:
    done = run_router("--config", str(config(tmp_path, "http://127.0.0.1:9")),
                      "--workers", "2", "--epp-port", "9002")  # fmt: skip
    assert done.returncode == 2
    assert "router.eppPort" in done.stderr and "Traceback" not in done.stderr
