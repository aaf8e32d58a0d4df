"""The plan file: per tier, the traffic to serve and the SLO to hold; what to search over.

YAML (or JSON), camelCase like a pool file. Traffic is either Poisson arrivals with token
lengths written as `tiergate simulate` takes them (`1000`, `uniform:A:B`,
`lognormal:MEAN:SIGMA`), or a JSONL trace whose lines name their tier. An SLO is a pair of
latency targets and the share of requests that must meet both (`percentile: 90`: p90).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from tiergate.common.tiers import Tier
from tiergate.common.validation import first_problem
from tiergate.pools.engines import DEFAULT_ENGINE, Engine
from tiergate.sim_nodes.catalogs import Dtype
from tiergate.sim_nodes.engine.workload import (
    MAX_RATE_PER_S,
    MIN_RATE_PER_S,
    LengthDistribution,
    WorkloadError,
    parse_length,
)

from .errors import PlanError
from .files import parse_yaml, read_text

__all__ = [
    "DEFAULT_BATCH_CAPS",
    "MAX_OUTPUT_TOKENS",
    "MAX_WINDOW_REQUESTS",
    "PlanFile",
    "SearchSpec",
    "SimulationSpec",
    "SloTarget",
    "SpeculativeSearch",
    "TierDemand",
    "load_plan",
]

#: Batch caps tried unless the plan narrows them (each tier's own cap still applies).
DEFAULT_BATCH_CAPS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
#: Tokens of a prompt: beyond any catalog model's context.
MAX_PROMPT_TOKENS = 1 << 20
#: Tokens of an output: a simulated replica steps once per token, and a steady window spans
#: several request lifetimes, so longer outputs could not be confirmed in seconds.
MAX_OUTPUT_TOKENS = 32_768
#: Lognormal sigma: beyond this the tail, not the mean, sets the fleet.
MAX_SIGMA = 3.0
#: Requests in one simulated window, most (the simulation budget; see window.py).
MAX_WINDOW_REQUESTS = 20_000


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid", alias_generator=to_camel, populate_by_name=True, allow_inf_nan=False
    )


class SloTarget(_Model):
    """Latency targets a share of the tier's requests must meet, both at once."""

    percentile: float = Field(
        default=90, gt=0, lt=100, description="Share of requests (percent) that must meet both."
    )
    ttft_ms: float = Field(gt=0, le=600_000, description="Time to first token, ms.")
    tpot_ms: float = Field(gt=0, le=10_000, description="Time per output token, ms.")

    @property
    def ttft_s(self) -> float:
        return self.ttft_ms / 1000.0

    @property
    def tpot_s(self) -> float:
        return self.tpot_ms / 1000.0

    @property
    def attainment(self) -> float:
        """The fraction of requests that must meet both targets."""
        return self.percentile / 100.0

    def __str__(self) -> str:
        return f"p{self.percentile:g} TTFT <= {self.ttft_ms:g} ms and TPOT <= {self.tpot_ms:g} ms"


class SpeculativeSearch(_Model):
    """Speculative decoding to try when the catalog has a draft (a model distilled from the
    tier's). The acceptance rate belongs to the traffic and draft pair, so the plan says it."""

    acceptance_rate: float = Field(ge=0, lt=1, description="Probability a draft token is kept.")
    tokens: list[Annotated[int, Field(ge=1, le=16)]] = Field(
        default=[4], min_length=1, description="Draft tokens per step to try."
    )


