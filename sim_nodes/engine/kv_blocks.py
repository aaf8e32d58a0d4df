"""The KV cache as fixed-size blocks (vLLM's paged attention), counted rather than addressed.

The simulator needs to know *whether* a sequence can grow, not *which* physical block it
gets, so the allocator is a pair of counters: O(1) everywhere and nothing to leak.
"""

from __future__ import annotations

from ..perf import Deployment
from .errors import EngineCapacityError

__all__ = ["DEFAULT_BLOCK_SIZE", "BlockAllocator", "blocks_for"]

#: Tokens per KV block (vLLM's default on GPUs).
DEFAULT_BLOCK_SIZE = 16


def blocks_for(tokens: int, block_size: int) -> int:
    """Blocks needed to hold `tokens` tokens of KV."""
    return -(-tokens // block_size)


class BlockAllocator:
    """`total_blocks` blocks of `block_size` tokens; allocate and free by count.

    The scheduler adjusts `used_blocks` directly on its hot path (after checking
    `free_blocks`); `allocate` and `free` are the checked interface for everyone else.
    """

    __slots__ = ("block_size", "total_blocks", "used_blocks")

    def __init__(self, total_blocks: int, block_size: int = DEFAULT_BLOCK_SIZE) -> None:
        if block_size < 1:
            raise EngineCapacityError(f"block size must be at least 1 (got {block_size})")
        if total_blocks < 0:
            raise EngineCapacityError(f"total blocks must not be negative (got {total_blocks})")
        self.block_size = block_size
        self.total_blocks = total_blocks
        self.used_blocks = 0

    @classmethod
    def for_deployment(
        cls, deployment: Deployment, block_size: int = DEFAULT_BLOCK_SIZE
    ) -> BlockAllocator:
        """The blocks a replica's KV cache holds: `kv_capacity_tokens // block_size`."""
        if block_size < 1:
            raise EngineCapacityError(f"block size must be at least 1 (got {block_size})")
        return cls(deployment.kv_capacity_tokens // block_size, block_size)

    @property
    def free_blocks(self) -> int:
        """Blocks not allocated."""
        return self.total_blocks - self.used_blocks

    @property
    def usage(self) -> float:
        """Fraction of blocks in use, 0..1 (0 for an empty cache)."""
        return self.used_blocks / self.total_blocks if self.total_blocks else 0.0

    def can_allocate(self, blocks: int) -> bool:
        """Whether `blocks` more blocks are free."""
        return blocks <= self.total_blocks - self.used_blocks

    def allocate(self, blocks: int) -> None:
        """Take `blocks` blocks; the caller checks `can_allocate` first (a bug otherwise)."""
        if blocks > self.total_blocks - self.used_blocks:
            raise RuntimeError(
                f"KV allocator overcommitted: {blocks} requested, {self.free_blocks} free"
            )
        self.used_blocks += blocks

    def free(self, blocks: int) -> None:
        """Return `blocks` blocks."""
        if blocks > self.used_blocks:
            raise RuntimeError(
                f"KV allocator freed {blocks} blocks but only {self.used_blocks} are used"
            )
        self.used_blocks -= blocks
