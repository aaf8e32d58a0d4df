"""Helpers of the chart tests: running helm, and finding things in rendered manifests."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "tiergate"
VARIANT = Path(__file__).with_name("values-variant.yaml")
TOOLS_SCRIPT = REPO / "tools" / "k8s_tools.py"
KUBE_VERSION = "1.33.0"
RELEASE = "tg"
NAMESPACE = "tiergate-system"

Manifest = dict[str, Any]


class HelmFailed(Exception):
    """`helm` exited non-zero; the message is its stderr."""


def _documents(text: str) -> list[Manifest]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


class Helm:
    """Runs the helm binary with its own empty config, cache and data directories."""

    def __init__(self, binary: Path, home: Path) -> None:
        self.binary = binary
        self.env = {
            **os.environ,
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
        }

    def run(self, *args: str) -> str:
        """helm's stdout; HelmFailed with its stderr when it fails."""
        result = subprocess.run(
            [str(self.binary), *args], capture_output=True, text=True, env=self.env, check=False
        )
        if result.returncode != 0:
            raise HelmFailed(result.stderr.strip())
        return result.stdout

    def template(
        self,
        *,
        values: Sequence[Path] = (),
        sets: Sequence[str] = (),
        set_strings: Sequence[str] = (),
        set_jsons: Sequence[str] = (),
        include_crds: bool = False,
        chart: Path = CHART,
        release: str = RELEASE,
        namespace: str = NAMESPACE,
    ) -> list[Manifest]:
        """`helm template` as a list of manifests (test hooks included)."""
        args = ["template", release, str(chart), "--namespace", namespace]
        args += ["--kube-version", KUBE_VERSION]
        for path in values:
            args += ["--values", str(path)]
        for assignment in sets:
            args += ["--set", assignment]
        for assignment in set_strings:
            args += ["--set-string", assignment]
        for assignment in set_jsons:
            args += ["--set-json", assignment]
        if include_crds:
            args.append("--include-crds")
        return _documents(self.run(*args))


def find(manifests: list[Manifest], kind: str, name: str | None = None) -> list[Manifest]:
    """Manifests of `kind` (and `name`, if given)."""
    return [
        m
        for m in manifests
        if m["kind"] == kind and (name is None or m["metadata"]["name"] == name)
    ]


def one(manifests: list[Manifest], kind: str, name: str) -> Manifest:
    """The single manifest of that kind and name."""
    found = find(manifests, kind, name)
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def ingress_by_port(manifests: list[Manifest]) -> dict[str, list[dict[str, Any]]]:
    """The router NetworkPolicy's rules: port name -> the `from` peers of each rule naming it
    ({} for a rule open to every source)."""
    rules: dict[str, list[dict[str, Any]]] = {}
    for rule in one(manifests, "NetworkPolicy", ROUTER)["spec"]["ingress"]:
        for port in rule["ports"]:
            rules.setdefault(port["port"], []).extend(rule.get("from", []) or [{}])
    return rules


def pod_specs(manifests: list[Manifest]) -> list[tuple[str, Manifest]]:
    """(where, pod spec) for every pod the manifests would create."""
    specs = []
    for m in manifests:
        where = f"{m['kind']}/{m['metadata']['name']}"
        if m["kind"] == "Pod":
            specs.append((where, m["spec"]))
        elif m["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
            specs.append((where, m["spec"]["template"]["spec"]))
    return specs


#: The gateway's pods, for values that put the routers behind one (router.eppPort, with or
#: without gatewayPool.enabled): GATEWAY_FROM sets them, GATEWAY_PEER is the peer it renders.
GATEWAY_NAMESPACE = "gateways"
GATEWAY_FROM = (
    "gatewayPool.gatewayFrom[0].namespaceSelector.matchLabels."
    f"kubernetes\\.io/metadata\\.name={GATEWAY_NAMESPACE}"
)
GATEWAY_PEER = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": GATEWAY_NAMESPACE}}
}

ROUTER = f"{RELEASE}-tiergate-router"
OPERATOR = f"{RELEASE}-tiergate-operator"
