"""The routing policy's configuration: which plugins, with which parameters and weights.

    filters:
      - {type: model-filter}
      - {type: tier-filter}
      - {type: random-sample, parameters: {size: 8}}
      - {type: ejected-filter}
    scorers:
      - {type: queue-depth-scorer, weight: 1}
      - {name: affinity, type: prefix-affinity-scorer, weight: 2, parameters: {capacity: 50000}}
    picker: {type: max-score-picker}

Every entry is validated against the registry when the configuration is loaded, so a typo in
a type or a parameter fails at startup with a message naming the plugin.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from tiergate.router.policy.base import PluginKind
from tiergate.router.policy.registry import PolicyConfigError, plugin_type, validate_parameters

__all__ = ["PluginSpec", "PolicyConfig", "ScorerSpec", "default_policy"]

S = TypeVar("S", bound="PluginSpec")


class PluginSpec(BaseModel):
    """One plugin: `{name, type, parameters}`; the name defaults to the type."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str = Field(default="", description="Unique within the policy (default: the type).")
    type: str = Field(description="Registered kebab-case plugin type, e.g. model-filter.")
    parameters: dict[str, Any] = Field(
        default_factory=dict, description="The type's parameters (see each plugin)."
    )

    @model_validator(mode="after")
    def _default_name(self) -> PluginSpec:
        if not self.name:
            # Frozen model: set through object.__setattr__ once, at validation.
            object.__setattr__(self, "name", self.type)
        return self

    def check(self, kind: PluginKind) -> None:
        """Raise PolicyConfigError unless this is a known `kind` type with valid parameters."""
        validate_parameters(plugin_type(self.type, kind, self.name), self.name, self.parameters)


class ScorerSpec(PluginSpec):
    """A scorer and its weight in the sum the picker orders by."""

    weight: float = Field(
        default=1.0, gt=0, le=1e6, description="Relative weight of this score (0 < w <= 1e6)."
    )


class PolicyConfig(BaseModel):
    """Filters (in order), weighted scorers and one picker."""

    # camelCase keys like the rest of the YAML configuration.
    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        alias_generator=to_camel,
        populate_by_name=True,
        allow_inf_nan=False,
    )

    filters: list[PluginSpec] = Field(
        default_factory=list,
        description="In order; a sampler (random-sample) among them bounds what follows it.",
    )
    scorers: list[ScorerSpec] = Field(default_factory=list)
    picker: PluginSpec = Field(default_factory=lambda: PluginSpec(type="max-score-picker"))

    @field_validator("filters")
    @classmethod
    def _filters(cls, specs: list[PluginSpec]) -> list[PluginSpec]:
        return _checked(specs, "filter")

    @field_validator("scorers")
    @classmethod
    def _scorers(cls, specs: list[ScorerSpec]) -> list[ScorerSpec]:
        return _checked(specs, "scorer")

    @field_validator("picker")
    @classmethod
    def _picker(cls, spec: PluginSpec) -> PluginSpec:
        return _checked([spec], "picker")[0]

    def summary(self) -> str:
        """One log line's worth: `filters=a,b scorers=c*2,d picker=e` (plugin names)."""
        filters = ",".join(f.name for f in self.filters) or "-"
        scorers = ",".join(f"{s.name}*{s.weight:g}" for s in self.scorers) or "-"
        return f"filters={filters} scorers={scorers} picker={self.picker.name}"

    @model_validator(mode="after")
    def _unique_names(self) -> PolicyConfig:
        seen: set[str] = set()
        for spec in [*self.filters, *self.scorers, self.picker]:
            if spec.name in seen:
                raise ValueError(
                    f"plugin name {spec.name!r} is used twice; give each plugin a unique name"
                )
            seen.add(spec.name)
        return self


def _checked(specs: list[S], kind: PluginKind) -> list[S]:
    for spec in specs:
        try:
            spec.check(kind)
        except PolicyConfigError as exc:
            # pydantic reports a ValueError raised here with the field's location.
            raise ValueError(str(exc)) from None
    return specs


def default_policy() -> PolicyConfig:
    """The policy used when the configuration names none.

    Filters keep the endpoints that serve the model at the tier (the view's precomputed set,
    kept without a scan), those whose pool serves a context as long as the request's (kept
    without a scan when every pool of the tier does), then a random sample of 8 of them plus
    those prefix affinity favours (power of k choices: a pool of 300 costs a request about
    what a pool of 8 does),
    then those of the sample that are not ejected, then those predicted to meet the request's
    SLO headers, if it sent any. The predicted latency (perf model over
    each endpoint's load and hardware) weighs most; queue depth reacts to the router's own
    in-flight requests between scrapes, so a burst does not all land on the endpoint that
    looked idlest at the last scrape; KV-cache headroom avoids preemption; prefix affinity
    reuses a warm prompt cache when the load allows.
    """
    return PolicyConfig(
        filters=[
            PluginSpec(type="model-filter"),
            PluginSpec(type="tier-filter"),
            PluginSpec(type="context-filter"),
            PluginSpec(type="random-sample", parameters={"size": 8}),
            PluginSpec(type="ejected-filter"),
            PluginSpec(type="slo-filter"),
        ],
        scorers=[
            ScorerSpec(type="predicted-latency-scorer", weight=2.0),
            ScorerSpec(type="queue-depth-scorer", weight=1.0),
            ScorerSpec(type="kv-cache-utilization-scorer", weight=1.0),
            ScorerSpec(type="prefix-affinity-scorer", weight=1.0),
        ],
        picker=PluginSpec(type="max-score-picker"),
    )
