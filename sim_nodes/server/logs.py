"""Structured logging: one ``key=value`` line per event, never prompt or reply text."""

from __future__ import annotations

import logging

__all__ = ["log_event", "logger"]

logger = logging.getLogger("tiergate.sim_node")


def log_event(event: str, level: int = logging.INFO, **fields: object) -> None:
    """Log `event` with `fields` as ``event=... key=value ...`` (values with spaces quoted)."""
    if not logger.isEnabledFor(level):
        return
    parts = [f"event={event}"]
    for key, value in fields.items():
        if value is None:
            continue
        text = f"{value:.6f}" if isinstance(value, float) else str(value)
        if not text or any(c.isspace() or c in '"=' for c in text):
            text = '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
        parts.append(f"{key}={text}")
    logger.log(level, " ".join(parts))
