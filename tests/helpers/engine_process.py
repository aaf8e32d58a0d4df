"""A real vLLM engine process for the tests (a uniquely named module: conftest names clash).

`tools/real_engine.py` installs the engine and the model once per machine (cached, locked);
`EngineProcess` starts it on a free loopback port in a process group of its own, so that
stopping or killing it takes its engine-core child along. `start` returns at once, so that two
engines can start side by side (the start is mostly importing torch and vLLM, which leaves part
of the second core idle); `ensure_started` waits for `/health`. A test that kills the engine
leaves the next user of the fixture to start it again (`ensure_started`), whatever the test
order.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
from pathlib import Path
from types import ModuleType

import httpx
from loopback_ports import free_port
from polling_helpers import until

from tiergate.operator.gpu_pods import VLLM_SHUTDOWN_TIMEOUT_S

REPO = Path(__file__).resolve().parents[2]
INSTALLER = REPO / "tools" / "real_engine.py"
#: How long a first start may take on a busy 2-core machine (~45 s when idle).
ENGINE_START_WITHIN_S = 600.0
#: Seconds between two looks at `/health` while the engine starts (each a new client; the
#: engine starting beside it needs the CPU more).
HEALTH_POLL_S = 0.5


def installer() -> ModuleType:
    """tools/real_engine.py as a module (tools/ is not a package)."""
    spec = importlib.util.spec_from_file_location("real_engine", INSTALLER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class EngineProcess:
    """One vLLM server over the cached model; `url` is its base URL once started."""

    def __init__(
        self, root: Path, log: Path, *, max_num_seqs: int = 8, api_key: str | None = None
    ) -> None:
        self.root = root
        self.log = log
        self.max_num_seqs = max_num_seqs
        #: The key the engine requires on /v1 (vLLM's --api-key), or None for none.
        self.api_key = api_key
        self.process: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.starts = 0

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def ensure_started(self) -> str:
        """Start the engine unless it runs; its URL once `/health` answers 200."""
        self.start()
        until(
            self._healthy,
            lambda: (
                f"vLLM did not become healthy within {ENGINE_START_WITHIN_S:.0f} s:\n"
                f"{self.log_text()[-4000:]}"
            ),
            ENGINE_START_WITHIN_S,
            every_s=HEALTH_POLL_S,
        )
        return self.url

    def start(self) -> None:
        """Start the engine's process unless it runs, without waiting for it to serve."""
        if self.process is not None and self.process.poll() is None:
            return
        module = installer()
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.starts += 1
        with self.log.open("ab") as out:
            out.write(f"--- start {self.starts} on port {port}\n".encode())
            out.flush()
            # The model runs in the engine core's process: one torch import less per start.
            command = module.engine_command(self.root, port, self.max_num_seqs, worker_in_core=True)
            if self.api_key is not None:
                command += ["--api-key", self.api_key]
            # As the operator renders it: on SIGTERM the requests in flight finish.
            command += ["--shutdown-timeout", str(VLLM_SHUTDOWN_TIMEOUT_S)]
            self.process = subprocess.Popen(
                command,
                env=module.engine_environment(worker_in_core=True),
                # Not the repository: its `operator/` would shadow the standard library in the
                # engine's helper processes, which run without -P.
                cwd=self.root,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def _healthy(self) -> bool:
        assert self.process is not None
        assert self.process.poll() is None, f"vLLM exited:\n{self.log_text()[-4000:]}"
        try:
            return httpx.get(self.url + "/health", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def kill(self) -> None:
        """SIGKILL the engine and its children at once, as a crash or the OOM killer would."""
        self._signal_group(signal.SIGKILL)

    def terminate(self) -> None:
        """SIGTERM the engine's own process only, as the kubelet stops a container (its
        PID 1); `wait_exit` waits for it to go."""
        assert self.process is not None and self.process.poll() is None
        self.process.send_signal(signal.SIGTERM)

    def wait_exit(self, timeout_s: float) -> int:
        """The engine's exit status once it has exited (within `timeout_s`), its group gone."""
        assert self.process is not None
        code = self.process.wait(timeout_s)
        self.stop()  # what is left of its group; forgets the process
        return code

    def stop(self) -> None:
        """SIGTERM the engine's process group; SIGKILL what is left after 60 s."""
        self._signal_group(signal.SIGTERM)

    def _signal_group(self, sig: signal.Signals) -> None:
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            os.killpg(process.pid, sig)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(60)
        # The engine core lives in the same group and may outlive its parent by a moment.
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        # Forgotten at once: a group id signalled later could be someone else's by then.
        self.process = None
