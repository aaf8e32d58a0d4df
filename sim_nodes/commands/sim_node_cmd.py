"""`tiergate sim-node`: serve one simulated accelerator node (OpenAI API + vLLM metrics).

The spec comes whole from ``--pool-json`` (how `tiergate up` starts nodes; the operator's
pods set it in $TIERGATE_POOL_JSON) or ``--pool-file`` (an InferencePool or just its spec,
camelCase YAML), or from flags alone; `vllm serve`'s command line (``serve MODEL`` and its
flags, `vllm_flags`) overrides the spec, and tiergate's own flags override both, field by
field. Either way it is validated once, by
`ReplicaSpec` (the model the InferencePool spec extends). One process, one uvicorn server,
access log off; SIGTERM/SIGINT shut down gracefully (open streams get a few seconds, or
vLLM's --shutdown-timeout).
``--port 0`` picks a free port; the chosen one is printed as ``listening host=... port=...``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tiergate.common.cli import (
    CliError,
    configure_logging,
    listen_socket,
    non_negative_int,
    port_number,
    positive_float,
    positive_int,
    unit_interval,
)
from tiergate.common.connection_limits import ConnectionGate, ConnectionLimits
from tiergate.common.fd_budget import FdBudgetError, max_connections
from tiergate.common.validation import first_problem

from ..catalogs import default_catalog
from ..engine.errors import EngineError
from ..replica_spec import (
    ACCELERATOR_ENV,
    CHIPS_ENV,
    NODE_NAME_ENV,
    POOL_JSON_ENV,
    PoolSpecError,
    ReplicaSpec,
    pool_fields,
)
from ..server.config import DEFAULT_MAX_BODY_BYTES, NodeConfig, PoolFileError, load_pool_spec
from .serving_args import add_serving_arguments, spec_overrides
from .vllm_flags import add_vllm_arguments, vllm_overrides

GRACEFUL_SHUTDOWN_S = 5


def graceful_shutdown_s(args: argparse.Namespace) -> int:
    """How long open streams get on SIGTERM: vLLM's --shutdown-timeout when given (0, as in
    vLLM, ends them at once), else GRACEFUL_SHUTDOWN_S."""
    given: int | None = args.vllm_shutdown_timeout
    return GRACEFUL_SHUTDOWN_S if given is None else given


#: File descriptors kept beside client connections: the event loop's, the standard streams.
RESERVED_FDS = 64


def pool_json_argument(text: str) -> dict[str, Any]:
    """Argument type of --pool-json: the spec's fields, checked as a pool file's are (errors
    say where, never quote the text back: it would be one long line)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(
            f"not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        ) from None
    try:
        return pool_fields(data)
    except PoolSpecError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--pool-file", type=Path, help="InferencePool (or its spec) YAML; flags override it"
    )
    source.add_argument(
        "--pool-json",
        type=pool_json_argument,
        metavar="JSON",
        help="InferencePool spec (or the object) as JSON, as the operator passes it; flags "
        "override it",
    )
    add_serving_arguments(parser, max_num_seqs=None, defaults=False, context=False)
    add_vllm_arguments(parser)
    node = parser.add_argument_group("node")
    node.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    node.add_argument(
        "--port", type=port_number, default=8000, help="listen port (0: any free port)"
    )
    node.add_argument(
        "--served-model-name",
        action="extend",
        nargs="+",
        metavar="NAME",
        help="names clients use, the first the primary (repeatable, or several after one flag "
        "as vLLM takes them; default: the model name)",
    )
    node.add_argument(
        "--node-name",
        help=f"x-tiergate-node header value (default ${NODE_NAME_ENV}, else host:port)",
    )
    node.add_argument("--seed", type=int, default=0, help="seed of text, tool calls and faults")
    node.add_argument(
        "--failure-rate",
        type=unit_interval,
        default=0.0,
        help="fraction of completion requests failed with 500/503",
    )
    node.add_argument(
        "--enable-fault-injection",
        action="store_true",
        help="honour the x-tiergate-fault request header (default: ignored; for fault drills)",
    )
    node.add_argument(
        "--background-sequences",
        type=non_negative_int,
        help="sequences kept decoding as other tenants' load (default: the spec's, or 0)",
    )
    node.add_argument(
        "--background-context-tokens",
        type=non_negative_int,
        help="context length of each background sequence",
    )
    node.add_argument(
        "--background-turn-input-tokens",
        type=non_negative_int,
        help="new prompt tokens each background user sends per turn (prefill interference)",
    )
    node.add_argument(
        "--background-turn-output-tokens",
        type=non_negative_int,
        help="tokens each background user decodes between turns",
    )
    node.add_argument(
        "--max-body-bytes",
        type=positive_int,
        default=DEFAULT_MAX_BODY_BYTES,
        help="largest request body (default 4 MiB)",
    )
    add_connection_arguments(parser)
    node.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        default="info",
        help="log level (default info)",
    )


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    """Limits on clients' connections (tiergate/common/connection_limits.py)."""
    limits = ConnectionLimits()
    g = parser.add_argument_group("connections")
    g.add_argument(
        "--header-timeout-s",
        type=positive_float,
        default=limits.header_timeout_s,
        help="a request's headers must arrive within this (default %(default)g s)",
    )
    g.add_argument(
        "--body-timeout-s",
        type=positive_float,
        default=limits.body_timeout_s,
        help="its body within this after them (default %(default)g s)",
    )
    g.add_argument(
        "--idle-timeout-s",
        type=positive_float,
        default=limits.idle_timeout_s,
        help="close a connection kept alive this long with no request (default %(default)g s; "
        "a new one must begin its request within --header-timeout-s)",
    )
    g.add_argument(
        "--max-connections",
        type=positive_int,
        default=None,
        help=f"connections open at once (default {limits.max_connections}, or fewer if the "
        "open-file limit has no room for them)",
    )


