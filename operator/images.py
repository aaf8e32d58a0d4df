"""Which container images the operator runs for a pool: its own, and those it is told to allow.

`spec.template.image` is a pool's to set, and whoever may create an InferencePool is not
thereby trusted to run any image in the cluster under the operator's name. The operator runs
its own image (`--image`, the chart's) and the images of its allow-list (`--allowed-image`,
the chart's `operator.allowedImages`), compared as whole references: a tag or a digest
allows exactly that reference, never a prefix of it.
"""

from __future__ import annotations

from dataclasses import dataclass

from .api import InferencePoolSpec

__all__ = ["ImagePolicy"]


@dataclass(frozen=True, slots=True)
class ImagePolicy:
    """The operator's own image and the other images pools may name."""

    default: str
    allowed: frozenset[str] = frozenset()

    def image_for(self, spec: InferencePoolSpec) -> str:
        """The image the pool asks for (its template's, else the operator's own)."""
        template = spec.template
        return template.image if template is not None and template.image else self.default

    def refusal(self, spec: InferencePoolSpec) -> str | None:
        """Why the pool's image may not run, in one sentence; None when it may."""
        image = self.image_for(spec)
        if image == self.default or image in self.allowed:
            return None
        others = f" and {', '.join(sorted(self.allowed))}" if self.allowed else ""
        return (
            f"spec.template.image {image} is not allowed: this operator runs {self.default}"
            f"{others} (its allow-list: `tiergate operator --allowed-image`, chart value "
            "operator.allowedImages)"
        )
