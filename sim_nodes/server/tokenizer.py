"""A simple, deterministic tokenizer and the filler text the node "generates".

Tokenization (no vocabulary, no model files; roughly GPT-like counts for English):

* a token is optional leading whitespace followed by either a run of 1-4 word characters
  (letters, digits, underscore) or one other non-space character; so ``"Hello, world!"`` is
  ``["Hell", "o", ",", " worl", "d", "!"]`` - long words are split every 4 characters;
* whitespace at the very end of a text is one more token;
* the pieces always concatenate back to the text, so the same function splits tool-call
  arguments into the per-token pieces a stream delivers.

Chat prompts count as OpenAI documents for its chat models: every message costs 3 tokens on
top of its content (plus 1 if it has a `name`), and the reply is primed with 3 more. Text
parts of multi-part content count; other parts (images, audio) count nothing.

Generated text is filler: one word per token from a fixed list, chosen by a per-request
seeded `random.Random`, so a request with the same seed gets the same text.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable

__all__ = [
    "REPLY_PRIMING_TOKENS",
    "TOKENS_PER_MESSAGE",
    "FillerText",
    "count_chat_tokens",
    "count_tokens",
    "split_tokens",
]

TOKENS_PER_MESSAGE = 3
REPLY_PRIMING_TOKENS = 3

_TOKEN = re.compile(r"\s*(?:\w{1,4}|[^\w\s])|\s+")

_WORDS: tuple[str, ...] = (
    "the",
    "model",
    "token",
    "batch",
    "stream",
    "cache",
    "layer",
    "tier",
    "fast",
    "slow",
    "chip",
    "wafer",
    "memory",
    "bandwidth",
    "latency",
    "router",
    "pool",
    "request",
    "reply",
    "context",
    "prefill",
    "decode",
    "step",
    "queue",
    "kernel",
    "tensor",
    "weight",
    "shard",
    "node",
    "engine",
    "schedule",
    "sequence",
    "prompt",
    "output",
    "input",
    "price",
    "speed",
    "quality",
    "agent",
    "tool",
    "call",
    "result",
    "value",
    "vector",
    "matrix",
    "block",
    "page",
    "head",
    "expert",
    "draft",
    "accept",
    "verify",
    "serve",
    "route",
    "scale",
    "load",
    "busy",
    "idle",
    "ready",
    "signal",
    "metric",
    "count",
    "time",
    "and",
)


def split_tokens(text: str) -> list[str]:
    """The tokens of `text`, as substrings that concatenate back to it."""
    return _TOKEN.findall(text)


def count_tokens(text: str) -> int:
    """How many tokens `text` is."""
    return sum(1 for _ in _TOKEN.finditer(text))


def count_chat_tokens(messages: Iterable[tuple[str | None, Iterable[str]]]) -> int:
    """Prompt tokens of a chat: (name, text pieces) per message, with the per-message overhead."""
    total = REPLY_PRIMING_TOKENS
    for name, pieces in messages:
        total += TOKENS_PER_MESSAGE + sum(count_tokens(p) for p in pieces)
        if name:
            total += 1 + count_tokens(name)
    return total


class FillerText:
    """Deterministic filler words, one per token, drawn from `rng`."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self._emitted = 0

    def take(self, tokens: int) -> str:
        """The text of the next `tokens` tokens (every word but the first has a leading space)."""
        words = []
        for _ in range(tokens):
            word = self._rng.choice(_WORDS)
            words.append(word if self._emitted == 0 else " " + word)
            self._emitted += 1
        return "".join(words)
