"""`tiergate sim-node`: serve one simulated accelerator node (OpenAI API + vLLM metrics).

The spec comes whole from ``--pool-json`` (how the operator's pods and `tiergate up` start
nodes) or ``--pool-file`` (an InferencePool or just its spec, camelCase YAML), or from flags
alone; an explicit flag overrides that field of the spec. Either way it is validated once, by
`ReplicaSpec` (the model the InferencePool spec extends). One process, one uvicorn server,
access log off; SIGTERM/SIGINT shut down gracefully (open streams get a few seconds).
``--port 0`` picks a free port; the chosen one is printed as ``listening host=... port=...``.
"""

from __future__ import annotations

import argparse
import json
import logging
import socket
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ..engine.errors import EngineError
from ..replica_spec import PoolSpecError, ReplicaSpec, pool_fields
from ..server.config import DEFAULT_MAX_BODY_BYTES, NodeConfig, PoolFileError, load_pool_spec
from ..validation import first_problem
from .common import (
    CliError,
    add_serving_arguments,
    configure_logging,
    listen_socket,
    non_negative_int,
    port_number,
    positive_float,
    positive_int,
    spec_overrides,
    unit_interval,
)
from .connection_limits import ConnectionGate, ConnectionLimits
from .fd_budget import FdBudgetError, max_connections

GRACEFUL_SHUTDOWN_S = 5

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
    add_serving_arguments(parser, max_num_seqs=None, defaults=False)
    node = parser.add_argument_group("node")
    node.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    node.add_argument(
        "--port", type=port_number, default=8000, help="listen port (0: any free port)"
    )
    node.add_argument(
        "--served-model-name",
        action="append",
        metavar="NAME",
        help="name clients use (repeatable; default: the model name)",
    )
    node.add_argument("--node-name", help="x-tiergate-node header value (default host:port)")
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
    """Limits on clients' connections (sim_nodes/commands/connection_limits.py)."""
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
        help="close a connection idle this long (default %(default)g s)",
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


def replica_spec(args: argparse.Namespace) -> ReplicaSpec:
    """The spec from --pool-json or --pool-file (if any) overlaid with explicit flags."""
    data: dict[str, Any] = {}
    source = None  # where the spec came from, for its errors (None: flags alone)
    if args.pool_json is not None:
        data, source = dict(args.pool_json), "--pool-json"
    elif args.pool_file is not None:
        try:
            data, source = load_pool_spec(args.pool_file), f"pool file {args.pool_file}"
        except PoolFileError as exc:
            raise CliError(str(exc)) from None
    overrides = spec_overrides(args)
    batching = overrides.pop("batching", {})
    data.update(overrides)
    if batching:
        base = data.get("batching")
        data["batching"] = {**(base if isinstance(base, dict) else {}), **batching}
    if args.served_model_name:  # the names to answer to, all of them
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


def node_config(args: argparse.Namespace, spec: ReplicaSpec, port: int) -> NodeConfig:
    """The node's configuration from its spec and flags, once it listens on `port`."""
    bg = spec.background if spec.background and spec.background.sequences else None
    return NodeConfig(
        serving=spec,
        served_model_names=list(spec.names),
        node_name=args.node_name or f"{args.host}:{port}",
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

    from ..server.app import create_app
    from .limited_protocol import server_options

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
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
            **server_options(gate),
        )
    )
    server.run(sockets=[sock])
    return 0 if server.started else 1
