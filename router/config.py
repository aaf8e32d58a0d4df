"""The router's configuration file: the router's own settings and its pools.

A pool has the fields of an InferencePool spec (camelCase, `ServingSpec` plus tier, names and
replicas) and, for the static discovery source, the URLs of its endpoints. `tiergate up`
uses the same file and starts the endpoints itself (`replicas` sim nodes per pool), so a
pool there needs no URLs; `background` configures those sim nodes' other-tenant load.

With `discovery.kubernetes` set, pools come from InferencePool objects and their sim-node
pods instead, and the file's `pools` must be empty: two sources of truth for one pool name
would disagree sooner or later.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ByteSize,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from tiergate.common.connection_limits import (
    DEFAULT_MAX_CONNECTIONS,
    IDLE_TIMEOUT_S,
    ConnectionLimits,
)
from tiergate.common.validation import first_problem, yaml_position
from tiergate.pools import (
    DNS_LABEL,
    BackgroundLoad,
    Billing,
    HostedEndpoint,
    InferencePoolSpec,
    ReferenceWorkload,
)
from tiergate.router.policy.config import PolicyConfig, default_policy
from tiergate.router.tier_queue import AdmissionOrder

__all__ = [
    "BackgroundLoad",
    "Billing",
    "ConfigError",
    "MAX_REPLY_BYTES",
    "ConnectionSettings",
    "EppTls",
    "LocalSettings",
    "PoolSpec",
    "ReferenceWorkload",
    "RouterConfig",
    "RouterSettings",
    "load_config",
]


#: The largest whole reply read from a node by default (router.maxReplyBytes): far past a real
#: one (a chat reply with `n: 16` choices of 32k tokens is about 2 MB, with 20 `top_logprobs`
#: for every token about 40 MB), small enough that a few at once fit in memory.
MAX_REPLY_BYTES = 64 * 1024 * 1024
#: How long requests in flight get to finish when the router stops, by default
#: (router.shutdownGraceS).
SHUTDOWN_GRACE_S = 10
#: The largest request body by default (router.maxBodyBytes).
MAX_BODY_BYTES = 4 * 1024 * 1024
#: An entry of router.allowedMediaDomains: `*`, a host name (or an IPv4 address), or `*.` and
#: a domain whose last label is a name (`*.0.0.1` would match 10.0.0.1).
MEDIA_DOMAIN = re.compile(
    r"\*|[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*"
    r"|\*\.([a-z0-9]([a-z0-9-]*[a-z0-9])?\.)*[a-z]([a-z0-9-]*[a-z0-9])?"
)
#: Until a stream's head from a node, and between two parts of any reply
#: (router.upstreamReadTimeoutS): long, since a stream may pause while a busy node prefills a
#: long prompt.
READ_TIMEOUT_S = 300.0
#: Until a whole reply's head from a node (router.wholeReplyTimeoutS), which it sends once it
#: has generated the reply: what the OpenAI and Anthropic SDKs wait for a reply by default.
WHOLE_REPLY_TIMEOUT_S = 600.0


class ConfigError(ValueError):
    """The configuration file is unreadable or invalid; the message names the field."""


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid", alias_generator=to_camel, populate_by_name=True, allow_inf_nan=False
    )


class FileHostedEndpoint(HostedEndpoint):
    """A hosted API as a router file names it: the key in a file rather than a Secret (an
    InferencePool read by the router's Kubernetes discovery keeps its Secret)."""

    api_key_file: Path | None = Field(
        default=None,
        description="A file holding the provider's API key (e.g. a mounted Secret's key); "
        "read again when it changes.",
    )


class PoolSpec(InferencePoolSpec):
    """One pool: an InferencePool spec plus its name and where its endpoints are."""

    field_prefix: ClassVar[str] = ""  # a file's pool holds the spec's fields itself

    name: str = Field(pattern=DNS_LABEL, max_length=63, description="The pool's name.")
    endpoints: list[str] = Field(default_factory=list, description="Base URLs (static source).")
    endpoint: FileHostedEndpoint | None = Field(
        default=None,
        description="A hosted OpenAI-compatible API that serves the pool instead of "
        "`endpoints` or sim nodes: the router sends it the key of `apiKeyFile` and bills "
        "`billing`, which it must state.",
    )

    @field_validator("endpoints")
    @classmethod
    def _urls(cls, urls: list[str]) -> list[str]:
        return [_endpoint_url(url) for url in urls]

    def _hosted_key_problem(self, endpoint: HostedEndpoint) -> str | None:
        if self.endpoints:
            return "a hosted pool (endpoint) has no `endpoints`: the provider's URL is its one"
        given = isinstance(endpoint, FileHostedEndpoint) and endpoint.api_key_file is not None
        if given == (endpoint.api_key_secret_ref is not None):
            return (
                "endpoint.apiKeyFile is required: the file holding the provider's API key"
                if not given
                else "give endpoint.apiKeyFile or endpoint.apiKeySecretRef, not both"
            )
        return None


def _endpoint_url(url: str) -> str:
    """An endpoint's base URL, `http(s)://host:port` (the router adds `/v1/...`), without a
    trailing slash; ValueError saying what is wrong with anything else. The messages show the
    URL without what may be secret in it (`_shown`): they reach the log of a reload."""
    try:
        parts = urlsplit(url)
        port = parts.port  # ValueError when out of range or not a number
    except ValueError as exc:
        # Its text quotes the port as read, which is part of a password in `http://u:p#w@h`.
        detail = "" if "@" in url else f" ({exc})"
        raise ValueError(
            f"endpoint {_shown(url)} is not a URL the router can use{detail}"
        ) from None
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"endpoint {_shown(url)} is not an http(s) URL")
    if not parts.hostname or any(c.isspace() for c in url):
        raise ValueError(f"endpoint {_shown(url)} needs a host (http://host:port), and no spaces")
    if parts.username is not None:
        raise ValueError(f"endpoint {_shown(url)}: credentials do not belong in an endpoint URL")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(
            f"endpoint {_shown(url)} must be scheme, host and port only (the router adds /v1/...)"
        )
    if port == 0:
        raise ValueError(f"endpoint {_shown(url)}: port 0 is not a port to connect to")
    return url.rstrip("/")