def connection_gate(args: argparse.Namespace) -> ConnectionGate:
    """The limits the flags ask for, the cap fitted in the open-file limit (CliError if the
    one asked for does not fit)."""
    try:
        cap, _ = max_connections(
            args.max_connections, setting="--max-connections", reserve=RESERVED_FDS
        )
    except FdBudgetError as exc:
        raise CliError(str(exc)) from None
    limits = ConnectionLimits(
        header_timeout_s=args.header_timeout_s,
        body_timeout_s=args.body_timeout_s,
        idle_timeout_s=args.idle_timeout_s,
        max_connections=cap,
    )
    return ConnectionGate(limits, logging.getLogger("tiergate.sim_node"))


def _environment_spec(environ: Mapping[str, str]) -> dict[str, Any]:
    """The spec the environment gives a node started without --pool-json or --pool-file."""
    text = environ.get(POOL_JSON_ENV)
    if text:
        try:
            return pool_json_argument(text)
        except argparse.ArgumentTypeError as exc:
            raise CliError(f"${POOL_JSON_ENV}: {exc}") from None
    data: dict[str, Any] = {}
    if environ.get(ACCELERATOR_ENV):
        data["accelerator"] = environ[ACCELERATOR_ENV]
    if environ.get(CHIPS_ENV):
        try:
            data["chips"] = int(environ[CHIPS_ENV])
        except ValueError:
            raise CliError(f"${CHIPS_ENV}: expected a whole number") from None
    return data


