"""One local cluster for a whole `make e2e`: both of its passes and every process of each.

    python -P e2e/harness/shared_cluster.py -- COMMAND...

starts a cluster and its pod runner, runs COMMAND with TIERGATE_E2E_SHARED_CLUSTER naming them
(e2e/conftest.py attaches to it instead of starting one), deletes the cluster, and exits with
COMMAND's status. A pytest run started without it starts a cluster of its own. With
TIERGATE_E2E_BACKEND=kind it only runs COMMAND: that cluster exists already.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # run with -P, its folder is not on the path

from cluster import (  # noqa: E402
    CHART,
    REPO,
    HarnessError,
    LocalCluster,
    default_state,
    reap_stale_test_clusters,
    tools_bin,
)

__all__ = ["SHARED", "attached", "delete", "local_cluster", "share"]

#: The shared cluster's name, state folder and binaries (JSON), for the test processes.
SHARED = "TIERGATE_E2E_SHARED_CLUSTER"


def local_cluster() -> LocalCluster:
    """A new local cluster and its pod runner (stale ones of dead runs deleted first), named
    after this process (tg-e2e-<pid>)."""
    bin_dir = tools_bin()
    assert bin_dir is not None
    reap_stale_test_clusters(bin_dir)
    name = f"tg-e2e-{os.getpid()}"
    c = LocalCluster(name, default_state(name), bin_dir)
    try:
        c.create()
        # The chart's CRDs now (helm skips those present): the garbage collector looks for new
        # kinds every 30 s, and until it has seen InferencePool a pool's foreground deletion
        # waits for it (up to 30 s in the first test to delete one).
        c.kubectl("apply", "--server-side", "-f", str(CHART / "crds"))
        c.start_runner(REPO / ".venv" / "bin" / "tiergate")
    except HarnessError:
        c.delete()
        raise
    return c


def delete(c: LocalCluster) -> None:
    c.delete()
    shutil.rmtree(c.state, ignore_errors=True)


def share(c: LocalCluster) -> str:
    """What SHARED holds for `c`."""
    return json.dumps({"name": c.name, "state": str(c.state), "bin": str(c.bin)})


def attached(value: str) -> LocalCluster:
    """The cluster SHARED names."""
    where = json.loads(value)
    return LocalCluster(where["name"], Path(where["state"]), Path(where["bin"]))


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "--" or len(argv) < 2:
        print("usage: shared_cluster.py -- COMMAND...", file=sys.stderr)
        return 2
    command = argv[1:]
    if os.environ.get("TIERGATE_E2E_BACKEND", "local") != "local":
        return subprocess.call(command)
    try:
        c = local_cluster()
    except HarnessError as exc:
        print(f"e2e: cannot start the local cluster: {exc}", file=sys.stderr)
        return 1
    try:
        return subprocess.call(command, env={**os.environ, SHARED: share(c)})
    except KeyboardInterrupt:  # the command had the Ctrl-C too, and has stopped
        return 130
    finally:
        delete(c)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