def _shown(url: str) -> str:
    """`url` quoted for a message, with what may be secret replaced by `***`: the user and
    password before an `@`, and whatever follows a `?` or `#` (a token in a query)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    if "@" in rest:
        rest = "***@" + rest.rsplit("@", 1)[1]
    for mark in "?#":
        head, found, _ = rest.partition(mark)
        rest = f"{head}{mark}***" if found else rest
    return repr(f"{scheme}{sep}{rest}")


def _quantity_units(value: Any) -> Any:
    """Kubernetes' binary suffixes ("768Mi") as pydantic's byte units ("768MiB")."""
    if isinstance(value, str):
        return re.sub(r"(?i)([kmgtpe]i)\s*$", r"\1B", value.strip())
    return value


#: A size in bytes: an integer, or a number with a unit (768MiB, 768Mi, 1GB, 0.5GiB).
Size = Annotated[ByteSize, BeforeValidator(_quantity_units)]


class ConnectionSettings(_Model):
    """Limits on clients' connections: slow or idle ones are closed, and past the cap new ones
    are refused (tiergate/common/connection_limits.py). Read when the router starts."""

    header_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description=(
            "A request's headers must arrive within this many seconds of its first byte; "
            "else 408 and the connection is closed."
        ),
    )
    body_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description=(
            "A request's body must arrive within this many seconds of its headers; else 408 "
            "(or, once a reply has begun, no reply) and the connection is closed."
        ),
    )
    idle_timeout_s: float = Field(
        default=IDLE_TIMEOUT_S,
        gt=0,
        description=(
            "A connection kept alive after a reply is closed after this many seconds with no "
            "request: longer than clients and proxies keep an idle connection (Go 90 s, load "
            "balancers 60 s), so that they close it first. A new connection must begin its "
            "first request within headerTimeoutS"
        ),
    )
    max_connections: int | None = Field(
        default=None,
        ge=1,
        description=(
            f"Client connections open at once; past it a new one is answered 503 and closed. "
            f"None: {DEFAULT_MAX_CONNECTIONS}, or fewer if the open-file limit (RLIMIT_NOFILE) "
            "has no room for them beside their upstream connections; a number that does not "
            "fit stops the router at start."
        ),
    )

    def limits(self, max_connections: int | None = None) -> ConnectionLimits:
        """These limits, with `max_connections` (what the open-file limit allows, worked out
        where the router is served) in place of the configured cap."""
        cap = max_connections or self.max_connections or DEFAULT_MAX_CONNECTIONS
        return ConnectionLimits(
            header_timeout_s=self.header_timeout_s,
            body_timeout_s=self.body_timeout_s,
            idle_timeout_s=self.idle_timeout_s,
            max_connections=cap,
        )


class EppTls(_Model):
    """TLS on the endpoint picker's port (router/epp/tls.py)."""

    enabled: bool = Field(
        default=True,
        description=(
            "Serve the endpoint picker over TLS, as gateways reach one (Envoy AI Gateway and "
            "the Gateway API Inference Extension's Envoy connect with TLS, not checking the "
            "certificate). False: plaintext gRPC, for a gateway configured for it."
        ),
    )
    cert_file: Path | None = Field(
        default=None,
        description=(
            "The certificate (PEM) to serve, e.g. a cert-manager Secret's tls.crt; read again "
            "when it changes. None: a self-signed one made at start."
        ),
    )
    key_file: Path | None = Field(
        default=None, description="Its private key (PEM, unencrypted), e.g. the Secret's tls.key."
    )

    @model_validator(mode="after")
    def _pair(self) -> EppTls:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("certFile and keyFile go together: give both, or neither")
        if not self.enabled and self.cert_file is not None:
            raise ValueError("certFile and keyFile need enabled: true")
        return self


