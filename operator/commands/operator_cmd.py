"""`tiergate operator`: run the kopf operator, in a cluster or locally against a kubeconfig.

Watches InferencePools in the given namespaces (default: its own; every namespace only with
--all-namespaces, which needs cluster-wide permissions), renders sim-node Deployments with
`--image` (default: $TIERGATE_IMAGE, which the chart sets to the operator's own image), vLLM
and SGLang Deployments with `--vllm-image` / `--sglang-image`; a pool's `spec.template.image`
may name only those images or one given with `--allowed-image`. Every pool's pods run as
`--run-as-user` / `--run-as-group` (the chart passes its runAsUser / runAsGroup).
Replicas of the operator elect one writer through kopf peering: each starts with a random
priority, the highest one runs, the others stand by and take over when its peering record
expires. `--standalone` turns peering off (local development).
`--autoscale-interval` says how often the autoscaler decides for each autoscaled pool.
`--router-selector` says where the routers run (their pods' labels, in `--router-namespace`):
the autoscaler then counts the requests waiting in their queues in each pool's demand, for
pools of `--router-pools-namespace`, the namespace the routers route to.
`--gateway-pool NAME` puts the routers behind a Gateway API gateway: the operator keeps a
Gateway API Inference Extension InferencePool of that name in the routers' pools namespace,
selecting every pool's pods, with the routers' endpoint picker (`--epp-service`, `--epp-port`).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import yaml

from tiergate.common.cli import CliError, configure_logging, int_between, port_number
from tiergate.common.validation import yaml_position
from tiergate.pools import SECRET_NAME
from tiergate.sim_nodes.catalogs import CatalogError, default_catalog

from ..images import DEFAULT_SGLANG_IMAGE, DEFAULT_VLLM_IMAGE, ImagePolicy
from ..render import DEFAULT_RUN_AS, PodSettings, RunAs

if TYPE_CHECKING:
    from ..autoscale import Routers
    from ..gateway_pool import GatewayPool

PEERING_NAME = "tiergate"
#: The router's metrics port unless told otherwise (the chart's router.metricsPort default).
DEFAULT_ROUTER_METRICS_PORT = 8090
#: The endpoint picker's port unless told otherwise (GIE's convention, the chart's default).
DEFAULT_EPP_PORT = 9002
#: Seconds between two autoscaling decisions of a pool unless told otherwise (the chart's
#: operator.autoscaleIntervalSeconds default), and the most that may be asked for.
DEFAULT_AUTOSCALE_INTERVAL_S = 15
MAX_AUTOSCALE_INTERVAL_S = 3600
#: The largest user or group id Kubernetes accepts (int32).
MAX_ID = 2**31 - 1


def add_arguments(p: argparse.ArgumentParser) -> None:
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--namespace",
        action="append",
        default=[],
        help="watch this (repeatable; default: the operator's own namespace)",
    )
    where.add_argument("--all-namespaces", action="store_true",
                       help="watch every namespace (needs cluster-wide permissions)")  # fmt: skip
    p.add_argument("--image", default=os.environ.get("TIERGATE_IMAGE"),
                   help="image of the sim-node pods (default: $TIERGATE_IMAGE)")  # fmt: skip
    p.add_argument("--vllm-image",
                   default=os.environ.get("TIERGATE_VLLM_IMAGE") or DEFAULT_VLLM_IMAGE,
                   help="image of engine: vllm pods (default: $TIERGATE_VLLM_IMAGE, else "
                        f"{DEFAULT_VLLM_IMAGE})")  # fmt: skip
    p.add_argument("--sglang-image",
                   default=os.environ.get("TIERGATE_SGLANG_IMAGE") or DEFAULT_SGLANG_IMAGE,
                   help="image of engine: sglang pods (default: $TIERGATE_SGLANG_IMAGE, else "
                        f"{DEFAULT_SGLANG_IMAGE})")  # fmt: skip
    p.add_argument("--model-cache-claim", metavar="PVC",
                   default=os.environ.get("TIERGATE_MODEL_CACHE_CLAIM") or None,
                   help="PersistentVolumeClaim vllm and sglang pods cache weights on (default: "
                        "$TIERGATE_MODEL_CACHE_CLAIM, else an emptyDir per pod)")  # fmt: skip
    p.add_argument("--run-as-user", type=int_between(1, MAX_ID), metavar="UID",
                   default=os.environ.get("TIERGATE_RUN_AS_USER") or str(DEFAULT_RUN_AS.user),
                   help="the user every pool's pods run as (default: $TIERGATE_RUN_AS_USER, "
                        f"else {DEFAULT_RUN_AS.user})")  # fmt: skip
    p.add_argument("--run-as-group", type=int_between(1, MAX_ID), metavar="GID",
                   default=os.environ.get("TIERGATE_RUN_AS_GROUP") or str(DEFAULT_RUN_AS.group),
                   help="their group, and the owner of their volumes (default: "
                        f"$TIERGATE_RUN_AS_GROUP, else {DEFAULT_RUN_AS.group})")  # fmt: skip
    p.add_argument("--image-pull-secret", action="append", default=[], metavar="SECRET",
                   type=pull_secret,
                   help="a Secret every pool's pods pull their images with, in the pool's "
                        "namespace (repeatable; a pool's spec.template.imagePullSecrets "
                        "follow)")  # fmt: skip
    p.add_argument("--allowed-image", action="append", default=[], metavar="IMAGE",
                   help="another image a pool's spec.template.image may name (repeatable; "
                        "whole references; default: only --image)")  # fmt: skip
    p.add_argument("--health-port", type=int_between(1, 65535), default=8081,
                   help="liveness: GET /healthz")  # fmt: skip
    p.add_argument("--metrics-port", type=port_number, default=8082,
                   help="Prometheus metrics: GET /metrics (0: none)")  # fmt: skip
    p.add_argument("--autoscale-interval", type=int, default=DEFAULT_AUTOSCALE_INTERVAL_S,
                   metavar="SECONDS",
                   help="seconds between two autoscaling decisions of a pool, 1 to "
                        f"{MAX_AUTOSCALE_INTERVAL_S} (default: "
                        f"{DEFAULT_AUTOSCALE_INTERVAL_S})")  # fmt: skip
    routers = p.add_argument_group("the routers' queues, read by the autoscaler")
    routers.add_argument("--router-selector", metavar="SELECTOR",
                         help="label selector of the router's pods (unset: the autoscaler "
                              "reads the pools' pods alone)")  # fmt: skip
    routers.add_argument("--router-namespace", metavar="NAMESPACE",
                         help="where the router's pods run (default: the operator's own "
                              "namespace)")  # fmt: skip
    routers.add_argument("--router-metrics-port", type=int, default=DEFAULT_ROUTER_METRICS_PORT,
                         metavar="PORT", help="the router's metrics port (default: "
                         f"{DEFAULT_ROUTER_METRICS_PORT})")  # fmt: skip
    routers.add_argument("--router-pools-namespace", metavar="NAMESPACE",
                         help="the namespace whose pools the routers route to (default: "
                              "--router-namespace)")  # fmt: skip
    gateway = p.add_argument_group("behind a Gateway API gateway")
    gateway.add_argument("--gateway-pool", metavar="NAME",
                         help="keep a GIE InferencePool (inference.networking.k8s.io/v1) of "
                              "this name in --router-pools-namespace (unset: none)")  # fmt: skip
    gateway.add_argument("--epp-service", metavar="SERVICE",
                         help="the Service of the routers' endpoint picker (required with "
                              "--gateway-pool)")  # fmt: skip
    gateway.add_argument("--epp-port", type=int, default=DEFAULT_EPP_PORT, metavar="PORT",
                         help=f"that Service's port (default: {DEFAULT_EPP_PORT})")  # fmt: skip
    gateway.add_argument("--gateway-failure-mode", choices=("FailClose", "FailOpen"),
                         default="FailClose",
                         help="what the gateway does when the picker does not answer: refuse "
                              "(FailClose, the default) or pick a pod itself")  # fmt: skip
    p.add_argument("--standalone", action="store_true", help="no peering (one replica only)")
    p.add_argument("--kubeconfig", default=None, help="outside a cluster (default: $KUBECONFIG)")
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info")


def operator_options(
    args: argparse.Namespace, own_namespace: Callable[[], str] = lambda: "default"
) -> dict[str, Any]:
    """kopf.operator's keyword arguments for these flags.

    Every namespace only with --all-namespaces; with no --namespace either, `own_namespace()`
    (the operator's own: `current_namespace`). Peering is named only when it is wanted: a
    peering name makes kopf's peering mandatory, and mandatory peering in standalone mode
    watches no peering object and stays paused.
    """
    namespaces = [] if args.all_namespaces else (args.namespace or [own_namespace()])
    options: dict[str, Any] = {
        "clusterwide": bool(args.all_namespaces),
        "namespaces": namespaces,
        "standalone": args.standalone,
        "liveness_endpoint": f"http://0.0.0.0:{args.health_port}/healthz",
    }
    if not args.standalone:
        options["peering_name"] = PEERING_NAME
        options["priority"] = random.SystemRandom().randint(1, 1_000_000)
    return options


def image_policy(args: argparse.Namespace) -> ImagePolicy:
    """The images pools may run: --image, the engines' and every --allowed-image."""
    return ImagePolicy(
        args.image, frozenset(args.allowed_image), vllm=args.vllm_image, sglang=args.sglang_image
    )


def pod_settings(args: argparse.Namespace) -> PodSettings:
    """What every pool's pods get: --run-as-user / --run-as-group, --model-cache-claim and
    --image-pull-secret."""
    return PodSettings(
        run_as=RunAs(user=args.run_as_user, group=args.run_as_group),
        model_cache_claim=args.model_cache_claim,
        pull_secrets=tuple(args.image_pull_secret),
    )


def pull_secret(value: str) -> str:
    """--image-pull-secret: a Secret's name, as Kubernetes checks it."""
    if len(value) > 253 or re.fullmatch(SECRET_NAME, value) is None:
        raise argparse.ArgumentTypeError(
            f"{value[:80]!r} is not a Secret's name (at most 253 lowercase letters, digits, "
            "'-' and '.', a letter or digit first and last)"
        )
    return value


def routers(args: argparse.Namespace, own_namespace: Callable[[], str]) -> Routers | None:
    """Where the routers run, from the --router-* flags (None without --router-selector)."""
    if not args.router_selector:
        return None
    if not 0 < args.router_metrics_port < 65536:
        raise CliError(f"--router-metrics-port {args.router_metrics_port}: not a port")
    from ..autoscale import MetricsScraper, Routers  # kopf and the API client: not for --help

    namespace = args.router_namespace or own_namespace()
    return Routers(
        namespace=namespace,
        selector=args.router_selector,
        serves=args.router_pools_namespace or namespace,
        scrape=MetricsScraper(port=args.router_metrics_port),
    )


def gateway_pool(args: argparse.Namespace, own_namespace: Callable[[], str]) -> GatewayPool | None:
    """The GIE InferencePool to keep, from the --gateway-pool flags (None without it)."""
    if not args.gateway_pool:
        return None
    if not args.epp_service:
        raise CliError("--gateway-pool needs --epp-service: the Service of the endpoint picker")
    if not 0 < args.epp_port < 65536:
        raise CliError(f"--epp-port {args.epp_port}: not a port")
    from ..gateway_pool import GatewayPool

    namespace = args.router_pools_namespace or args.router_namespace or own_namespace()
    return GatewayPool(
        namespace=namespace,
        name=args.gateway_pool,
        epp_service=args.epp_service,
        epp_port=args.epp_port,
        failure_mode=args.gateway_failure_mode,
    )


def autoscale_interval(args: argparse.Namespace) -> int:
    """--autoscale-interval, checked."""
    if not 1 <= args.autoscale_interval <= MAX_AUTOSCALE_INTERVAL_S:
        raise CliError(
            f"--autoscale-interval {args.autoscale_interval}: not between 1 and "
            f"{MAX_AUTOSCALE_INTERVAL_S} seconds"
        )
    return int(args.autoscale_interval)


def run(args: argparse.Namespace) -> int:
    if not args.image:
        raise CliError("no sim-node image: pass --image or set TIERGATE_IMAGE")
    interval_s = autoscale_interval(args)
    try:
        catalog = default_catalog()
    except CatalogError as exc:
        raise CliError(str(exc)) from None
    configure_logging(args.log_level)
    import kopf
    from kubernetes.config import ConfigException

    from .. import handlers
    from ..kube import current_namespace, load_kube_config

    try:
        load_kube_config(args.kubeconfig)
    except (ConfigException, OSError) as exc:
        raise CliError(f"no Kubernetes credentials: {exc}") from None
    except (ValueError, TypeError, AttributeError, KeyError, yaml.YAMLError) as exc:
        raise CliError(f"no Kubernetes credentials: {_not_a_kubeconfig(args, exc)}") from None
    # Not kopf.configure(): it adds a second root handler, and every line would print twice in
    # two formats. kopf's loggers go through configure_logging's handler like everything else.
    options = operator_options(args, lambda: current_namespace(args.kubeconfig))
    memo = handlers.OperatorMemo(
        catalog=catalog,
        images=image_policy(args),
        namespaced=not options["clusterwide"],
        pods=pod_settings(args),
        routers=routers(args, lambda: current_namespace(args.kubeconfig)),
        gateway=gateway_pool(args, lambda: current_namespace(args.kubeconfig)),
    )
    if args.metrics_port:
        try:
            memo.metrics.serve(args.metrics_port)
        except OSError as exc:
            raise CliError(f"cannot serve metrics on port {args.metrics_port}: {exc}") from None
    handlers.register_autoscaler(interval_s)
    logging.getLogger("tiergate.operator").info("event=autoscaler interval_s=%d", interval_s)
    asyncio.run(kopf.operator(memo=memo, **options))
    return 0


def _not_a_kubeconfig(args: argparse.Namespace, exc: Exception) -> str:
    """Why the kubeconfig could not be read, without quoting it (it holds credentials)."""
    where = args.kubeconfig or os.environ.get("KUBECONFIG") or "the kubeconfig"
    if isinstance(exc, UnicodeDecodeError):
        return f"{where} is not UTF-8 text"
    if isinstance(exc, yaml.YAMLError):
        return f"{where} is not valid YAML{yaml_position(exc)}"
    return f"{where} is not a kubeconfig (a mapping of clusters, users and contexts)"
