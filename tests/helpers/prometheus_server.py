"""A real Prometheus for tests: Debian's `prometheus` package (installed with apt-get when it is
missing and the tests run as root), started on a free loopback port with its own data
directory and configuration, never the package's service; stopped afterwards.

A missing Prometheus is a failure with one line saying how to install it, never a skip.
(A uniquely named module: conftest names clash.)
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from loopback_ports import free_port
from polling_helpers import until

#: The longest Prometheus may take to start or stop on a busy machine.
START_WITHIN_S = 60.0
INSTALL_HINT = "install Debian's prometheus package: apt-get install -y prometheus"


class PrometheusMissing(RuntimeError):
    """No prometheus/promtool binaries, and apt-get could not install them."""


def binaries() -> tuple[Path, Path]:
    """`prometheus` and `promtool`, installing Debian's package if they are missing (again
    after `apt-get update` when the package lists were stale)."""
    found = _which()
    if found is not None:
        return found
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise PrometheusMissing(f"no prometheus/promtool on PATH: {INSTALL_HINT}")
    failure = ""
    for argv in (["apt-get", "install", "-y", "-q", "prometheus"], ["apt-get", "update", "-q"],
                 ["apt-get", "install", "-y", "-q", "prometheus"]):  # fmt: skip
        result = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
            check=False,
        )
        found = _which()
        if found is not None:
            return found
        failure = f"`{' '.join(argv)}` failed ({result.returncode}): {result.stderr.strip()[-300:]}"
    raise PrometheusMissing(f"{failure}; {INSTALL_HINT}")


def _which() -> tuple[Path, Path] | None:
    server, tool = shutil.which("prometheus"), shutil.which("promtool")
    return (Path(server), Path(tool)) if server and tool else None


def check_rules(promtool: Path, rules: Path) -> str:
    """`promtool check rules`: its output; AssertionError with it when the rules are bad."""
    result = subprocess.run(
        [str(promtool), "check", "rules", str(rules)], capture_output=True, text=True, check=False
    )
    output = (result.stdout + result.stderr).strip()
    assert result.returncode == 0, f"promtool check rules {rules}:\n{output}"
    return output


@dataclass
class PrometheusServer:
    """One server scraping `scrape_configs` every second and evaluating `rule_files` every
    second: `start()`, `stop()`, and queries through its HTTP API."""

    root: Path
    scrape_configs: list[dict[str, Any]]
    rule_files: list[Path] = field(default_factory=list)
    port: int = field(default_factory=free_port)
    binary: Path = field(default_factory=lambda: binaries()[0])
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        config = {
            "global": {
                "scrape_interval": "1s",
                "scrape_timeout": "1s",
                "evaluation_interval": "1s",
            },
            "rule_files": [str(path) for path in self.rule_files],
            "scrape_configs": self.scrape_configs,
        }
        config_file = self.root / "prometheus.yml"
        config_file.write_text(yaml.safe_dump(config))
        (self.root / "data").mkdir(exist_ok=True)
        argv = [
            str(self.binary),
            f"--config.file={config_file}",
            f"--storage.tsdb.path={self.root / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--web.enable-lifecycle",
            "--log.level=warn",
        ]
        log = (self.root / "prometheus.log").open("wb")
        self.process = subprocess.Popen(argv, stdout=log, stderr=log, cwd=self.root)
        log.close()
        until(self._ready, f"prometheus did not become ready: {self.log_tail()}", START_WITHIN_S)

    def _ready(self) -> bool:
        assert self.process is not None and self.process.poll() is None, (
            f"prometheus exited: {self.log_tail()}"
        )
        try:
            return httpx.get(self.url + "/-/ready", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=START_WITHIN_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None

    def log_tail(self) -> str:
        path = self.root / "prometheus.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""

    def api(self, path: str, **params: str | float) -> Any:
        """The `data` of a successful /api/v1 call; AssertionError with the error otherwise."""
        reply = httpx.get(f"{self.url}/api/v1/{path}", params=params, timeout=30)
        body = reply.json()
        assert body.get("status") == "success", f"{path} {params}: {body}"
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's series."""
        result: list[dict[str, Any]] = self.api("query", query=expr)["result"]
        return result

    def query_range(self, expr: str, start: float, end: float) -> list[dict[str, Any]]:
        """A range query's series, one point a second."""
        result: list[dict[str, Any]] = self.api(
            "query_range", query=expr, start=start, end=end, step=1
        )["result"]
        return result

    def firing(self) -> list[dict[str, Any]]:
        """Alerts firing now (pending ones left out)."""
        alerts: list[dict[str, Any]] = self.api("alerts")["alerts"]
        return [a for a in alerts if a["state"] == "firing"]
