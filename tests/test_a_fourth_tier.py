"""A tier added to sim_nodes/tiers.py, and to nothing else, is accepted by the CRD, the Helm
chart's values schema and the reference docs once the generated files are regenerated
(`make docs-reference`).

The tier is added in a copy of the sources: a temporary tree with the product's packages,
tools, chart schema, CRDs and reference pages, imported as `tiergate` through a view like the
Makefile's (`make view`). Only its sim_nodes/tiers.py is edited; the generators then run in it
and the test reads what they wrote.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from crd_helpers import problems

from tiergate.sim_nodes.tiers import TIERS

REPO = Path(__file__).resolve().parents[1]
NEW = "economy"
#: What the copy holds: the packages, the generators and every file they write.
COPIED = ("sim_nodes", "router", "operator", "tiergate", "tools", "crds", "docs/reference")
CHART_SCHEMA = Path("charts/tiergate/values.schema.json")
CRD = Path("crds/inferencepools.tiergate.dev.yaml")
CHART_CRD = Path("charts/tiergate/crds/inferencepools.tiergate.dev.yaml")


def _add_the_tier(tiers_py: Path) -> None:
    """The one hand edit: the name in `Tier` and a `TierDefinition` in `DEFINITIONS`."""
    text = tiers_py.read_text(encoding="utf-8")
    names = ", ".join(f'"{t}"' for t in TIERS)
    literal = f"Tier = Literal[{names}]"
    assert literal in text, "sim_nodes/tiers.py no longer spells Tier as this test expects"
    text = text.replace(literal, f'Tier = Literal[{names}, "{NEW}"]')
    table = "DEFINITIONS: dict[Tier, TierDefinition] = {\n"
    assert table in text
    text = text.replace(
        table, f'{table}    "{NEW}": TierDefinition("{NEW}", "spare capacity, cheaply"),\n'
    )
    tiers_py.write_text(text, encoding="utf-8")


@pytest.fixture(scope="module")
def copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the sources with the fourth tier in its sim_nodes/tiers.py."""
    root = tmp_path_factory.mktemp("fourth-tier")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in COPIED:
        shutil.copytree(REPO / name, root / name, ignore=ignore)
    for path in (CHART_SCHEMA, CHART_CRD):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / path, root / path)
    _add_the_tier(root / "sim_nodes" / "tiers.py")
    view = root / "view" / "tiergate"
    view.mkdir(parents=True)
    for entry in (root / "tiergate").iterdir():
        (view / entry.name).symlink_to(entry)
    for package in ("sim_nodes", "router", "operator"):
        (view / package).symlink_to(root / package)
    return root


