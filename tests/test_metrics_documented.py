"""Every Prometheus metric the router and the sim nodes define is in the metrics reference
(docs/reference/metrics.md), and the reference names no metric the code does not define."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "reference" / "metrics.md"
#: Names the code reads from other servers' metrics but does not export.
READ_ONLY = {"vllm:gpu_cache_usage_perc"}
NAME = r"(?:tiergate_|vllm:)[a-z_:]+"


def defined_in_code() -> set[str]:
    """The names in the code, counters as their family names: prometheus_client defines a
    counter without the `_total` its samples carry, and code that reads samples names them
    with it."""
    names: set[str] = set()
    for folder in ("router", "sim_nodes", "tiergate", "operator"):
        for path in (ROOT / folder).rglob("*.py"):
            names |= set(re.findall(rf'"({NAME})"', path.read_text(encoding="utf-8")))
    return {name.removesuffix("_total") for name in names - READ_ONLY}


def documented() -> set[str]:
    names = set(re.findall(rf"^\| `({NAME})` \|", PAGE.read_text(encoding="utf-8"), re.M))
    # Counters are documented with the `_total` suffix they carry on the wire.
    return {name.removesuffix("_total") for name in names}


def test_every_metric_in_the_code_is_documented() -> None:
    missing = defined_in_code() - documented()
    assert not missing, f"add to docs/reference/metrics.md: {sorted(missing)}"


def test_every_documented_metric_is_in_the_code() -> None:
    unknown = documented() - defined_in_code()
    assert not unknown, f"documented but not defined: {sorted(unknown)}"
