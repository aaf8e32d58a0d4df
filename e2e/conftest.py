"""Fixtures of the e2e suite: one cluster per run, one namespace and release per test (or per
module, where its tests only make pools of their own and remove them after: `pools_removed`).

Backends (TIERGATE_E2E_BACKEND):
- `local` (default): kwokctl's binary runtime on the binaries e2e/tools/install.sh builds, plus
  the pod runner (e2e/harness/pod_runner.py) standing in for a container runtime. Building the
  binaries needs the Go module proxy; if it cannot be reached the session fails, never skips.
- `kind`: an existing cluster (KUBECONFIG, e.g. from e2e/kind.sh) whose nodes run the image.
  The router is reached through `kubectl port-forward`.

`make e2e` starts one local cluster for both of its passes (e2e/harness/shared_cluster.py,
which names it in TIERGATE_E2E_SHARED_CLUSTER); every test process attaches to it, each test in
a namespace of its own. Tests marked `serial` measure speed and run in a pass of their own,
once the first pass's namespaces are emptied. Without it, the controlling process of an xdist run
starts the cluster before its workers and deletes it after them, and a run in one process starts
its own.

Every failure message carries `kubectl describe` output and the pods' logs of the namespace.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent / "harness"))

from cluster import HarnessError, LocalCluster, default_state  # noqa: E402
from release import BACKEND, Release, installed, namespace_for, settle  # noqa: E402
from scheduling import scheduler  # noqa: E402
from shared_cluster import SHARED, attached, delete, local_cluster, share  # noqa: E402
from shared_tls_context import share as share_tls_context  # noqa: E402

share_tls_context()  # one default TLS context for the run's httpx clients (tests/helpers/)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.e2e)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Tests handed out one by one, but modules that share a fixture whole (harness/scheduling)."""
    return scheduler(config, log)


def _controls_workers(config: pytest.Config) -> bool:
    """True in the controlling process of an xdist run (it runs no test itself)."""
    workers = getattr(config.option, "numprocesses", None)
    return bool(workers) and not hasattr(config, "workerinput")


#: The cluster the controlling process started for its workers.
_shared: list[LocalCluster] = []


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """Controlling process of an xdist run with no shared cluster: start one before the
    workers start (they inherit its address through the environment)."""
    if BACKEND != "local" or SHARED in os.environ or not _controls_workers(session.config):
        return
    try:
        c = local_cluster()
    except HarnessError as exc:
        pytest.exit(f"cannot start the local cluster: {exc}", returncode=1)
    _shared.append(c)
    os.environ[SHARED] = share(c)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Controlling process: the workers are gone, and their namespaces emptied; the cluster
    goes."""
    while _shared:
        delete(_shared.pop())


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
    shared = os.environ.get(SHARED)
    if shared:
        yield attached(shared)
        settle()  # this process's namespaces emptied before the next pass or the cluster's end
        return
    try:
        c = local_cluster()
    except HarnessError as exc:
        pytest.fail(f"cannot start the local cluster: {exc}")
    yield c
    settle()
    delete(c)


@pytest.fixture(scope="module")
def module_release(cluster: LocalCluster, request: pytest.FixtureRequest) -> Iterator[Release]:
    """The chart installed once for a module, in a namespace named after it. A module takes it
    in a module-scoped `release` fixture of its own (which is how `make e2e` knows to run the
    module whole in one process) and removes its tests' pools after each (`pools_removed`)."""
    name = request.module.__name__.removeprefix("test_").replace("_", "-")
    with installed(cluster, namespace_for(name)) as r:
        yield r


@pytest.fixture
def pools_removed(release: Release) -> Iterator[None]:
    """For a module whose tests share one release (a module-scoped `release` of its own):
    the pools a test made are removed after it."""
    yield
    release.remove_pools()


@pytest.fixture
def release(cluster: LocalCluster, request: pytest.FixtureRequest) -> Iterator[Release]:
    """The chart installed and ready in a fresh namespace; removed after the test."""
    with installed(cluster, namespace_for(request.node.name)) as r:
        yield r
