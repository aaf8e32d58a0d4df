"""What a sim node serves and how it misbehaves: `NodeConfig`, and pool-file loading.

A node is one replica of an InferencePool: its `serving` field is the pool's spec
(`ServingSpec`, camelCase on the wire), so `load_pool_spec` accepts either a whole
InferencePool object (``spec:`` inside) or just the spec mapping, keeps the fields
`ServingSpec` knows and ignores the rest (replicas, tier, slo, template, ...).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from ..perf import ServingSpec
from ..validation import yaml_position

__all__ = ["DEFAULT_MAX_BODY_BYTES", "NodeConfig", "PoolFileError", "load_pool_spec"]

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024

#: Spec keys naming the models a pool's replicas answer to (first one wins).
_SERVED_NAME_KEYS = ("servedModelName", "servedModelNames", "aliases")
#: The InferencePool spec's fields a node does not simulate (the operator's and the router's):
#: accepted in a pool file and ignored; any other field not in `ServingSpec` is a mistake.
#: (sim_nodes cannot import the operator's API: tests/sim_nodes check this list against it.)
POOL_ONLY_FIELDS = frozenset(
    {"aliases", "background", "replicas", "servedModelName", "slo", "template", "tier", "workload"}
)


class PoolFileError(ValueError):
    """The pool file is unreadable or not a mapping in the InferencePool spec shape."""


class NodeConfig(BaseModel):
    """Everything `create_app` needs to run one simulated replica."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    serving: ServingSpec = Field(description="Model, hardware, layout and batch limits.")
    served_model_names: list[str] = Field(
        default_factory=list, description="Names clients may ask for (default: the model's)."
    )
    node_name: str = Field(default="sim-node", description="Reported in x-tiergate-node.")
    seed: int = Field(default=0, description="Seeds filler text, tool-call errors and faults.")
    failure_rate: float = Field(
        default=0.0, ge=0, le=1, description="Fraction of completion requests failed with 5xx."
    )
    fault_header_enabled: bool = Field(
        default=False,
        description="Honour the x-tiergate-fault request header (off: it is ignored).",
    )
    background_sequences: int = Field(
        default=0, ge=0, description="Sequences that are always decoding (other tenants' load)."
    )
    background_context_tokens: int = Field(
        default=0, ge=0, description="Context length of each background sequence."
    )
    background_turn_input_tokens: int = Field(
        default=0, ge=0, description="New prompt tokens each background user sends per turn."
    )
    background_turn_output_tokens: int = Field(
        default=0, ge=0, description="Tokens a background user decodes between its turns."
    )
    max_body_bytes: int = Field(
        default=DEFAULT_MAX_BODY_BYTES, ge=1, description="Largest request body accepted."
    )
    default_max_tokens: int = Field(
        default=256, ge=1, description="Output tokens when a request sets no max_tokens."
    )
    sizing_tokens_per_sequence: int = Field(
        default=4096,
        ge=0,
        description="KV tokens per batch slot provisioned by `chips: auto` on SRAM chips.",
    )
    block_size: int = Field(default=16, ge=1, description="KV cache block size, tokens.")

    @property
    def names(self) -> list[str]:
        """Served model names, the first being the one metrics are labelled with."""
        return list(self.served_model_names) or [self.serving.model]


def load_pool_spec(path: Path) -> tuple[dict[str, Any], list[str]]:
    """The `ServingSpec` fields of a pool file (camelCase) and any served model names in it."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PoolFileError(f"cannot read pool file {path}: {exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PoolFileError(f"pool file {path} is not valid YAML{yaml_position(exc)}") from None
    if not isinstance(data, dict):
        raise PoolFileError(f"pool file {path}: expected a mapping (an InferencePool or its spec)")
    if "spec" in data:
        data = data["spec"]
        if not isinstance(data, dict):
            raise PoolFileError(f"pool file {path}: `spec` must be a mapping")
    names = _served_names(data, path)
    known = {f.alias or name for name, f in ServingSpec.model_fields.items()}
    known |= set(ServingSpec.model_fields)
    allowed = known | POOL_ONLY_FIELDS | set(_SERVED_NAME_KEYS)
    unknown = sorted(str(k) for k in data if k not in allowed)
    if unknown:
        raise PoolFileError(
            f"pool file {path}: unknown field(s) {', '.join(unknown)} (an InferencePool's spec "
            "has no such field)"
        )
    return {k: v for k, v in data.items() if k in known}, names


def _served_names(spec: dict[str, Any], path: Path) -> list[str]:
    names: list[str] = []
    for key in _SERVED_NAME_KEYS:
        value = spec.get(key)
        if value is None:
            continue
        values = [value] if isinstance(value, str) else value
        if not isinstance(values, list) or not all(isinstance(v, str) and v for v in values):
            raise PoolFileError(f"pool file {path}: `{key}` must be a name or a list of names")
        names.extend(v for v in values if v not in names)
    return names