class TierDemand(_Model):
    """One tier: the model it serves, its traffic (without a trace) and its SLO."""

    model: str = Field(max_length=200, description="Catalog model the tier serves.")
    rate_per_s: float | None = Field(
        default=None,
        ge=MIN_RATE_PER_S,
        le=MAX_RATE_PER_S,
        description="Poisson arrivals per second (omit with a trace).",
    )
    prompt_tokens: str = Field(default="1024", description="N, uniform:A:B or lognormal:M:S.")
    output_tokens: str = Field(default="256", description="N, uniform:A:B or lognormal:M:S.")
    cached_share: float = Field(
        default=0.0, ge=0, lt=1, description="Share of each prompt found in the prefix cache."
    )
    slo: SloTarget = Field(description="The latency targets.")
    engine: Engine = Field(
        default=DEFAULT_ENGINE,
        description="What runs the tier's pools: sim, vllm or sglang. A real engine narrows "
        "the search to what it runs: GPUs, a replica on one node, its KV-cache dtypes, models "
        "with published weights.",
    )
    speculative: SpeculativeSearch | None = Field(
        default=None, description="Speculative decoding to try, if the catalog has a draft."
    )

    @field_validator("prompt_tokens", "output_tokens", mode="before")
    @classmethod
    def _length_spec(cls, value: object, info: ValidationInfo) -> object:
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        if isinstance(value, str):
            if len(value) > 100:
                raise ValueError("expected N, uniform:A:B or lognormal:MEAN:SIGMA")
            try:
                length = parse_length(value)
            except WorkloadError as exc:
                raise ValueError(str(exc)) from None
            most = MAX_OUTPUT_TOKENS if info.field_name == "output_tokens" else MAX_PROMPT_TOKENS
            largest = length.b if length.kind == "uniform" else length.a
            if largest > most:
                raise ValueError(f"at most {most} tokens (got {largest:g})")
            if length.kind == "lognormal" and length.b > MAX_SIGMA:
                raise ValueError(f"lognormal sigma at most {MAX_SIGMA:g} (got {length.b:g})")
        return value

    @property
    def prompt(self) -> LengthDistribution:
        return parse_length(self.prompt_tokens)

    @property
    def output(self) -> LengthDistribution:
        return parse_length(self.output_tokens)


class SearchSpec(_Model):
    """What the search may choose; defaults: the whole catalog, common dtypes and caps."""

    accelerators: list[Annotated[str, Field(max_length=200)]] | None = Field(
        default=None,
        max_length=100,
        description="Accelerators to try (default: all the tier allows).",
    )
    weight_dtypes: list[Dtype] = Field(default=["bf16", "fp8"], min_length=1, max_length=8)
    kv_dtypes: list[Dtype] = Field(default=["bf16", "fp8"], min_length=1, max_length=8)
    batch_caps: list[Annotated[int, Field(ge=1, le=4096)]] = Field(
        default=list(DEFAULT_BATCH_CAPS), min_length=1, max_length=32
    )
    max_chip_multiple: int = Field(
        default=4, ge=1, le=16, description="GPU replicas up to this many times the fewest chips."
    )
    max_replicas: int = Field(default=64, ge=1, le=1024, description="Replicas per tier, most.")
    max_batched_tokens: int = Field(
        default=8192,
        ge=256,
        le=1 << 20,
        description="Token budget of a step, at least 256 (one prompt must not take hundreds).",
    )


class SimulationSpec(_Model):
    """How finalists are confirmed in the virtual-time simulator."""

    requests: int = Field(
        default=300,
        ge=20,
        le=MAX_WINDOW_REQUESTS,
        description="Fewest requests in a simulated window (more when the rate and the "
        "request lifetime need them).",
    )
    seed: int = Field(
        default=0, ge=0, le=2**63 - 1, description="Seed of arrivals, lengths and acceptance."
    )


class PlanFile(_Model):
    """A whole plan: tiers by name, an optional trace, the search space, the simulation."""

    name: str = Field(
        default="plan", pattern=DNS_LABEL, max_length=40, description="Prefix of pool names."
    )
    trace: str | None = Field(
        default=None,
        max_length=4096,
        description="JSONL trace (relative to the plan file) with a tier per line.",
    )
    tiers: dict[Tier, TierDemand] = Field(min_length=1, description="Demand per tier.")
    search: SearchSpec = Field(default_factory=SearchSpec)
    simulation: SimulationSpec = Field(default_factory=SimulationSpec)

    @model_validator(mode="after")
    def _traffic_from_one_source(self) -> PlanFile:
        for tier, demand in self.tiers.items():
            if self.trace is None and demand.rate_per_s is None:
                raise ValueError(f"tiers.{tier}.ratePerS is required without a trace")
            if self.trace is not None and demand.rate_per_s is not None:
                raise ValueError(f"tiers.{tier}.ratePerS: the trace sets the rate; drop one")
        return self


def load_plan(path: Path | str) -> tuple[PlanFile, Path]:
    """The plan file at `path` and the folder its relative paths start from; PlanError."""
    path = Path(path)
    data = parse_yaml(read_text(path, "plan"), path.name)
    if not isinstance(data, dict):
        raise PlanError(f"{path.name}: expected a mapping with `tiers`")
    try:
        return PlanFile.model_validate(data), path.parent
    except ValidationError as exc:
        raise PlanError(f"{path.name}: {first_problem(exc)}") from None
