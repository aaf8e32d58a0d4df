"""Accelerator kinds (kinds.yaml): which chips share calibrated parameters, which fields the
calibration fits for them and within what bounds, and how their rows are reported.

The fit (perf/fitting.py) and the error report (perf/calibration.py) read them here, so a new
kind of chip is data: its entry in kinds.yaml and `kind:` on its accelerators.
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ..validation import first_problem
from .profiles import Accelerator, Dtype

__all__ = ["AcceleratorKind", "FittedField", "accelerator_kinds", "kind_problem"]

#: The vendors' speculative acceptance rate: a fitted quantity that belongs to no accelerator.
SPECULATIVE_ACCEPTANCE = "speculative.acceptance_rate"

_CONFIG = ConfigDict(extra="forbid", frozen=True)


class FittedField(BaseModel):
    """An accelerator field the calibration fits, within physical bounds."""

    model_config = _CONFIG

    field: str = Field(description="An Accelerator field, or speculative.acceptance_rate.")
    low: float = Field(gt=0)
    high: float = Field(gt=0)
    with_dtype: Dtype | None = Field(
        default=None, description="Shared only by the chips with units of this dtype."
    )
    prior: float | None = Field(
        default=None, description="Kept when leave-one-out leaves the kind no rows."
    )

    @model_validator(mode="after")
    def _known_and_ordered(self) -> FittedField:
        if self.field != SPECULATIVE_ACCEPTANCE and self.field not in Accelerator.model_fields:
            raise ValueError(f"fitted field {self.field!r} is no accelerator field")
        if not self.low < self.high:
            raise ValueError(f"fitted field {self.field}: low must be below high")
        return self


class AcceleratorKind(BaseModel):
    """Chips fitted and reported together."""

    model_config = _CONFIG

    name: str
    family: str = Field(description="Its rows' family in the error report.")
    families: Literal["by_moe", "by_chips"] | None = Field(
        default=None, description="Split the family by dense/MoE model or by one/several chips."
    )
    fitted: tuple[FittedField, ...] = ()

    def family_of(self, *, moe: bool, chips: int) -> str:
        """The report family of a row of this kind."""
        if self.families == "by_moe":
            return f"{'MoE' if moe else 'dense'} {self.family}"
        if self.families == "by_chips":
            return f"{self.family} {'single' if chips == 1 else 'multi'}"
        return self.family

    def report_families(self) -> tuple[str, ...]:
        """Every family its rows may fall in, in report order."""
        if self.families == "by_moe":
            return (self.family_of(moe=False, chips=1), self.family_of(moe=True, chips=1))
        if self.families == "by_chips":
            return (self.family_of(moe=False, chips=1), self.family_of(moe=False, chips=2))
        return (self.family,)


class _KindsFile(BaseModel):
    model_config = _CONFIG

    kinds: tuple[AcceleratorKind, ...]


@functools.cache
def accelerator_kinds() -> dict[str, AcceleratorKind]:
    """The shipped kinds, by name, in the file's order (the order they are fitted in)."""
    text = resources.files(__package__).joinpath("kinds.yaml").read_text(encoding="utf-8")
    try:
        parsed = _KindsFile.model_validate(yaml.safe_load(text))
    except ValidationError as exc:
        raise ValueError(f"kinds.yaml: {first_problem(exc)}") from None
    return {k.name: k for k in parsed.kinds}


def kind_problem(accelerator: Accelerator) -> str | None:
    """What is wrong with an accelerator's `kind` and `fitted_alone`, or None."""
    if accelerator.kind is None:
        if accelerator.fitted_alone:
            return f"accelerator {accelerator.name}: fitted_alone needs a kind"
        return None
    kind = accelerator_kinds().get(accelerator.kind)
    if kind is None:
        return (
            f"accelerator {accelerator.name}: unknown kind {accelerator.kind!r}; "
            f"choose one of: {', '.join(accelerator_kinds())}"
        )
    fitted = {f.field for f in kind.fitted}
    stray = [f for f in accelerator.fitted_alone if f not in fitted]
    if stray:
        return (
            f"accelerator {accelerator.name}: fitted_alone {', '.join(stray)} is not fitted for "
            f"kind {kind.name} ({', '.join(sorted(fitted))})"
        )
    return None