class RouterSettings(_Model):
    """How the router itself runs."""

    host: str = Field(default="127.0.0.1", description="Address the router listens on.")
    port: int = Field(
        default=8080, ge=0, le=65535, description="Port the router listens on; 0: any free one."
    )
    metrics_port: int = Field(
        default=8090,
        ge=0,
        le=65535,
        description=(
            "Port of the router's Prometheus metrics (GET /metrics), apart from `port`: the "
            "metrics name every tenant, with its budget and spend, so let monitoring reach it "
            "and tenants not. 0: any free one."
        ),
    )
    metrics_host: str | None = Field(
        default=None, description="Address the metrics port listens on; none: `host`'s."
    )
    epp_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description=(
            "Port of the endpoint picker: Envoy's external processing service (gRPC, "
            "envoy.service.ext_proc.v3.ExternalProcessor, and grpc.health.v1.Health) that a "
            "Gateway API gateway asks which endpoint serves each request, on `host`. The same "
            "tiers, tenants, budgets, fairness and ledger as the router's own port. None: off; "
            "0: any free one."
        ),
    )
    epp_tls: EppTls = Field(
        default_factory=EppTls,
        description="TLS on the endpoint picker's port: on by default, self-signed.",
    )
    epp_fallbacks: int = Field(
        default=0,
        ge=0,
        le=8,
        description=(
            "Endpoints the picker names after its pick, for the gateway to try in order when "
            "the pick fails (the x-gateway-destination-endpoint list). 0 for Envoy's "
            "ORIGINAL_DST cluster, which takes one endpoint only; a gateway whose load balancer "
            "reads the list (Envoy's override_host policy) can use more."
        ),
    )
    tenants_file: Path | None = Field(
        default=None, description="Tenants YAML, or a mounted Secret folder; none: open mode."
    )
    ledger_path: Path = Field(
        default=Path(".tiergate/ledger.sqlite"),
        description="The SQLite ledger's file (one router process); unused with a ledger URL.",
    )
    ledger_url: SecretStr | None = Field(
        default=None,
        description=(
            "A PostgreSQL ledger shared by every router replica and worker "
            "(postgresql://user@host:port/database; the password from PGPASSWORD or a "
            "passfile is better than one in the URL). Never logged. None: the SQLite ledger."
        ),
    )
    ledger_url_file: Path | None = Field(
        default=None,
        description="A file holding the PostgreSQL ledger's URL (a mounted Secret's key).",
    )
    ledger_retention_days: float | None = Field(
        default=None,
        gt=0,
        description=(
            "Delete request rows older than this many days (daily totals per tenant stay); "
            "none: keep them."
        ),
    )
    ledger_max_size: Size | None = Field(
        default=None,
        ge=1024 * 1024,
        description=(
            "Delete the oldest request rows while the ledger's pages in use exceed this "
            "(e.g. 768Mi); keep it below the volume's size. None: no limit."
        ),
    )
    ledger_spool_dir: Path = Field(
        default=Path(".tiergate/spool"),
        description=(
            "With a PostgreSQL ledger: a local folder (the pod's volume) where each router "
            "process keeps, fsynced, the records the database could not take; the next "
            "process of the pod replays a dead one's file."
        ),
    )
    ledger_spool_max_size: Size = Field(
        default=ByteSize(256 * 1024 * 1024),
        ge=64 * 1024,
        description=(
            "Largest spool file per router process (e.g. 256Mi, about 700,000 records). "
            "Past 90% of it, new requests get 503 `ledger_unavailable` until the database "
            "takes writes again."
        ),
    )
    max_body_bytes: int = Field(
        default=MAX_BODY_BYTES, ge=1024, description="Largest request body; larger: 413."
    )
    max_reply_bytes: int = Field(
        default=MAX_REPLY_BYTES,
        ge=64 * 1024,
        le=2**40,
        description=(
            "Largest whole reply read from a node or hosted API (decompressed); larger: 502 "
            "`bad_upstream_reply`, and the rest is left unread."
        ),
    )
    connections: ConnectionSettings = Field(
        default_factory=ConnectionSettings,
        description="Timeouts for slow and idle client connections, and their cap.",
    )
    upstream_attempts: int = Field(
        default=3,
        ge=1,
        le=10,
        description=(
            "Endpoints tried for one request, before the first token of a stream or the first "
            "byte of a whole reply."
        ),
    )
    upstream_read_timeout_s: float = Field(
        default=READ_TIMEOUT_S,
        gt=0,
        le=3600,
        description=(
            "Seconds to wait for a node's stream to begin (a node sends a stream's head at "
            "once), and between two parts of any reply; past it the node counts a failure, and "
            "a stream not yet begun goes to another endpoint."
        ),
    )
    whole_reply_timeout_s: float = Field(
        default=WHOLE_REPLY_TIMEOUT_S,
        gt=0,
        le=86400,
        description=(
            "Seconds to wait for a whole (not streamed) reply, which a node or a provider sends "
            "only once it has generated it; past it, 504 `upstream_timeout`, tried on no other "
            "endpoint (the work may be done, and a provider's paid for) and not counted against "
            "it. A node that stops answering its metrics scrapes meanwhile counts a failure and "
            "the request goes to another endpoint. A hosted pool's `timeoutS` bounds its "
            "streams."
        ),
    )
    shutdown_grace_s: int = Field(
        default=SHUTDOWN_GRACE_S,
        ge=0,
        le=3600,
        description=(
            "Seconds the requests in flight, streams included, get to finish when the router is "
            "told to stop (SIGTERM: a rollout, a scale-down); past it they are cut, billed for "
            "what was relayed. The pod's termination grace period must be longer (the chart "
            "sets it)."
        ),
    )
    allowed_media_domains: tuple[str, ...] = Field(
        default=(),
        description=(
            "Hosts whose http(s) URLs a chat request's image, audio or video parts may name: "
            "vLLM and SGLang fetch them from the model pods, inside the cluster. `example.com` "
            "(that host), `*.example.com` (its subdomains), `*` (any host). Inline media "
            "(`data:` URLs, base64) always pass; another URL is refused with 400 "
            "`media_url_not_allowed`. Empty: no URL is fetched."
        ),
    )

    @field_validator("allowed_media_domains")
    @classmethod
    def _media_domains(cls, domains: tuple[str, ...]) -> tuple[str, ...]:
        for domain in domains:
            if not MEDIA_DOMAIN.fullmatch(domain):
                raise ValueError(
                    f"{domain!r} is not `*`, a lower-case host name, or `*.` and a domain"
                )
        return domains

    admission_order: AdmissionOrder = Field(
        default="fair",
        description=(
            "How a saturated tier admits waiting requests within a priority: fair (weighted "
            "least attained service per tenant, in tokens) or fcfs (first come, first served)."
        ),
    )
    headroom_per_pool: int = Field(
        default=0,
        ge=0,
        le=64,
        description=(
            "With fair admission: slots per pool held back for a tenant below its fair share, "
            "so a light tenant starts within a step while another floods the tier (at most a "
            "quarter of a tier's slots; a lone tenant never gets them, and the pods' load that "
            "an autoscaled pool follows leaves them out). 0: every slot goes to whoever waits."
        ),
    )
    fleet_fair_share_interval_s: float | None = Field(
        default=0.2,
        ge=0.05,
        le=5.0,
        description=(
            "With a PostgreSQL ledger and fair admission: how often each router process "
            "exchanges, through the database, the slots each tenant holds and waits for in "
            "each tier, so that the processes together fill each tier's slots by the tenants' "
            "weights (one query per interval per process). None: each process shares the "
            "whole tier fairly on its own, among the requests it receives (as with the SQLite "
            "ledger)."
        ),
    )
    scrape_interval_s: float = Field(
        default=0.5, gt=0, description="How often each endpoint's metrics (its load) are read."
    )
    reload_interval_s: float = Field(
        default=1.0,
        gt=0,
        description=(
            "How often the configuration and tenants files are looked at; a change is applied "
            "once it has held still for one interval."
        ),
    )
    policy: PolicyConfig = Field(
        default_factory=default_policy,
        description=(
            "How an endpoint is picked: filters, weighted scorers and a picker, each a plugin "
            "named by its kebab-case type (router/policy). A part left out (`filters`, "
            "`scorers`, `picker`) is the default's. A reloaded file's policy is applied."
        ),
    )

    @field_validator("policy", mode="before")
    @classmethod
    def _default_parts(cls, value: Any) -> Any:
        """`policy: {picker: ...}` changes the picker only: the other parts (and a part given
        as null) stay the default's; `scorers: []` says none."""
        if value is None:  # `policy:` with everything under it commented out
            return default_policy()
        if isinstance(value, dict):
            given = {k: v for k, v in value.items() if v is not None}
            return {**default_policy().model_dump(), **given}
        return value

    forward_fault_header: bool = Field(
        default=False,
        description=(
            "Pass clients' x-tiergate-fault header on to the sim nodes, for fault drills. Any "
            "client may then make a node fail, and the failures count against the endpoint's "
            "health: leave it off where others share the router. Nodes honour the header only "
            "when started with --enable-fault-injection (`tiergate up` does so when this is on)."
        ),
    )

    @model_validator(mode="after")
    def _two_ports(self) -> RouterSettings:
        if self.port == self.metrics_port != 0 and self.metrics_bind_host() == self.host:
            raise ValueError(
                f"metricsPort {self.metrics_port} is also the router's port: the metrics need "
                "a port of their own"
            )
        if self.epp_port and self.epp_port in (self.port, self.metrics_port):
            raise ValueError(
                f"eppPort {self.epp_port} is also the router's or its metrics' port: the "
                "endpoint picker needs a port of its own"
            )
        return self

    def metrics_bind_host(self) -> str:
        """The address the metrics port listens on."""
        return self.host if self.metrics_host is None else self.metrics_host

    @model_validator(mode="after")
    def _one_ledger_url(self) -> RouterSettings:
        if self.ledger_url is not None and self.ledger_url_file is not None:
            raise ValueError("give ledgerUrl or ledgerUrlFile, not both")
        shared = self.ledger_url is not None or self.ledger_url_file is not None
        if shared and self.ledger_max_size is not None:
            raise ValueError(
                "ledgerMaxSize applies to the SQLite ledger; with a PostgreSQL ledger use "
                "ledgerRetentionDays (PostgreSQL reuses the space of pruned rows)"
            )
        return self

    def ledger_dsn(self) -> str | None:
        """The PostgreSQL ledger's URL (from `ledgerUrl` or the file `ledgerUrlFile`), or None
        for the SQLite ledger. Raises ConfigError when the file cannot be read or holds no
        postgresql:// URL; the message never quotes the URL."""
        if self.ledger_url is not None:
            dsn = self.ledger_url.get_secret_value().strip()
            where = "router.ledgerUrl"
        elif self.ledger_url_file is not None:
            where = f"router.ledgerUrlFile ({self.ledger_url_file})"
            try:
                dsn = self.ledger_url_file.read_text(encoding="utf-8").strip()
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigError(f"{where}: cannot read it: {exc}") from None
        else:
            return None
        if not dsn.startswith(("postgresql://", "postgres://")):
            raise ConfigError(f"{where}: not a postgresql:// URL")
        return dsn


