"""What a sim node serves and how it misbehaves: `NodeConfig`, and pool-file loading.

A node is one replica of an InferencePool: its `serving` field is the pool's spec
(`ServingSpec`, camelCase on the wire), so `load_pool_spec` accepts either a whole
InferencePool object (``spec:`` inside) or just the spec mapping and keeps the fields a
replica runs (`replica_spec.pool_fields`: the same as a spec given as ``--pool-json``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from tiergate.common.validation import yaml_position

from ..perf import ServingSpec
from ..replica_spec import PoolSpecError, pool_fields

__all__ = ["DEFAULT_MAX_BODY_BYTES", "NodeConfig", "PoolFileError", "load_pool_spec"]

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024


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


def load_pool_spec(path: Path) -> dict[str, Any]:
    """The `ReplicaSpec` fields of a pool file (camelCase, not yet validated)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PoolFileError(f"cannot read pool file {path}: {exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PoolFileError(f"pool file {path} is not valid YAML{yaml_position(exc)}") from None
    try:
        return pool_fields(data)
    except PoolSpecError as exc:
        raise PoolFileError(f"pool file {path}: {exc}") from None
