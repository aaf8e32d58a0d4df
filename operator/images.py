"""Which container images the operator runs for a pool: its own, and those it is told to allow.

`spec.template.image` is a pool's to set, and whoever may create an InferencePool is not
thereby trusted to run any image in the cluster under the operator's name. The operator runs
its own image (`--image`, the chart's) for sim nodes, the vLLM and SGLang images it is
configured with (`--vllm-image`, `--sglang-image`) for pools of those engines, and the images
of its allow-list (`--allowed-image`, the chart's `operator.allowedImages`), compared as whole
references: a tag or a digest allows exactly that reference, never a prefix of it.
"""

from __future__ import annotations

from dataclasses import dataclass

from tiergate.pools import InferencePoolSpec

from .engine_args import SGLANG_VERSION, VLLM_VERSION

__all__ = ["DEFAULT_SGLANG_IMAGE", "DEFAULT_VLLM_IMAGE", "ImagePolicy"]

#: The engines' public images, at the releases whose flags `engine_args` renders.
DEFAULT_VLLM_IMAGE = f"vllm/vllm-openai:{VLLM_VERSION}"
DEFAULT_SGLANG_IMAGE = f"lmsysorg/sglang:{SGLANG_VERSION}-cu126"


@dataclass(frozen=True, slots=True)
class ImagePolicy:
    """The operator's own image (sim nodes), the engines' images and the other images pools
    may name."""

    default: str
    allowed: frozenset[str] = frozenset()
    vllm: str = DEFAULT_VLLM_IMAGE
    sglang: str = DEFAULT_SGLANG_IMAGE

    def engine_image(self, spec: InferencePoolSpec) -> str:
        """The image of the pool's engine."""
        return {"sim": self.default, "vllm": self.vllm, "sglang": self.sglang}[spec.engine]

    def image_for(self, spec: InferencePoolSpec) -> str:
        """The image the pool asks for (its template's, else its engine's)."""
        template = spec.template
        if template is not None and template.image:
            return template.image
        return self.engine_image(spec)

    def refusal(self, spec: InferencePoolSpec) -> str | None:
        """Why the pool's image may not run, in one sentence; None when it may."""
        image = self.image_for(spec)
        if image in {self.default, self.vllm, self.sglang} or image in self.allowed:
            return None
        engines = f", {self.vllm}, {self.sglang}"
        others = engines + (f" and {', '.join(sorted(self.allowed))}" if self.allowed else "")
        return (
            f"spec.template.image {image} is not allowed: this operator runs {self.default}"
            f"{others} (its allow-list: `tiergate operator --allowed-image`, chart value "
            "operator.allowedImages)"
        )
