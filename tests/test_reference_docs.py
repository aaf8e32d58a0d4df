"""The docs site's reference pages generated from the code (tools/reference_docs.py) are the
committed ones, and the check fails when one is stale."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

#: Real processes and servers, or seconds of work: left out of `make test-fast`.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "reference_docs.py"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-P", str(TOOL), *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_committed_reference_pages_are_what_the_code_generates() -> None:
    done = run("--check")
    assert done.returncode == 0, f"stale reference pages: run `make docs-reference`\n{done.stdout}"


def test_check_fails_on_an_edited_page(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "docs" / "reference", tmp_path / "docs" / "reference")
    page = tmp_path / "docs" / "reference" / "inference-pool.md"
    page.write_text(page.read_text(encoding="utf-8") + "edited\n", encoding="utf-8")
    done = run("--check", "--root", str(tmp_path))
    assert done.returncode == 1
    assert "stale" in done.stdout and "inference-pool.md" in done.stdout
    assert "cli.md" not in done.stdout
