"""A tier is defined once (sim_nodes/tiers.py): no other module of the product spells a tier's
name, not even the bench's and demo's traffic mixes, so adding a tier is its `Tier` name and
`TierDefinition` there, the regenerated CRD, chart schema and reference pages
(`make docs-reference`), and its tests."""

import ast
from pathlib import Path

from tiergate.sim_nodes.tiers import TIERS

REPO = Path(__file__).resolve().parents[1]
DEFINED_IN = REPO / "sim_nodes" / "tiers.py"


def spelled_tiers(path: Path) -> list[str]:
    """`line: text` of each string constant in `path` that is a tier's name or names one
    (`'premium'`, `premium=`, `!= 'premium'`)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
            if text in TIERS or any(f"{t}=" in text or f"'{t}'" in text for t in TIERS):
                found.append(f"{node.lineno}: {text!r}")
    return found


def test_no_module_but_the_definition_spells_a_tier_s_name() -> None:
    spelled = {}
    for folder in ("router", "operator", "sim_nodes", "tiergate"):
        for path in sorted((REPO / folder).rglob("*.py")):
            if path == DEFINED_IN:
                continue
            found = spelled_tiers(path)
            if found:
                spelled[str(path.relative_to(REPO))] = found
    assert spelled == {}, "read the tier from sim_nodes/tiers.py instead"


def test_the_scan_finds_a_tier_spelled_out() -> None:
    assert spelled_tiers(DEFINED_IN)  # the one place that spells them


def test_the_scan_finds_a_tier_in_a_traffic_mix(tmp_path: Path) -> None:
    module = tmp_path / "mix.py"
    module.write_text(f'MIX = "{TIERS[0]}=.6"\nBEST = "{TIERS[-1]}"\n', encoding="utf-8")
    assert spelled_tiers(module) == [f"1: '{TIERS[0]}=.6'", f"2: '{TIERS[-1]}'"]
