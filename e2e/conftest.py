"""Fixtures of the e2e suite: one cluster per session, one namespace and release per test.

Backends (TIERGATE_E2E_BACKEND):
- `local` (default): kwokctl's binary runtime on the binaries e2e/tools/install.sh builds, plus
  the pod runner (e2e/harness/pod_runner.py) standing in for a container runtime. Building the
  binaries needs the Go module proxy; if it cannot be reached the session fails, never skips.
- `kind`: an existing cluster (KUBECONFIG, e.g. from e2e/kind.sh) whose nodes run the image.
  The router is reached through `kubectl port-forward`.

Every failure message carries `kubectl describe` output and the pods' logs of the namespace.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "harness"))

from cluster import (  # noqa: E402
    REPO,
    HarnessError,
    LocalCluster,
    default_state,
    reap_stale_test_clusters,
    tools_bin,
)
from release import BACKEND, Release, installed, namespace_for, settle  # noqa: E402


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def cluster() -> Iterator[LocalCluster]:
    if BACKEND == "kind":
        kubeconfig = os.environ.get("KUBECONFIG")
        if not kubeconfig:
            pytest.fail("TIERGATE_E2E_BACKEND=kind needs KUBECONFIG (e2e/kind.sh sets it)")
        bin_dir = Path(os.environ.get("TIERGATE_E2E_BIN", ""))
        state = default_state("kind")
        state.mkdir(parents=True, exist_ok=True)
        c = LocalCluster("kind", state, bin_dir)
        (state / "kubeconfig").unlink(missing_ok=True)
        (state / "kubeconfig").symlink_to(Path(kubeconfig).resolve())
        yield c
        settle()
        return
    try:
        bin_dir = tools_bin()
    except HarnessError as exc:
        pytest.fail(f"cannot install the e2e tools: {exc}")
    reap_stale_test_clusters(bin_dir)
    name = f"tg-e2e-{os.getpid()}"
    c = LocalCluster(name, default_state(name), bin_dir)
    try:
        c.create()
        c.start_runner(REPO / ".venv" / "bin" / "tiergate")
    except HarnessError as exc:
        c.delete()
        pytest.fail(f"cannot start the local cluster: {exc}")
    yield c
    settle()
    c.delete()
    shutil.rmtree(c.state, ignore_errors=True)


@pytest.fixture
def release(cluster: LocalCluster, request: pytest.FixtureRequest) -> Iterator[Release]:
    """The chart installed and ready in a fresh namespace; removed after the test."""
    with installed(cluster, namespace_for(request.node.name)) as r:
        yield r