class LocalSettings(_Model):
    """`tiergate up`: where the sim nodes listen."""

    host: str = Field(default="127.0.0.1", description="Address the sim nodes listen on.")
    first_port: int = Field(
        default=9000, ge=1, le=65535, description="The first node's port; the others follow."
    )


class KubernetesDiscovery(_Model):
    """Pools from InferencePools (tiergate.dev/v1alpha1) and their sim-node pods."""

    namespace: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        max_length=63,
        description=(
            "Namespace to watch; default: the router pod's own namespace, else `default`."
        ),
    )


class Discovery(_Model):
    """Where pools come from other than the file's `pools` list."""

    kubernetes: KubernetesDiscovery | None = Field(
        default=None,
        description="Watch InferencePools and their pods; `pools` must then be empty.",
    )


class RouterConfig(_Model):
    """A whole configuration file."""

    router: RouterSettings = Field(
        default_factory=RouterSettings, description="How the router itself runs."
    )
    local: LocalSettings = Field(
        default_factory=LocalSettings, description="`tiergate up`: where the sim nodes listen."
    )
    discovery: Discovery = Field(
        default_factory=Discovery, description="Pool sources other than `pools`."
    )
    pools: list[PoolSpec] = Field(
        default_factory=list, description="The pools (required unless discovery is set)."
    )
    kind: Literal["TiergateConfig"] = Field(
        default="TiergateConfig", description="Optional; names the file's kind."
    )

    @model_validator(mode="after")
    def _one_pool_source(self) -> RouterConfig:
        if self.discovery.kubernetes is not None:
            if self.pools:
                raise PydanticCustomError(
                    "pool_sources",
                    "pools must be empty when discovery.kubernetes is set "
                    "(pools then come from InferencePool objects)",
                )
        elif "pools" not in self.model_fields_set:
            # Without discovery a file with no pools is almost surely a mistake.
            raise PydanticCustomError(
                "missing", "pools: required unless discovery.kubernetes is set"
            )
        return self

    @field_validator("pools")
    @classmethod
    def _unique(cls, pools: list[PoolSpec]) -> list[PoolSpec]:
        seen: set[str] = set()
        for p in pools:
            if p.name in seen:
                raise ValueError(f"pool name {p.name!r} is used twice")
            seen.add(p.name)
            if p.endpoint is not None and p.endpoint.api_key_secret_ref is not None:
                raise ValueError(
                    f"pool {p.name}: endpoint.apiKeySecretRef names a Kubernetes Secret, "
                    "which only an InferencePool can; a router file gives endpoint.apiKeyFile"
                )
        return pools


def load_config(path: Path) -> RouterConfig:
    """Read and validate a configuration file; ConfigError says where it is wrong."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    return parse_config(text, str(path))


def parse_config(text: str, origin: str = "<config>") -> RouterConfig:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{origin}: not valid YAML{yaml_position(exc)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{origin}: expected a mapping with `pools`")
    try:
        return RouterConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{origin}: {first_problem(exc)}") from None
