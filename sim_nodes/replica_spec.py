"""What one replica of a pool runs (`ReplicaSpec`), and how a pool's spec reaches a sim node.

`ReplicaSpec` is the serving spec plus the names the replica answers to and the other
tenants' load it simulates. The operator's `InferencePoolSpec` extends it, so a node checks
the spec it is handed with the very fields and validators of the CRD's model; the rest of an
InferencePool spec (`POOL_ONLY_FIELDS`: tier, replicas, ...) a node accepts and ignores.

Whoever starts nodes renders the spec once with `pool_json` and passes it whole: `tiergate
up` as ``tiergate sim-node --pool-json JSON``, the operator's pods in `POOL_JSON_ENV` beside
`vllm serve`'s flags. The node reads that, or a pool file, with `pool_fields`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator

from .perf.spec import ServingSpec, _Spec

__all__ = [
    "ACCELERATOR_ENV",
    "CHIPS_ENV",
    "NODE_NAME_ENV",
    "POOL_JSON_ENV",
    "POOL_ONLY_FIELDS",
    "BackgroundLoad",
    "PoolSpecError",
    "ReplicaSpec",
    "pool_fields",
    "pool_json",
]


#: The environment a sim node reads besides its flags (the operator's pods set the first two;
#: the last two let `vllm serve`'s command line alone start a node).
POOL_JSON_ENV = "TIERGATE_POOL_JSON"  # the spec whole, as --pool-json
NODE_NAME_ENV = "TIERGATE_NODE_NAME"  # as --node-name
ACCELERATOR_ENV = "TIERGATE_ACCELERATOR"  # the accelerator to simulate, if no spec names it
CHIPS_ENV = "TIERGATE_CHIPS"  # its chips per replica, if no spec or flag says


class BackgroundLoad(_Spec):
    """Other tenants' sequences each simulated node keeps decoding (a busy shared tier)."""

    sequences: int = Field(ge=0, description="Sequences decoding at all times.")
    context_tokens: int = Field(ge=1, description="Context length of each of them.")
    turn_input_tokens: int = Field(default=0, ge=0, description="New tokens per turn.")
    turn_output_tokens: int = Field(default=0, ge=0, description="Tokens between turns.")


class ReplicaSpec(ServingSpec):
    """One replica of a pool: what it serves, the names it answers to, the load beside it."""

    served_model_name: str | None = Field(
        default=None, description="Model name clients ask for (default: the catalog name)."
    )
    aliases: list[Annotated[str, Field(min_length=1)]] = Field(
        default_factory=list, description="More names clients may use."
    )
    background: BackgroundLoad | None = Field(
        default=None, description="Simulated other-tenant load on every replica."
    )

    @field_validator("aliases", mode="before")
    @classmethod
    def _without_empty_aliases(cls, value: object) -> object:
        # The CRD refuses an empty alias (minLength), but pools stored before it said so may
        # hold one: it is no name a client can use, and reading such a pool must not fail.
        if isinstance(value, list):
            return [v for v in value if v != ""]
        return value

    @property
    def names(self) -> tuple[str, ...]:
        """Every model name this pool answers to, the primary first."""
        primary = self.served_model_name or self.model
        return (primary, *[a for a in self.aliases if a != primary])


#: The InferencePool spec's fields a node does not simulate (the operator's and the router's):
#: accepted and ignored. (sim_nodes cannot import the operator's API: a test checks this list
#: against it.)
POOL_ONLY_FIELDS = frozenset(
    {
        "autoscaling",
        "billing",
        "endpoint",
        "engine",
        "huggingFaceTokenSecretRef",
        "modelSource",
        "replicas",
        "rollout",
        "slo",
        "template",
        "tier",
        "workload",
    }
)

#: A replica's fields left out of what is rendered for a node: the node does not read the price,
#: and a price edit must not restart every replica of the pool.
_NOT_RENDERED = frozenset({"pricing"})


class PoolSpecError(ValueError):
    """A pool spec handed to a node is not a mapping in the InferencePool spec's shape."""


def pool_json(
    spec: ReplicaSpec, *, chips: int | Literal["auto"], tensor_parallel: int | None
) -> str:
    """`spec` as the node reads it (`--pool-json`): compact camelCase JSON of the replica's
    fields, every batch limit explicit, with `chips` / `tensor_parallel` as given (the spec's,
    or the layout the caller resolved, so the node simulates the hardware the caller priced).
    """
    replica = spec.model_copy(update={"chips": chips, "tensor_parallel": tensor_parallel})
    fields = set(ReplicaSpec.model_fields) - _NOT_RENDERED
    return replica.model_dump_json(include=fields, by_alias=True, exclude_none=True)


def pool_fields(data: object) -> dict[str, Any]:
    """The `ReplicaSpec` fields (camelCase, not yet validated) of an InferencePool object or of
    its spec; PoolSpecError for anything else or a field no such spec has."""
    if not isinstance(data, dict):
        raise PoolSpecError("expected a mapping (an InferencePool or its spec)")
    if "spec" in data:
        data = data["spec"]
        if not isinstance(data, dict):
            raise PoolSpecError("`spec` must be a mapping")
    known = {f.alias or name for name, f in ReplicaSpec.model_fields.items()}
    known |= set(ReplicaSpec.model_fields)
    unknown = sorted(str(k) for k in data if k not in known | POOL_ONLY_FIELDS)
    if unknown:
        raise PoolSpecError(
            f"unknown field(s) {', '.join(unknown)} (an InferencePool's spec has no such field)"
        )
    return {k: v for k, v in data.items() if k in known}
