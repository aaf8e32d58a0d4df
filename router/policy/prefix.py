"""Stable hashes of a prompt's leading blocks, for prefix-cache affinity.

The hash of block i covers the whole prefix up to and including block i (cumulative), so two
prompts share hash i exactly when they share their first i + 1 blocks, which is what a
serving engine's prefix cache can reuse. blake2b rather than `hash()`: Python salts string
hashes per process, and routers on several replicas (or after a restart) must agree.
"""

from __future__ import annotations

import hashlib

__all__ = ["prefix_hashes"]


def prefix_hashes(text: str, *, block_chars: int = 256, max_blocks: int = 8) -> tuple[int, ...]:
    """Cumulative 64-bit hashes of the first `max_blocks` full blocks of `block_chars` chars.

    A trailing partial block is not hashed: engines cache whole blocks only, and a partial
    block would make prompts that differ only after it look unrelated. Prompts shorter than one
    block get no hashes.
    """
    if block_chars < 1 or max_blocks < 0:
        raise ValueError("block_chars must be at least 1 and max_blocks at least 0")
    blocks = min(len(text) // block_chars, max_blocks)
    hasher = hashlib.blake2b(digest_size=8)
    hashes: list[int] = []
    for i in range(blocks):
        # surrogatepass: JSON may carry lone surrogates ("\ud800"), which strict UTF-8 rejects.
        block = text[i * block_chars : (i + 1) * block_chars]
        hasher.update(block.encode("utf-8", "surrogatepass"))
        hashes.append(int.from_bytes(hasher.copy().digest(), "big"))
    return tuple(hashes)