def run(copy: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -P ARGS` in the copy, importing `tiergate` from it."""
    env = {**os.environ, "PYTHONPATH": str(copy / "view"), "COLUMNS": "100"}
    env.pop("TIERGATE_CATALOG", None)
    return subprocess.run(
        [sys.executable, "-P", *args],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def regenerated(copy: Path) -> dict[str, subprocess.CompletedProcess[str]]:
    """The checks before regenerating (they must find every generated file stale), then
    `make docs-reference`'s three generators, run in the copy."""
    out = {
        "tiers": run(copy, "-c", "from tiergate.sim_nodes import tiers; print(tiers.__file__)"),
        "crds --check": run(copy, "-m", "tiergate", "crds", "--check"),
        "chart --check": run(copy, "tools/chart_schema.py", "--check"),
        "docs --check": run(copy, "tools/reference_docs.py", "--check"),
    }
    out["crds"] = run(copy, "-m", "tiergate", "crds")
    out["chart"] = run(copy, "tools/chart_schema.py")
    out["docs"] = run(copy, "tools/reference_docs.py")
    for step in ("crds", "chart", "docs"):
        assert out[step].returncode == 0, out[step].stderr
    return out


def test_the_copy_is_what_runs(
    copy: Path, regenerated: dict[str, subprocess.CompletedProcess[str]]
) -> None:
    assert regenerated["tiers"].stdout.strip() == str(copy / "view/tiergate/sim_nodes/tiers.py")


def test_every_generated_file_was_stale_before_regenerating(
    regenerated: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    for check in ("crds --check", "chart --check", "docs --check"):
        assert regenerated[check].returncode == 1, (check, regenerated[check].stdout)


def pool(tier: str) -> dict[str, Any]:
    return {
        "apiVersion": "tiergate.dev/v1alpha1",
        "kind": "InferencePool",
        "metadata": {"name": "spare"},
        "spec": {"tier": tier, "model": "llama-3.1-8b", "accelerator": "h100-sxm"},
    }


@pytest.mark.usefixtures("regenerated")
def test_the_crd_accepts_the_new_tier(copy: Path) -> None:
    crd = yaml.safe_load((copy / CRD).read_text(encoding="utf-8"))
    assert (copy / CHART_CRD).read_text() == (copy / CRD).read_text()
    assert problems(crd, pool(NEW)) == []
    assert problems(crd, pool("turbo")) != []
    original = yaml.safe_load((REPO / CRD).read_text(encoding="utf-8"))
    assert problems(original, pool(NEW)) != []  # the shipped CRD does not know it
    spec = json.dumps(pool(NEW)["spec"])
    parsed = run(
        copy,
        "-c",
        "import json, sys\n"
        "from tiergate.operator.api import InferencePoolSpec\n"
        f"print(InferencePoolSpec.model_validate(json.loads({spec!r})).tier)",
    )
    assert parsed.stdout.strip() == NEW, parsed.stderr


@pytest.mark.usefixtures("regenerated")
def test_the_chart_s_values_schema_accepts_the_new_tier_wherever_a_tier_goes(copy: Path) -> None:
    schema = json.loads((copy / CHART_SCHEMA).read_text(encoding="utf-8"))
    tenant = {
        "name": "team-a",
        "apiKeys": ["sk-a"],
        "allowedTiers": [NEW],
        "spillOver": {"to": [NEW], "notForTools": [NEW]},
    }
    values = {
        "router": {"tenants": {"inline": [tenant]}},
        "monitoring": {"rules": {"ttftP99ObjectiveSeconds": {NEW: 3}}},
        "tests": {"tier": NEW},
    }
    validator = jsonschema.Draft7Validator(schema)
    assert [e.message for e in validator.iter_errors(values)] == []
    refused = json.loads(json.dumps(values).replace(NEW, "turbo"))
    assert len(list(validator.iter_errors(refused))) == 5
    shipped = jsonschema.Draft7Validator(json.loads((REPO / CHART_SCHEMA).read_text()))
    assert len(list(shipped.iter_errors(values))) == 5


def test_the_reference_docs_list_the_new_tier(
    copy: Path, regenerated: dict[str, subprocess.CompletedProcess[str]]
) -> None:
    page = (copy / "docs/reference/inference-pool.md").read_text(encoding="utf-8")
    row = next(line for line in page.splitlines() if line.startswith("| `spec.tier` |"))
    assert f"`{NEW}`" in row
    assert all(f"`{t}`" in row for t in TIERS)
    assert "inference-pool.md" in regenerated["docs"].stdout
    assert run(copy, "tools/reference_docs.py", "--check").returncode == 0


def test_nothing_but_the_tier_definition_and_generated_files_differs(copy: Path) -> None:
    generated = {
        CRD,
        CHART_CRD,
        CHART_SCHEMA,
        *(p.relative_to(copy) for p in (copy / "docs/reference").glob("*.md")),
    }
    edited = []
    for path in sorted(copy.rglob("*")):
        relative = path.relative_to(copy)
        if relative.parts[0] == "view" or "__pycache__" in relative.parts or path.is_dir():
            continue
        if relative in generated:
            continue
        if path.read_bytes() != (REPO / relative).read_bytes():
            edited.append(str(relative))
    assert edited == ["sim_nodes/tiers.py"]
