"""`tiergate render POOL.yaml`: the Deployment and Service the operator would create for a pool,
printed as multi-document YAML, without a cluster (as `helm template` does).

The same pure functions as the operator's reconcile (`render.pool_manifests`), with the layout
the performance model resolves and the image the operator would choose (its flags here, with
the chart's defaults); a pool the operator would refuse is refused here, in one line. What the
operator adds when it applies them - its owner reference to the InferencePool and the pool's
`metadata.generation` in an annotation - needs a stored pool, and is left out.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from tiergate import __version__
from tiergate.common.cli import CliError
from tiergate.common.validation import first_problem
from tiergate.pools import DNS_LABEL, NAME_MAX, InferencePool, pool_name_problem
from tiergate.sim_nodes.catalogs import default_catalog

from ..images import DEFAULT_SGLANG_IMAGE, DEFAULT_VLLM_IMAGE, ImagePolicy
from ..render import DEFAULT_POD_SETTINGS, PodSettings, pool_manifests
from ..status import assess
from .operator_cmd import pull_secret

__all__ = ["add_arguments", "render_pool", "run"]

#: The chart's image for its own version: what `--image` defaults to without $TIERGATE_IMAGE.
DEFAULT_IMAGE = f"tiergate:{__version__}"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("pool", type=Path, metavar="POOL.yaml", help="an InferencePool manifest")
    p.add_argument("--namespace", default=None,
                   help="namespace of the objects (default: the pool's, else default)")  # fmt: skip
    p.add_argument("--image", default=os.environ.get("TIERGATE_IMAGE") or DEFAULT_IMAGE,
                   help=f"the sim image, as the operator's --image (default: $TIERGATE_IMAGE, "
                        f"else {DEFAULT_IMAGE})")  # fmt: skip
    p.add_argument("--vllm-image", default=DEFAULT_VLLM_IMAGE,
                   help="as the operator's --vllm-image (default %(default)s)")  # fmt: skip
    p.add_argument("--sglang-image", default=DEFAULT_SGLANG_IMAGE,
                   help="as the operator's --sglang-image (default %(default)s)")  # fmt: skip
    p.add_argument("--allowed-image", action="append", default=[], metavar="IMAGE",
                   help="as the operator's --allowed-image (repeatable)")  # fmt: skip
    p.add_argument("--model-cache-claim", metavar="PVC", default=None,
                   help="as the operator's --model-cache-claim (default: an emptyDir)")  # fmt: skip
    p.add_argument("--image-pull-secret", action="append", default=[], metavar="SECRET",
                   type=pull_secret,
                   help="as the operator's --image-pull-secret (repeatable)")  # fmt: skip


class _Dumper(yaml.SafeDumper):
    """Writes a mapping used twice (the pods' labels are the Deployment's) out twice, as
    kubectl shows it, not as a YAML anchor and alias."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _load(path: Path) -> InferencePool:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(f"cannot read {path}: {exc}") from None
    except yaml.YAMLError:
        raise CliError(f"{path} is not valid YAML") from None
    if not isinstance(data, dict) or data.get("kind") != "InferencePool":
        raise CliError(f"{path}: expected an InferencePool (kind: InferencePool)")
    try:
        return InferencePool.model_validate(data)
    except ValidationError as exc:
        raise CliError(f"{path}: {first_problem(exc)}") from None


def render_pool(
    pool: InferencePool,
    images: ImagePolicy,
    *,
    namespace: str | None = None,
    pods: PodSettings = DEFAULT_POD_SETTINGS,
) -> list[dict[str, Any]]:
    """The pool's Deployment and Service as the operator would apply them (CliError, one line,
    for a pool it would not run)."""
    name = pool.metadata.get("name")
    if not isinstance(name, str) or not name:
        raise CliError("the pool has no metadata.name (it names the Deployment and Service)")
    problem = pool_name_problem(name)
    if problem is not None:
        raise CliError(f"metadata.name {name[:80]!r}: {problem}")
    where = namespace or pool.metadata.get("namespace") or "default"
    if not isinstance(where, str) or len(where) > NAME_MAX or not re.fullmatch(DNS_LABEL, where):
        raise CliError(
            f"namespace {str(where)[:80]!r}: a namespace is at most {NAME_MAX} lowercase "
            "letters, digits and '-', starting and ending with a letter or digit"
        )
    if pool.spec.endpoint is not None:
        raise CliError(
            f"pool {name} is hosted (spec.endpoint): the operator runs no pods for it, so there "
            "is nothing to render"
        )
    assessment = assess(pool.spec, default_catalog())
    if assessment.layout is None:
        raise CliError(assessment.problem or f"does not fit: {assessment.misfit}")
    if assessment.problem is not None:
        raise CliError(f"invalid spec: {assessment.problem}")
    refusal = images.refusal(pool.spec)
    if refusal is not None:
        raise CliError(refusal)
    deployment, service = pool_manifests(
        name,
        where,
        pool.spec,
        images.engine_image(pool.spec),
        assessment.layout,
        settings=pods,
    )
    return [deployment, service]


def run(args: argparse.Namespace) -> int:
    images = ImagePolicy(
        args.image,
        frozenset(args.allowed_image),
        vllm=args.vllm_image,
        sglang=args.sglang_image,
    )
    manifests = render_pool(
        _load(args.pool),
        images,
        namespace=args.namespace,
        pods=PodSettings(
            model_cache_claim=args.model_cache_claim, pull_secrets=tuple(args.image_pull_secret)
        ),
    )
    sys.stdout.write(yaml.dump_all(manifests, Dumper=_Dumper, sort_keys=False, width=100))
    return 0