def replica_spec(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> ReplicaSpec:
    """The spec from --pool-json or --pool-file (else the environment) overlaid with `vllm
    serve`'s flags, then with tiergate's own."""
    data: dict[str, Any] = {}
    source = None  # where the spec came from, for its errors (None: flags alone)
    if args.pool_json is not None:
        data, source = dict(args.pool_json), "--pool-json"
    elif args.pool_file is not None:
        try:
            data, source = load_pool_spec(args.pool_file), f"pool file {args.pool_file}"
        except PoolFileError as exc:
            raise CliError(str(exc)) from None
    else:
        data = _environment_spec(environ)
        source = POOL_JSON_ENV if POOL_JSON_ENV in environ else None
    vllm = vllm_overrides(args, data, default_catalog())
    if vllm.get("speculativeDecoding") and args.draft_model is None:
        # --acceptance-rate completed vLLM's --speculative-config: it is no flag of its own.
        args = argparse.Namespace(**{**vars(args), "acceptance_rate": None})
    _merge(data, vllm)
    overrides = spec_overrides(args)
    _merge(data, overrides)
    if args.served_model_name and args.served_model_name != _names(data):
        # the names to answer to, all of them (when they are not the spec's own already)
        data["servedModelName"] = args.served_model_name[0]
        data["aliases"] = args.served_model_name[1:]
    _overlay_background(args, data)
    for required in ("model", "accelerator"):
        if required not in data:
            raise CliError(f"--{required} is required (or a pool spec that sets it)")
    try:
        return ReplicaSpec.model_validate(data)
    except ValidationError as exc:
        if source is None:
            raise
        raise CliError(f"{source}: {first_problem(exc)}") from None


def _names(data: dict[str, Any]) -> list[object]:
    """The names a spec mapping answers to, as `ReplicaSpec.names` gives them."""
    primary = data.get("servedModelName") or data.get("model")
    aliases = data.get("aliases")
    others = [a for a in aliases if a and a != primary] if isinstance(aliases, list) else []
    return [primary, *others]


def _merge(data: dict[str, Any], overrides: dict[str, Any]) -> None:
    """`overrides` over `data`, the batch limits field by field."""
    overrides = dict(overrides)
    batching = overrides.pop("batching", {})
    data.update(overrides)
    if batching:
        base = data.get("batching")
        data["batching"] = {**(base if isinstance(base, dict) else {}), **batching}


def _overlay_background(args: argparse.Namespace, data: dict[str, Any]) -> None:
    """The --background-* flags given, over the spec's background load (0 sequences: none)."""
    flags = {
        "sequences": args.background_sequences,
        "contextTokens": args.background_context_tokens,
        "turnInputTokens": args.background_turn_input_tokens,
        "turnOutputTokens": args.background_turn_output_tokens,
    }
    given = {k: v for k, v in flags.items() if v is not None}
    if not given:
        return
    base = data.get("background")
    merged = {**(base if isinstance(base, dict) else {}), **given}
    if not merged.get("sequences"):
        data.pop("background", None)
    elif not merged.get("contextTokens"):
        raise CliError("--background-sequences needs --background-context-tokens")
    else:
        data["background"] = merged


def node_config(
    args: argparse.Namespace,
    spec: ReplicaSpec,
    port: int,
    environ: Mapping[str, str] = os.environ,
) -> NodeConfig:
    """The node's configuration from its spec and flags, once it listens on `port`."""
    bg = spec.background if spec.background and spec.background.sequences else None
    return NodeConfig(
        serving=spec,
        served_model_names=list(spec.names),
        node_name=args.node_name or environ.get(NODE_NAME_ENV) or f"{args.host}:{port}",
        seed=args.seed,
        failure_rate=args.failure_rate,
        fault_header_enabled=args.enable_fault_injection,
        background_sequences=bg.sequences if bg else 0,
        background_context_tokens=bg.context_tokens if bg else 0,
        background_turn_input_tokens=bg.turn_input_tokens if bg else 0,
        background_turn_output_tokens=bg.turn_output_tokens if bg else 0,
        max_body_bytes=args.max_body_bytes,
    )


def run(args: argparse.Namespace) -> int:
    spec = replica_spec(args)
    gate = connection_gate(args)
    sock = listen_socket(args.host, args.port)
    try:
        return _serve(args, spec, sock, gate)
    finally:
        sock.close()


def _serve(
    args: argparse.Namespace,
    spec: ReplicaSpec,
    sock: socket.socket,
    gate: ConnectionGate,
) -> int:
    import uvicorn

    from tiergate.common.limited_protocol import server_options

    from ..server.app import create_app

    port = sock.getsockname()[1]
    config = node_config(args, spec, port)
    try:
        app = create_app(config)
    except EngineError as exc:
        raise CliError(str(exc)) from None
    configure_logging(args.log_level)
    print(f"listening host={args.host} port={port} model={config.names[0]}", flush=True)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            access_log=False,
            log_config=None,
            log_level=args.log_level,
            lifespan="on",
            timeout_graceful_shutdown=graceful_shutdown_s(args),
            **server_options(gate),
        )
    )
    server.run(sockets=[sock])
    return 0 if server.started else 1
