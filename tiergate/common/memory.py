"""Where an accelerator holds weights and KV cache: a catalog's accelerators say which, and a
tier may require one (tiergate/common/tiers.py)."""

from typing import Literal

__all__ = ["MemoryKind"]

MemoryKind = Literal["hbm", "sram"]
